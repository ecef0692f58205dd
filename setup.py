"""sglang-marconi: Marconi prefix caching for hybrid (attention + SSM) LLMs in SGLang."""
from setuptools import find_packages, setup

setup(
    name="sglang-marconi",
    version="0.1.0",
    description="Marconi (MLSys 2025) prefix caching for hybrid LLMs as an SGLang cache policy",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["sglang_marconi", "sglang_marconi.*"]),
    include_package_data=True,
    package_data={"sglang_marconi": ["data/*"]},
    # The pinned CPU stack lives in requirements/*.txt (installed by `make`); these are the
    # minimal imports of the framework-free parts (cost model, policy, simulator).
    install_requires=["numpy", "tqdm", "transformers==5.19.0"],
    extras_require={
        "sglang": ["sglang==0.5.23"],
        "gpu": ["sglang==0.5.23", "flashinfer-python"],
        "plots": ["matplotlib"],
        "analysis": ["scipy"],  # scripts/kv_pool_bound.py's linear programme
    },
    entry_points={
        "console_scripts": ["sglang-marconi=sglang_marconi.cli:main"],
        "sglang.srt.plugins": ["marconi=sglang_marconi.sglang_integration.plugin:register"],
    },
    classifiers=["License :: OSI Approved :: Apache Software License"],
)
