"""patches/: the native --cache-policy patch applies cleanly to the sglang 0.5.23 sources
(the installed, unpacked wheel), and the factory it routes to builds the Marconi cache."""
import os
import re
import shutil
import subprocess
import types

import pytest

sglang = pytest.importorskip("sglang")

from sglang_marconi.sglang_integration.options import ENV_SETTINGS, flag_fields  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATCH = os.path.join(REPO, "patches", "sglang-0.5.23-cache-policy.patch")
WHEEL_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__)))


def _touched_files(patch_text):
    return sorted(set(re.findall(r"^\+\+\+ b/python/(\S+)$", patch_text, re.M)))


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_patch_applies_to_the_unpacked_wheel(tmp_path):
    with open(PATCH, encoding="utf-8") as fh:
        files = _touched_files(fh.read())
    assert files == ["sglang/srt/arg_groups/fields/memory.py", "sglang/srt/mem_cache/registry.py"]
    for rel in files:  # a copy outside any git work tree: git apply works on plain files
        dst = tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(WHEEL_ROOT, rel), dst)
    check = subprocess.run(["git", "apply", "--check", "-p2", PATCH], cwd=tmp_path,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    subprocess.run(["git", "apply", "-p2", PATCH], cwd=tmp_path, check=True)
    memory = (tmp_path / files[0]).read_text()
    patched = dict(re.findall(r"^    (marconi_\w+|cache_policy): A\[.*?^    \] = (\S+)$", memory,
                              re.M | re.S))
    plugin = {f"marconi_{f.name}": repr(f.default) for f in flag_fields()}
    # the patch declares exactly the plugin's flags, with the plugin's defaults
    assert patched.pop("cache_policy") == '"lru"'
    assert {k: v.replace('"', "'") for k, v in patched.items()} == plugin
    assert "native_cache_factory" in (tmp_path / files[1]).read_text()


def _ctx(params):
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext
    from transformers import Qwen3NextConfig

    config = Qwen3NextConfig()
    return TreeCacheBuildContext(
        server_args=None, params=params, is_hybrid_swa=False, is_hybrid_ssm=True,
        enable_hierarchical_cache=False, disable_radix_cache=False, tp_worker=None,
        model_config=types.SimpleNamespace(hf_config=config, hf_text_config=config),
        tp_size=1, tp_rank=0, tp_group=None)


def test_factories_build_the_marconi_cache(monkeypatch):
    from sglang_marconi.sglang_integration.backend import (
        marconi_cache_factory,
        native_cache_factory,
    )
    from sglang_marconi.sglang_integration.cache import MarconiUnifiedRadixCache
    from sglang_marconi.driver.pools import PoolConfig, build_pools

    pc = PoolConfig(kv_tokens=2048, mamba_slots=8, page_size=16, max_context_len=1024)
    monkeypatch.setenv(ENV_SETTINGS, '{"alpha": 0.4}')
    cache = marconi_cache_factory(_ctx(build_pools(pc)[0]))  # the plugin's path
    assert isinstance(cache, MarconiUnifiedRadixCache)
    assert cache.marconi.alpha == 0.4 and cache.marconi.spec.name == "qwen3_next"
    assert cache.marconi.ranking.name == "alpha"  # the paper's ranking
    memory = types.SimpleNamespace(cache_policy="marconi", marconi_alpha=None,
                                   marconi_max_states_per_request=2,
                                   marconi_host_rule="lru")
    cache = native_cache_factory(_ctx(build_pools(pc)[0]), memory)  # the patch's path
    assert cache.marconi.settings.plus and cache.marconi.ghost is not None
    assert cache.marconi.max_states == 2 and cache.marconi.settings.host_rule == "lru"
    memory = types.SimpleNamespace(cache_policy="marconi+", marconi_alpha=1.5,
                                   marconi_max_states_per_request=-1,
                                   marconi_host_rule="ranked")
    cache = native_cache_factory(_ctx(build_pools(pc)[0]), memory)
    assert cache.marconi.alpha == 1.5 and cache.marconi.ranking.name == "alpha"
