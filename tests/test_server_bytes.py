"""The cost model's bytes are what SGLang 0.5.23's pools hold, per rank, in its dtypes.

Each config is loaded the way the server loads it (``ModelConfig``: SGLang's own config
class) and SGLang derives the state it allocates per slot (``mamba2_cache_params``
``.mamba_cache_per_req``, what ``MambaPool`` and the pool sizing use) and the KV bytes per
token (``pool_configurator``'s cell: KV heads per rank x (head_dim + v_head_dim), or the MLA
latent, x full-attention layers x element size), under tensor parallelism and every dtype
rule (``--mamba-ssm-dtype``, ``SGLANG_MAMBA_SSM_DTYPE``, the config's ``mamba_ssm_dtype``,
``SGLANG_MAMBA_CONV_DTYPE``, ``--kv-cache-dtype``).
"""
import importlib
import inspect
import json
import pkgutil
import shutil
from pathlib import Path

import pytest

pytest.importorskip("sglang")

import torch  # noqa: E402
from sglang.srt.configs.hybrid_arch import mambaish_config  # noqa: E402
from sglang.srt.configs.model_config import ModelConfig  # noqa: E402
from sglang.srt.environ import envs  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402

from sglang_marconi.errors import UserError  # noqa: E402
from sglang_marconi.model import preset_spec, spec_from_config_path  # noqa: E402
from sglang_marconi.model.configs import (BUILDERS, MULTIMODAL_WRAPPERS,  # noqa: E402
                                          SGLANG_REFUSED)

CONFIGS = Path(__file__).resolve().parent / "data" / "configs"
# config file -> the preset of the same architecture, if any
FILES = {
    "qwen3_next_80b_a3b_instruct": "qwen3_next",
    "qwen3_5_27b": "qwen3_5",
    "qwen3_5_35b_a3b": "qwen3_5_moe",
    "nemotron_h_8b_base_8k": "nemotron_h",
    "falcon_h1_0.5b_instruct": "falcon_h1",
    "granite_4.0_h_small": "granitemoehybrid",
    "kimi_linear_like": "kimi_linear",
    "lfm2_1.2b_like": "lfm2",
    "lfm2_moe_like": None,
}  # pure Mamba / Mamba2 have no KV: no prefix cache to rank (SGLang's Mamba2Config also
# fails on Codestral's config: no ``intermediate_size``)
KV_BYTES = {"fp8_e4m3": 1}


@pytest.fixture(scope="module", autouse=True)
def published_args():
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy"))


def _folder(tmp_path, name):
    shutil.copy(CONFIGS / f"{name}.json", tmp_path / "config.json")
    return tmp_path


def _sglang_bytes(model_config, tp, kv_cache_dtype="auto"):
    """(state bytes per slot, KV bytes per token) as SGLang derives them on one rank."""
    from sglang.srt.mem_cache.kv_cache_configurator import calculate_mla_kv_cache_dim

    hf = mambaish_config(model_config)  # the config the server's pools are sized from
    with get_parallel().override(tp_size=tp, attn_tp_size=tp, moe_tp_size=tp):
        state = hf.mamba2_cache_params.mamba_cache_per_req
        layers = hf.full_attention_layer_ids
        size = (model_config.dtype.itemsize if kv_cache_dtype == "auto"
                else KV_BYTES[kv_cache_dtype])
        if not layers:
            kv = 0
        elif model_config.attention_arch.name == "MLA":
            kv = calculate_mla_kv_cache_dim(model_config=model_config,
                                            kv_cache_dtype=torch.bfloat16) * len(layers) * size
        else:
            kv = (model_config.get_num_kv_heads(tp)
                  * (model_config.head_dim + model_config.v_head_dim) * len(layers) * size)
    return state, kv


def _tps(model_config):
    """The TP sizes a server of this model could run (heads split evenly)."""
    out = []
    for tp in (1, 2, 4, 8):
        try:
            with get_parallel().override(tp_size=tp, attn_tp_size=tp, moe_tp_size=tp):
                mambaish_config(model_config).mamba2_cache_params.mamba_cache_per_req
        except AssertionError:
            continue
        out.append(tp)
    return out


@pytest.mark.parametrize("name", sorted(FILES))
def test_bytes_equal_sglang_per_rank(name, tmp_path):
    folder = _folder(tmp_path, name)
    model_config = ModelConfig(str(folder), trust_remote_code=False)
    assert type(model_config.hf_config).__module__.startswith("sglang.srt.configs.")
    tps = _tps(model_config)
    assert 1 in tps and len(tps) >= 2, tps
    for tp in tps:
        state, kv = _sglang_bytes(model_config, tp)
        spec = spec_from_config_path(folder, tp_size=tp)
        assert (spec.ssm_state_bytes, spec.kv_bytes_per_token) == (state, kv), tp
        if kv:
            fp8 = spec_from_config_path(folder, tp_size=tp, kv_cache_dtype="fp8_e4m3")
            assert fp8.kv_bytes_per_token == _sglang_bytes(model_config, tp, "fp8_e4m3")[1]
    if FILES[name]:  # the preset of that architecture is built by the same rules
        assert preset_spec(FILES[name]).cache_dtypes == spec.cache_dtypes


@pytest.mark.parametrize("name", ["qwen3_next_80b_a3b_instruct", "nemotron_h_8b_base_8k",
                                  "granite_4.0_h_small", "kimi_linear_like", "lfm2_1.2b_like"])
def test_state_dtype_rules_equal_sglang(name, tmp_path, monkeypatch):
    folder = _folder(tmp_path, name)
    # SGLANG_MAMBA_SSM_DTYPE (what --mamba-ssm-dtype sets) and SGLANG_MAMBA_CONV_DTYPE
    for ssm, conv in (("bfloat16", None), ("float16", "float32"), (None, "float16")):
        for var, value in (("SGLANG_MAMBA_SSM_DTYPE", ssm), ("SGLANG_MAMBA_CONV_DTYPE", conv)):
            if value is None:
                monkeypatch.delenv(var, raising=False)
            else:
                monkeypatch.setenv(var, value)
        model_config = ModelConfig(str(folder), trust_remote_code=False)
        assert spec_from_config_path(folder).ssm_state_bytes == _sglang_bytes(model_config, 1)[0]
        if ssm:  # the flag (SGLang sets the variable from it) gives what the variable gives
            expected = _sglang_bytes(model_config, 1)[0]
            monkeypatch.delenv("SGLANG_MAMBA_SSM_DTYPE")
            assert spec_from_config_path(folder, mamba_ssm_dtype=ssm).ssm_state_bytes == expected
            monkeypatch.setenv("SGLANG_MAMBA_SSM_DTYPE", ssm)
    monkeypatch.delenv("SGLANG_MAMBA_SSM_DTYPE", raising=False)
    monkeypatch.delenv("SGLANG_MAMBA_CONV_DTYPE", raising=False)
    # the config's mamba_ssm_dtype: read by the classes that pass their config, not others
    data = json.loads((CONFIGS / f"{name}.json").read_text())
    data["mamba_ssm_dtype"] = "bfloat16"
    folder = tmp_path / "with_dtype"  # a new path: SGLang's config loader caches by path
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(data))
    model_config = ModelConfig(str(folder), trust_remote_code=False)
    assert spec_from_config_path(folder).ssm_state_bytes == _sglang_bytes(model_config, 1)[0]


def test_qwen3_next_state_is_the_servers_77_mb(tmp_path):
    """36 GDN layers x (32 x 128 x 128 float32 + 8192 x 3 bfloat16)."""
    spec = spec_from_config_path(_folder(tmp_path, "qwen3_next_80b_a3b_instruct"))
    assert spec.ssm_state_bytes == 36 * (32 * 128 * 128 * 4 + 8192 * 3 * 2) == 77_266_944
    assert preset_spec("qwen3_next").ssm_state_bytes == 77_266_944
    assert preset_spec("qwen3_next", mamba_ssm_dtype="bfloat16").ssm_state_bytes == \
        36 * (32 * 128 * 128 * 2 + 8192 * 3 * 2)
    # TP 4: value heads split (8 per rank), 2 KV heads replicated (one per rank)
    tp4 = preset_spec("qwen3_next", tp_size=4)
    assert tp4.ssm_state_bytes == 77_266_944 // 4
    assert tp4.kv_bytes_per_token == 12 * 2 * 1 * 256 * 2
    with pytest.raises(UserError, match="--tp-size 3 does not divide"):
        preset_spec("qwen3_next", tp_size=3)
    with pytest.raises(UserError, match="--mamba-ssm-dtype: expected one of"):
        preset_spec("qwen3_next", mamba_ssm_dtype="int8")
    with pytest.raises(UserError, match="--kv-cache-dtype: expected one of"):
        preset_spec("qwen3_next", kv_cache_dtype="fp7")


def _sglang_hybrid_model_types():
    """model_type of every SGLang config class that defines ``mamba2_cache_params``."""
    import sglang.srt.configs as pkg

    found = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        try:
            module = importlib.import_module(f"{pkg.__name__}.{info.name}")
        except Exception:  # noqa: BLE001 - a module needing a GPU-only package
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and "mamba2_cache_params" in vars(cls):
                found[getattr(cls, "model_type", None) or cls.__name__] = cls.__name__
    return found


def test_every_sglang_hybrid_class_is_covered_or_refused():
    found = _sglang_hybrid_model_types()
    assert len(found) >= 18, found
    known = set(BUILDERS) | MULTIMODAL_WRAPPERS | set(SGLANG_REFUSED)
    assert set(found) <= known, sorted(set(found) - known)
    assert set(SGLANG_REFUSED) <= set(found)  # no refusal outlives its SGLang class


def test_refused_architecture_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "jet_nemotron"}))
    with pytest.raises(UserError, match="Jet-Nemotron .* has no sglang-marconi cost model"):
        from sglang_marconi.model import spec_from_hf_config
        spec_from_hf_config(type("C", (), {"model_type": "jet_nemotron"})())


@pytest.mark.parametrize("name", ["qwen3_next_80b_a3b_instruct", "nemotron_h_8b_base_8k",
                                  "lfm2_1.2b_like"])
def test_plugin_reads_the_bytes_of_sglangs_built_mamba_pool(name, tmp_path):
    """``pool_bytes`` on a ``MambaPool`` SGLang allocates from the model's cache params
    (one slot) gives the cost model's state bytes; on the replay's tiny test-kit pools it
    gives theirs, which is why only a server's cache reads it."""
    from sglang.srt.mem_cache.memory_pool import MambaPool

    from sglang_marconi.driver.pools import PoolConfig, build_pools
    from sglang_marconi.sglang_integration import pool_bytes

    folder = _folder(tmp_path, name)
    hf = mambaish_config(ModelConfig(str(folder), trust_remote_code=False))
    with get_parallel().override(tp_size=1, attn_tp_size=1, moe_tp_size=1):
        params = hf.mamba2_cache_params
    pool = MambaPool(size=1, spec_state_size=0, cache_params=params,
                     mamba_layer_ids=params.layers, device="cpu")
    assert pool_bytes.state_bytes_per_slot(pool) == spec_from_config_path(folder).ssm_state_bytes
    kit, _, _ = build_pools(PoolConfig(kv_tokens=4096, mamba_slots=8))
    assert pool_bytes.state_bytes_per_slot(kit.req_to_token_pool.mamba_pool) == 448
    assert pool_bytes.kv_bytes_per_token(kit.token_to_kv_pool_allocator.get_kvcache()) == 4


@pytest.mark.parametrize("name,preset", [("nemotron_h_8b_base_8k", "nemotron_h"),
                                         ("qwen3_next_80b_a3b_instruct", "qwen3_next")])
def test_presets_are_the_published_models(name, preset, tmp_path):
    """The nemotron_h preset is Nemotron-H-8B (transformers' class defaults to 4 layers), the
    qwen3_next preset Qwen3-Next-80B-A3B: layer for layer, bytes and FLOPs."""
    spec = spec_from_config_path(_folder(tmp_path, name))
    assert preset_spec(preset).layers == spec.layers


def test_a_float32_config_is_served_in_float16(tmp_path):
    """SGLang's ``--dtype auto`` serves a float32 checkpoint in float16 (the live tests'
    tiny models are float32): the KV pool holds 2-byte elements, and so does the spec."""
    data = json.loads((CONFIGS / "qwen3_next_80b_a3b_instruct.json").read_text())
    data["torch_dtype"] = "float32"
    (tmp_path / "config.json").write_text(json.dumps(data))
    model_config = ModelConfig(str(tmp_path), trust_remote_code=False)
    assert model_config.dtype == torch.float16
    spec = spec_from_config_path(tmp_path)
    assert (spec.dtype, spec.kv_bytes_per_token) == ("float16", _sglang_bytes(model_config, 1)[1])
    from sglang_marconi.sglang_integration.backend import model_spec

    assert model_spec(model_config).kv_bytes_per_token == spec.kv_bytes_per_token


@pytest.mark.parametrize("name", sorted(FILES))
def test_int8_checkpoint_bytes_equal_sglangs_pool(name, tmp_path):
    """A cached state under ``--enable-int8-mamba-checkpoint`` weighs what SGLang's
    ``MambaCheckpointPool`` allocates per slot (its own estimate, built the way
    ``maybe_init_int8_mamba_checkpoint_pool`` builds it), per rank."""
    from sglang.srt.mem_cache.mamba_checkpoint_pool import MambaCheckpointPool

    folder = _folder(tmp_path, name)
    model_config = ModelConfig(str(folder), trust_remote_code=False)
    slots = 7
    for tp in _tps(model_config):
        with get_parallel().override(tp_size=tp, attn_tp_size=tp, moe_tp_size=tp):
            params = mambaish_config(model_config).mamba2_cache_params
        heads, d_v, d_k = params.shape.temporal
        est = MambaCheckpointPool.estimate_mem_usage_bytes(
            num_layers=len(params.layers), num_slots=slots, num_heads=heads, head_v_dim=d_v,
            head_k_dim=d_k, conv_shapes=list(params.shape.conv), conv_dtype=params.dtype.conv,
            temporal_dtype=params.dtype.temporal)
        spec = spec_from_config_path(folder, tp_size=tp)
        assert spec.int8_checkpoint_bytes * (slots + 1) == est["total"], tp
        assert spec.with_int8_checkpoints().ssm_state_bytes == spec.int8_checkpoint_bytes
        assert spec.with_int8_checkpoints().full_state_bytes == spec.ssm_state_bytes


def test_qwen3_next_int8_checkpoint_is_about_a_quarter_of_the_state():
    """36 GDN layers x (32 x 128 x 128 int8 + 32 x 128 float32 scales + 8192 x 3 bf16)."""
    spec = preset_spec("qwen3_next")
    assert spec.int8_checkpoint_bytes == 36 * (32 * 128 * 128 + 32 * 128 * 4 + 8192 * 3 * 2)
    assert spec.int8_checkpoint_bytes == 21_233_664
    assert 0.27 < spec.int8_checkpoint_bytes / spec.ssm_state_bytes < 0.28


def test_plugin_reads_the_bytes_of_sglangs_built_checkpoint_pool(tmp_path):
    """``pool_bytes.checkpoint_bytes_per_slot`` on a ``MambaCheckpointPool`` SGLang builds
    for the model (two slots and the reserved one) gives the cost model's int8 bytes."""
    from sglang.srt.mem_cache.mamba_checkpoint_pool import MambaCheckpointPool

    from sglang_marconi.sglang_integration import pool_bytes

    folder = _folder(tmp_path, "nemotron_h_8b_base_8k")
    hf = mambaish_config(ModelConfig(str(folder), trust_remote_code=False))
    with get_parallel().override(tp_size=1, attn_tp_size=1, moe_tp_size=1):
        params = hf.mamba2_cache_params
    heads, d_v, d_k = params.shape.temporal
    pool = MambaCheckpointPool(num_layers=len(params.layers), num_slots=2, num_heads=heads,
                               head_v_dim=d_v, head_k_dim=d_k,
                               conv_shapes=list(params.shape.conv),
                               conv_dtype=params.dtype.conv, device="cpu",
                               temporal_dtype=params.dtype.temporal)
    assert (pool_bytes.checkpoint_bytes_per_slot(pool)
            == spec_from_config_path(folder).int8_checkpoint_bytes)
    assert pool_bytes.checkpoint_bytes_per_slot(None) is None
