"""The SGLang plugin: version pin, registration in a freshly spawned process (as SGLang's
scheduler processes are), the server flags and their start-up errors."""
import multiprocessing
import os
import subprocess
import sys
import types

import pytest

pytest.importorskip("sglang")

from sglang_marconi.sglang_integration.options import (  # noqa: E402
    ENV_SETTINGS,
    MarconiSettings,
    flag_fields,
)
from sglang_marconi.sglang_version import (  # noqa: E402
    SUPPORTED_SGLANG_VERSION,
    SGLangVersionError,
    check_sglang_version,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_version_pin():
    assert check_sglang_version() == SUPPORTED_SGLANG_VERSION == "0.5.23"
    with pytest.raises(SGLangVersionError) as err:
        check_sglang_version("0.5.22")
    message = str(err.value)
    assert "\n" not in message and "0.5.23" in message and "0.5.22" in message


def _child_probe(queue):
    """Runs in a spawned interpreter: what SGLang's own plugin loader makes of us."""
    os.environ.pop(ENV_SETTINGS, None)
    from sglang.srt.mem_cache.registry import registered_radix_cache_backends
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    args = prepare_server_args(["--model-path", "dummy", "--cache-policy", "marconi",
                                "--marconi-alpha", "0.25",
                                "--marconi-max-states-per-request", "3"])
    settings = MarconiSettings.from_env()
    queue.put((registered_radix_cache_backends(), args.radix_cache_backend,
               settings.alpha, settings.max_states_per_request,
               sorted(k for k in os.environ if k.startswith("SGLANG_MARCONI"))))


def test_plugin_loads_in_a_spawned_process():
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_probe, args=(queue,))
    proc.start()
    try:
        backends, backend, alpha, max_states, handed_over = queue.get(timeout=240)
    finally:
        proc.join(timeout=60)
    assert "marconi" in backends
    assert backend == "marconi"
    assert (alpha, max_states) == (0.25, 3)
    assert handed_over == [ENV_SETTINGS]  # one value crosses into the scheduler


@pytest.fixture(scope="module")
def parse():
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()

    def run(*flags):
        return prepare_server_args(["--model-path", "dummy", *flags])

    return run


def test_cache_policy_flag_selects_the_backend(parse, monkeypatch):
    monkeypatch.delenv(ENV_SETTINGS, raising=False)
    assert parse().radix_cache_backend is None
    assert parse("--cache-policy", "lru").radix_cache_backend is None
    args = parse("--cache-policy", "marconi")
    assert args.radix_cache_backend == "marconi"
    settings = MarconiSettings.from_env()
    assert settings == MarconiSettings() and settings.plus  # the reuse-weighted ranking
    parse("--cache-policy", "marconi", "--marconi-alpha", "0.5",
          "--marconi-host-rule", "lru")
    settings = MarconiSettings.from_env()
    assert settings.alpha == 0.5 and not settings.plus and settings.host_rule == "lru"


def test_marconi_plus_is_a_deprecated_alias(parse, monkeypatch, capfd):
    monkeypatch.delenv(ENV_SETTINGS, raising=False)
    args = parse("--cache-policy", "marconi+")  # SGLang's logging handler writes stderr
    assert args.radix_cache_backend == "marconi"
    assert MarconiSettings.from_env() == MarconiSettings()
    err = capfd.readouterr().err
    assert "--cache-policy marconi+ is deprecated: it is now --cache-policy marconi" in err


def test_settings_hand_over_round_trip_and_errors():
    s = MarconiSettings(alpha=1.5, max_states_per_request=2, ghost_factor=3.0)
    assert MarconiSettings.from_env(s.to_env()) == s
    with pytest.raises(ValueError, match="SGLANG_MARCONI_SETTINGS: unknown field"):
        MarconiSettings.from_env({ENV_SETTINGS: '{"bootstrap_multiplier": 5}'})
    with pytest.raises(ValueError, match="MarconiSettings.end_threshold: expected a number"):
        MarconiSettings(end_threshold=2.0)
    with pytest.raises(ValueError, match="--marconi-alpha: expected a number >= 0"):
        MarconiSettings(alpha=-1)


def test_at_most_four_marconi_flags_on_the_launcher():
    flags = [f.metadata["flag"] for f in flag_fields()]
    assert len(flags) + 1 <= 4  # with --cache-policy
    assert all(f.metadata["help"] for f in flag_fields())


@pytest.mark.parametrize("flags,fragment", [
    (("--cache-policy", "marconi", "--disable-radix-cache"), "--disable-radix-cache"),
    (("--cache-policy", "marconi", "--radix-eviction-policy", "lfu"), "eviction"),
    (("--cache-policy", "marconi", "--enable-hierarchical-cache", "--enable-unified-memory"),
     "--enable-unified-memory"),
    (("--cache-policy", "marconi", "--enable-hierarchical-cache",
      "--hicache-host-memory-mode", "buffer_only"), "buffer_only"),
    (("--cache-policy", "marconi", "--speculative-algorithm", "NEXTN"), "--speculative-algorithm"),
    (("--cache-policy", "marconi+", "--speculative-algorithm", "EAGLE"), "--speculative-algorithm"),
    (("--cache-policy", "marconi", "--speculative-algorithm", "DFLASH"), "NGRAM, which drafts without a model"),
    (("--cache-policy", "marconi", "--speculative-algorithm", "EAGLE3"), "draft-model worker"),
    (("--cache-policy", "marconi", "--radix-cache-backend", "flexkv"), "flexkv"),
    (("--marconi-alpha", "0.5"), "only apply with --cache-policy marconi"),
    (("--cache-policy", "marconi", "--marconi-max-states-per-request", "0"), "positive"),
    (("--cache-policy", "marconi", "--marconi-alpha", "auto"), "a number >= 0"),
    (("--cache-policy", "marconi", "--mamba-radix-cache-strategy", "extra_buffer_lazy"),
     "extra_buffer_lazy is not supported yet"),
    (("--cache-policy", "marconi", "--marconi-online-window", "9"), "unrecognized"),
])
def test_conflicting_flags_fail_at_start_up(parse, flags, fragment, capfd):
    with pytest.raises(SystemExit) as err:
        parse(*flags)
    # a check's message, or argparse's (a bad value or an unknown flag: on stderr)
    assert fragment in str(err.value) + capfd.readouterr().err


def test_ngram_speculative_decoding_is_accepted(parse, monkeypatch):
    """NGRAM (no draft model) serves with the Marconi cache (tests/live/test_live_spec.py);
    the refusal names the algorithm and what is missing in one line."""
    monkeypatch.delenv(ENV_SETTINGS, raising=False)
    args = parse("--cache-policy", "marconi", "--speculative-algorithm", "ngram",
                 "--speculative-num-draft-tokens", "4")
    assert args.radix_cache_backend == "marconi"
    assert args.speculative_algorithm.upper() == "NGRAM"
    with pytest.raises(SystemExit) as err:
        parse("--cache-policy", "marconi", "--speculative-algorithm", "NEXTN")
    assert "\n" not in str(err.value)
    assert "--speculative-algorithm NEXTN is not supported yet (its draft-model worker" in str(
        err.value)


def test_bad_alpha_is_rejected(parse):
    with pytest.raises(SystemExit):
        parse("--cache-policy", "marconi", "--marconi-alpha", "-1")


def test_non_hybrid_model_fails_at_start_up():
    from sglang_marconi.sglang_integration.backend import marconi_cache_factory

    hf = types.SimpleNamespace(architectures=["LlamaForCausalLM"])
    ctx = types.SimpleNamespace(is_hybrid_ssm=False, is_hybrid_swa=False,
                                model_config=types.SimpleNamespace(hf_config=hf))
    with pytest.raises(ValueError, match="LlamaForCausalLM.*hybrid|hybrid.*LlamaForCausalLM"):
        marconi_cache_factory(ctx)


def test_launch_server_module_knows_the_flags():
    out = subprocess.run([sys.executable, "-m", "sglang_marconi.launch_server", "--help"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for flag in ("--cache-policy", "--marconi-alpha", "--marconi-max-states-per-request",
                 "--marconi-host-rule"):
        assert flag in out.stdout
    for gone in ("--marconi-bootstrap-multiplier", "--marconi-online-alphas",
                 "--marconi-ghost-factor"):
        assert gone not in out.stdout


def test_int8_checkpoints_pass_sglangs_backend_check_with_marconi_only(parse):
    """SGLang refuses --enable-int8-mamba-checkpoint with any --radix-cache-backend (not
    int8-aware); the plugin's resolution hook lets the marconi backend through (it is
    SGLang's cache with SGLang's MAMBA component) and leaves SGLang's other refusals."""
    from sglang.srt.arg_groups import mamba_hook
    from sglang.srt.arg_groups.resolution_hooks import run_hook

    def check(**fields):
        sa = parse("--cache-policy", "marconi", "--enable-int8-mamba-checkpoint")
        assert sa.radix_cache_backend == "marconi"
        for name, value in fields.items():
            setattr(sa, name, value)
        run_hook(mamba_hook.handle_int8_mamba_checkpoint, sa)

    check()  # passes
    with pytest.raises(ValueError, match="not int8-aware"):
        check(radix_cache_backend="flexkv")
    with pytest.raises(ValueError, match="--enable-hierarchical-cache: the host-offload path"):
        check(enable_hierarchical_cache=True)
    with pytest.raises(SystemExit, match="--enable-int8-mamba-checkpoint does nothing with "
                                         "--enable-unified-memory"):
        parse("--cache-policy", "marconi", "--enable-int8-mamba-checkpoint",
              "--enable-unified-memory")
