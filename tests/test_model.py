"""The cost model: the paper's numbers exactly, real configs, GQA, MoE, FLOPs, errors."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from sglang_marconi.errors import UserError
from sglang_marconi.model import (PRESETS, HybridModelSpec, preset_spec, spec_from_config_path,
                                  spec_from_hf_config)
from sglang_marconi.model.layers import AttentionLayer, MLPLayer
from sglang_marconi.model.spec import HybridModelSpec as Spec


def sequence_bytes(spec, tokens: int, checkpoint_every: int = 0) -> int:
    """KV of ``tokens`` tokens plus one SSM checkpoint every ``checkpoint_every`` tokens
    (the vLLM-style every-block policy the paper contrasts with)."""
    states = tokens // checkpoint_every if checkpoint_every else 0
    return tokens * spec.kv_bytes_per_token + states * spec.ssm_state_bytes


def test_paper_7b_numbers_exact(paper_spec):
    s = paper_spec
    assert (s.num_attention_layers, s.num_ssm_layers, len(s.mlp_layers)) == (4, 24, 28)
    assert s.ssm_layers[0].state_bytes == 1_116_160
    assert s.ssm_state_bytes == 26_787_840
    assert s.kv_bytes_per_token == 65_536
    # 10K tokens checkpointed every 16 tokens: 17.4 GB; a 32-layer Transformer: 5.24 GB
    assert round(sequence_bytes(s, 10_000, 16) / 1e9, 1) == 17.4
    attn = s.attention_layers[0]
    transformer = Spec("t32", (attn,) * 32)
    assert round(sequence_bytes(transformer, 10_000) / 1e9, 2) == 5.24
    # the paper's FLOP formulas, layer by layer
    D, N, L = 4096, 128, 1000
    assert attn.prefill_flops(L) == 8 * L * D**2 + 4 * L**2 * D
    assert s.mlp_layers[0].prefill_flops(L) == 16 * L * D**2
    assert s.ssm_layers[0].prefill_flops(L) == 12 * L * D**2 + 16 * L * D * N + 10 * L * D


def test_mamba2_state_hand_computed():
    # NemotronH default: 128 heads x 64 head dim = 8192 inner, d_state 128, 8 groups, conv 4;
    # temporal state in mamba_ssm_cache_dtype float32, conv state in bf16 (window conv-1 = 3)
    cfg = transformers.NemotronHConfig()
    spec = spec_from_hf_config(cfg)
    d_inner, n, groups = 128 * 64, 128, 8
    temporal = d_inner * n * 4
    conv = (d_inner + 2 * groups * n) * 3 * 2
    assert spec.num_ssm_layers == 1  # the default pattern: mamba, moe, attention, mlp
    assert spec.ssm_layers[0].state_bytes == temporal + conv == 4_194_304 + 61_440


def test_gdn_state_hand_computed():
    cfg = transformers.Qwen3NextConfig(num_hidden_layers=4, layer_types=[
        "linear_attention", "linear_attention", "linear_attention", "full_attention"])
    spec = spec_from_hf_config(cfg, dtype="bfloat16")
    assert (spec.num_ssm_layers, spec.num_attention_layers) == (3, 1)
    # 32 value heads x 128 x 128 state in float32 (SGLang's default temporal dtype); conv
    # over q,k,v = 2*16*128 + 32*128 channels, window 3, bfloat16
    per_layer = 32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3 * 2
    assert spec.ssm_state_bytes == 3 * per_layer
    # GQA: 2 KV heads x 256 head dim, K and V, bf16
    assert spec.kv_bytes_per_token == 2 * 2 * 256 * 2


def test_gqa_divides_kv_bytes_by_group_factor():
    mha = transformers.FalconH1Config(num_attention_heads=8, num_key_value_heads=8)
    gqa = transformers.FalconH1Config(num_attention_heads=8, num_key_value_heads=2)
    a = spec_from_hf_config(mha).kv_bytes_per_token
    b = spec_from_hf_config(gqa).kv_bytes_per_token
    assert a == 4 * b > 0


def test_flops_saved_is_difference_and_grows(paper_spec):
    s = paper_spec
    for T, P in [(100, 0), (5000, 1000), (20000, 19999)]:
        assert s.flops_saved(T, P) == pytest.approx(s.prefill_flops(T) - s.prefill_flops(P))
    saved = [s.flops_saved(T, 500) for T in (600, 1000, 5000, 20000, 100000)]
    assert all(a < b for a, b in zip(saved, saved[1:]))
    # the quadratic term: saving the same 1000 tokens late is worth more than early
    assert s.flops_saved(21000, 20000) > s.flops_saved(2000, 1000)


def test_moe_counts_only_active_experts():
    dense = MLPLayer(1024, expert_size=512, active_experts=2, num_experts=8)
    more_experts = MLPLayer(1024, expert_size=512, active_experts=2, num_experts=64)
    more_active = MLPLayer(1024, expert_size=512, active_experts=4, num_experts=8)
    router = 2 * 1024
    assert dense.flops_per_token() == 2 * 3 * 1024 * 512 * 2 + router * 8
    # more experts in total only grow the router; more active experts double the expert part
    assert more_experts.flops_per_token() - dense.flops_per_token() == router * 56
    assert more_active.flops_per_token() - dense.flops_per_token() == 2 * 3 * 1024 * 512 * 2


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_builds(name):
    spec = preset_spec(name)
    assert spec.num_ssm_layers > 0 and spec.ssm_state_bytes > 0
    assert spec.prefill_flops(1024) > spec.prefill_flops(512) > 0


def test_config_path_and_errors(tmp_path):
    cfg = transformers.Qwen3NextConfig(num_hidden_layers=8)
    cfg.save_pretrained(tmp_path)
    spec = spec_from_config_path(tmp_path)
    assert (spec.num_attention_layers, spec.num_ssm_layers) == (2, 6)
    assert spec.ssm_layers[0].kind == "gdn"

    bad = tmp_path / "bad.json"
    bad.write_text('{"model_type": "qwen3_next",\n "hidden_size": }')
    with pytest.raises(UserError, match=r"bad.json:2: invalid JSON"):
        spec_from_config_path(bad)
    bad.write_text('{"hidden_size": 8}')
    with pytest.raises(UserError, match="no 'model_type' field"):
        spec_from_config_path(bad)
    bad.write_text('{"model_type": "llama"}')
    with pytest.raises(UserError, match=r"'llama' \(field model_type\) is not a hybrid"):
        spec_from_config_path(bad)
    bad.write_text('{"model_type": "no_such_arch"}')
    with pytest.raises(UserError, match="not known to transformers"):
        spec_from_config_path(bad)
    with pytest.raises(UserError, match="config not found"):
        spec_from_config_path(tmp_path / "missing.json")
    with pytest.raises(UserError, match="unknown model preset"):
        preset_spec("gpt-5")
    with pytest.raises(UserError, match="unknown dtype"):
        preset_spec("paper-7b", dtype="float13")
    with pytest.raises(UserError, match="field 'n_groups'"):
        spec_from_hf_config(transformers.NemotronHConfig(n_groups=0))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "sglang_marconi", *args],
                          capture_output=True, text=True)


def test_model_info_cli(tmp_path):
    r = _cli("model-info", "--preset", "paper-7b", "--tokens", "2048", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    for key in ("name", "num_attention_layers", "num_ssm_layers", "kv_bytes_per_token",
                "ssm_state_bytes", "prefill_flops"):
        assert key in info
    assert info["ssm_state_bytes"] == 26_787_840
    spec = preset_spec("paper-7b")
    assert info["prefill_flops"] == spec.prefill_flops(2048)
    r = _cli("model-info", "--list")
    assert r.returncode == 0 and "paper-7b" in r.stdout.split()
    # errors: one line, exit 2
    (tmp_path / "c.json").write_text('{"model_type": "llama"}')
    for args in (("--preset", "nope"), ("--config", str(tmp_path / "c.json")), ()):
        r = _cli("model-info", *args)
        assert r.returncode == 2
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr


def test_model_info_cli_reads_published_configs():
    """model-info --config on a published config.json (Qwen3.5-35B-A3B: a multimodal wrapper
    whose language model is in text_config)."""
    path = Path(__file__).resolve().parent / "data" / "configs" / "qwen3_5_35b_a3b.json"
    r = _cli("model-info", "--config", str(path), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert (info["num_attention_layers"], info["num_ssm_layers"]) == (10, 30)
    spec = spec_from_config_path(path)
    assert (info["ssm_state_bytes"], info["kv_bytes_per_token"]) == (spec.ssm_state_bytes,
                                                                     spec.kv_bytes_per_token)


def test_cost_models_implement_the_protocol():
    from sglang_marconi.model.cost import CostModel
    from sglang_marconi.policy.ghost import UnitCost

    for model in (preset_spec("paper-7b"), UnitCost()):
        assert isinstance(model, CostModel), model

    class NoFlops:
        name, kv_bytes_per_token, ssm_state_bytes = "x", 1, 1

    assert not isinstance(NoFlops(), CostModel)
