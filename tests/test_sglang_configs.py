"""SGLang's own config classes give the same cost model as transformers' classes.

Inside SGLang's server ``model_config.hf_config`` is the class SGLang registers for the
architecture (``sglang/srt/configs/``), not transformers': SGLang's Qwen3NextConfig, for
one, drops ``layer_types`` and derives ``layers_block_type``. Each published config.json in
``tests/data/configs`` is loaded both ways (transformers' loader, and SGLang's ``ModelConfig``
as the server builds it) and the two ``HybridModelSpec``s must be identical.
"""
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from sglang.srt.configs.model_config import ModelConfig  # noqa: E402
from sglang.srt.configs.qwen3_next import Qwen3NextConfig  # noqa: E402
from sglang.srt.utils.hf_transformers.common import _CONFIG_REGISTRY  # noqa: E402
from sglang.srt.utils.hf_transformers.config import get_config  # noqa: E402

from sglang_marconi.model import spec_from_config_path, spec_from_hf_config  # noqa: E402
from sglang_marconi.model.configs import (BUILDERS, MULTIMODAL_WRAPPERS,  # noqa: E402
                                          load_hf_config)
from sglang_marconi.sglang_integration.backend import model_spec  # noqa: E402

CONFIGS = Path(__file__).resolve().parent / "data" / "configs"
LENGTHS = (1, 1000, 32_768)

# config file (a published model's config.json) -> SGLang's class for it, and the
# (attention, SSM) layer counts the file's layer pattern gives
CASES = {
    "qwen3_next_80b_a3b_instruct": ("Qwen3NextConfig", 12, 36),  # Qwen/Qwen3-Next-80B-A3B-Instruct
    "qwen3_5_27b": ("Qwen3_5Config", 16, 48),  # Qwen/Qwen3.5-27B (dense)
    "qwen3_5_35b_a3b": ("Qwen3_5MoeConfig", 10, 30),  # Qwen/Qwen3.5-35B-A3B
    "nemotron_h_8b_base_8k": ("NemotronHConfig", 4, 24),  # nvidia/Nemotron-H-8B-Base-8K
    "falcon_h1_0.5b_instruct": ("FalconH1Config", 36, 36),  # tiiuae/Falcon-H1-0.5B-Instruct
    "granite_4.0_h_small": ("GraniteMoeHybridConfig", 4, 36),  # ibm-granite/granite-4.0-h-small
    "mamba2_codestral_7b": ("Mamba2Config", 0, 64),  # mistralai/Mamba-Codestral-7B-v0.1
    "mamba_2.8b_hf": ("MambaConfig", 0, 64),  # state-spaces/mamba-2.8b-hf
}


@pytest.fixture(params=sorted(CASES))
def loaded(request, tmp_path):
    """(case, folder, transformers' config, SGLang's ModelConfig) of one config.json."""
    shutil.copy(CONFIGS / f"{request.param}.json", tmp_path / "config.json")
    return (request.param, tmp_path, load_hf_config(tmp_path),
            ModelConfig(str(tmp_path), trust_remote_code=False))


def _same_cost(a, b):
    assert a.layers == b.layers
    assert a.ssm_state_bytes == b.ssm_state_bytes
    assert a.kv_bytes_per_token == b.kv_bytes_per_token
    for n in LENGTHS:
        assert a.prefill_flops(n) == b.prefill_flops(n)


def test_sglang_config_classes_give_transformers_spec(loaded):
    case, folder, hf_cfg, model_config = loaded
    cls_name, attention, ssm = CASES[case]
    # the two loaders really give the two libraries' classes (no silent fallback)
    assert type(model_config.hf_config).__name__ == cls_name
    assert type(model_config.hf_config).__module__.startswith("sglang.srt.configs.")
    assert type(hf_cfg).__module__.startswith("transformers.")

    expected = spec_from_hf_config(hf_cfg)
    assert (expected.num_attention_layers, expected.num_ssm_layers) == (attention, ssm)
    got = spec_from_hf_config(model_config.hf_config)
    assert got == expected
    _same_cost(got, expected)
    # the server's path: the text config (the wrapper's for Qwen3.5), as backend reads it
    _same_cost(spec_from_hf_config(model_config.hf_text_config), expected)
    _same_cost(model_spec(model_config), expected)
    # the CLI's path (model-info --config) is transformers' loader
    assert spec_from_config_path(folder) == expected


def test_qwen3_next_startup_no_longer_crashes(tmp_path):
    """The crash: --cache-policy marconi on any Qwen3-Next model raised at start-up,
    'no cost model for Qwen3NextForCausalLM: qwen3_next: config field 'layer_types' must
    list the layer types, got None' (SGLang's Qwen3NextConfig has layers_block_type)."""
    shutil.copy(CONFIGS / "qwen3_next_80b_a3b_instruct.json", tmp_path / "config.json")
    cfg = get_config(str(tmp_path), trust_remote_code=False)
    assert type(cfg) is Qwen3NextConfig and getattr(cfg, "layer_types", None) is None

    class Served:  # what the cache factory hands model_spec: ModelConfig's two fields
        hf_config = hf_text_config = cfg

    spec = model_spec(Served)
    assert (spec.num_attention_layers, spec.num_ssm_layers) == (12, 36)
    assert spec == spec_from_config_path(tmp_path)


def test_every_builder_with_an_sglang_class_is_covered():
    """Each architecture BUILDERS knows that SGLang registers its own config class for has
    a config.json above or in tests/test_server_bytes.py (Kimi-Linear, LFM2); Falcon-Mamba is
    pure Mamba1 (``_mamba``'s config, no KV)."""
    covered = {"kimi_linear", "falcon_mamba"}
    for case in CASES:
        data = json.loads((CONFIGS / f"{case}.json").read_text(encoding="utf-8"))
        covered |= {data["model_type"], data.get("text_config", {}).get("model_type")}
    own = (set(BUILDERS) | MULTIMODAL_WRAPPERS) & set(_CONFIG_REGISTRY)
    assert own <= covered, sorted(own - covered)


def test_nemotron_h_ssm_state_float32_from_either_class(tmp_path):
    """transformers' NemotronHConfig defaults mamba_ssm_cache_dtype to float32; SGLang's
    class has no such field, so the spec takes transformers' default for it (SGLang's class
    used to give a bf16 temporal state: half the state bytes of the transformers spec)."""
    shutil.copy(CONFIGS / "nemotron_h_8b_base_8k.json", tmp_path / "config.json")
    model_config = ModelConfig(str(tmp_path), trust_remote_code=False)
    assert getattr(model_config.hf_config, "mamba_ssm_cache_dtype", None) is None
    for spec in (model_spec(model_config), spec_from_config_path(tmp_path)):
        layer = spec.ssm_layers[0]
        assert (layer.state_dtype_bytes, layer.conv_dtype_bytes) == (4, 2)
