"""Both entry points refuse the same flag combinations with the same one-line message:
the command line (``prepare_server_args``, the plugin's ``from_cli_args`` hook, a
``SystemExit("error: ...")``) and the Python API (``sglang.Engine(...)`` builds
``ServerArgs`` directly; the plugin's hook on ``ServerArgs.check_server_args``, which
``Engine._launch_subprocesses`` calls at start-up, raises ``ValueError``). A PD decode
server (radix cache turned off by SGLang) passes and the backend steps aside with one log
line. No GPU needed: ``check_server_args`` on a CPU record, the factory on a stub context."""
import logging
import types

import pytest

pytest.importorskip("sglang")

from sglang_marconi.sglang_integration.options import (  # noqa: E402
    ENV_SETTINGS,
    MarconiSettings,
    validate_server_args,
)

CONFLICTS = [  # (Python API kwargs, the same as flags)
    (dict(enable_session_radix_cache=True), ("--enable-session-radix-cache",)),
    (dict(radix_eviction_policy="lfu"), ("--radix-eviction-policy", "lfu")),
    (dict(enable_hierarchical_cache=True, enable_unified_memory=True),
     ("--enable-hierarchical-cache", "--enable-unified-memory")),
    (dict(disable_radix_cache=True), ("--disable-radix-cache",)),
    (dict(speculative_algorithm="EAGLE"), ("--speculative-algorithm", "EAGLE")),
]


@pytest.fixture(scope="module")
def sglang_args():
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    load_plugins()
    return ServerArgs, prepare_server_args


def _api_error(ServerArgs, **kwargs) -> str:
    args = ServerArgs(model_path="dummy", device="cpu", radix_cache_backend="marconi",
                      **kwargs)
    args.resolve_once()
    with pytest.raises(ValueError) as err:
        args.check_server_args()  # what Engine(...) runs at start-up
    return str(err.value)


@pytest.mark.parametrize("kwargs,flags", CONFLICTS, ids=[f[0] for _, f in CONFLICTS])
def test_python_api_refuses_what_the_command_line_refuses(sglang_args, kwargs, flags):
    ServerArgs, prepare_server_args = sglang_args
    with pytest.raises(SystemExit) as cli:
        prepare_server_args(["--model-path", "dummy", "--cache-policy", "marconi", *flags])
    api = _api_error(ServerArgs, **kwargs)
    assert str(cli.value) == f"error: {api}"
    assert "\n" not in api and flags[0] in api


def test_python_api_checks_the_settings_the_backend_reads(sglang_args, monkeypatch):
    ServerArgs, _ = sglang_args
    monkeypatch.setenv(ENV_SETTINGS, '{"alpha": "sometimes"}')
    assert "SGLANG_MARCONI_SETTINGS" in _api_error(ServerArgs)


def test_python_api_accepts_a_valid_marconi_record(sglang_args, monkeypatch):
    ServerArgs, _ = sglang_args
    monkeypatch.setenv(ENV_SETTINGS, MarconiSettings(alpha=1.5).to_env()[ENV_SETTINGS])
    args = ServerArgs(model_path="dummy", device="cpu", radix_cache_backend="marconi")
    args.resolve_once()
    assert validate_server_args(args).alpha == 1.5
    assert validate_server_args(types.SimpleNamespace(radix_cache_backend=None)) is None


def test_pd_decode_server_passes_validation():
    decode = types.SimpleNamespace(radix_cache_backend="marconi", disaggregation_mode="decode",
                                   disable_radix_cache=True)
    assert validate_server_args(decode) is None
    prefill = types.SimpleNamespace(radix_cache_backend="marconi",
                                    disaggregation_mode="prefill", disable_radix_cache=True)
    with pytest.raises(ValueError, match="--disable-radix-cache"):
        validate_server_args(prefill)


def test_backend_steps_aside_when_the_radix_cache_is_off(monkeypatch, caplog):
    import sglang.srt.mem_cache.registry as registry

    from sglang_marconi.sglang_integration.backend import marconi_cache_factory

    stock = object()
    monkeypatch.setattr(registry, "default_radix_cache_factory", lambda ctx: stock)
    hf = types.SimpleNamespace(architectures=["Qwen3NextForCausalLM"])
    ctx = types.SimpleNamespace(is_hybrid_ssm=True, is_hybrid_swa=False,
                                disable_radix_cache=True, enable_hierarchical_cache=False,
                                model_config=types.SimpleNamespace(hf_config=hf))
    with caplog.at_level(logging.INFO, logger="sglang_marconi.cache"):
        assert marconi_cache_factory(ctx) is stock
    lines = [r for r in caplog.records if r.name == "sglang_marconi.cache"]
    assert len(lines) == 1 and "radix cache is disabled" in lines[0].getMessage()
