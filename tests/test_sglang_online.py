"""``--marconi-alpha online``: the flags, the SGLang cache following ``OnlineAlpha`` on the
live request stream (replayed through the scheduler's calls), metadata-only shadows, and
the CPU A/B with it."""
import argparse
import functools
import gc
import io
import json
import types
from array import array
from contextlib import redirect_stdout

import numpy as np
import pytest

pytest.importorskip("sglang")
import torch  # noqa: E402

from sglang_marconi.model import preset_spec  # noqa: E402
from sglang_marconi.policy.cache import PrefixCache  # noqa: E402
from sglang_marconi.policy.online import OnlineAlpha  # noqa: E402
from sglang_marconi.sglang_integration.cache import MarconiUnifiedRadixCache  # noqa: E402
from sglang_marconi.sglang_integration.components import MAMBA  # noqa: E402
from sglang_marconi.harness.invariants import check_idle  # noqa: E402
from sglang_marconi.sglang_integration.options import (  # noqa: E402
    ENV_ALPHA,
    MarconiSettings,
    add_cli_args,
    parse_alpha,
    settings_from_namespace,
)
from sglang_marconi.driver.pools import PoolConfig, build_cache  # noqa: E402
from sglang_marconi.driver.replay import Replayer, ReplayRequest  # noqa: E402
from sglang_marconi.sim.generators import generate  # noqa: E402

SPEC = preset_spec("paper-7b")
POOLS = PoolConfig(kv_tokens=3000, mamba_slots=8, page_size=1, max_context_len=600,
                   chunked_prefill_size=1 << 20, mamba_track_interval=1 << 20,
                   mamba_cache_chunk_size=1)




def alpha_shift(requests_per_phase=60):
    """alpha-shift, small: scan (one-off long documents between hot prompts), steady (reused
    documents), scan again."""
    trace = generate("alpha-shift", seed=0, requests_per_phase=requests_per_phase,
                     long_len=400, short_len=40, short_prompts=8, hot_len=200, hot_prompts=3,
                     steady_docs=4, question=8, output=4)
    return [(r.input_tokens.tolist(), r.output_tokens.tolist()) for r in trace.requests]


def online_cache(alphas=(0.0, 2.0), window=20, sample=1.0):
    settings = MarconiSettings(alpha="online", online_alphas=alphas, online_window=window,
                               online_sample=sample)
    cls = functools.partial(MarconiUnifiedRadixCache, spec=SPEC, settings=settings)
    return build_cache(POOLS, cache_class=cls, tree_core="python")[0]


# -- flags ----------------------------------------------------------------------------------
def _namespace(*flags):
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    return parser.parse_args(list(flags))


def test_online_flags_parse():
    assert parse_alpha("online") == parse_alpha(" Online ") == "online"
    args = _namespace("--cache-policy", "marconi", "--marconi-alpha", "online",
                      "--marconi-online-alphas", "0,0.25,3", "--marconi-online-window", "80",
                      "--marconi-online-sample", "0.5")
    s = settings_from_namespace(args)
    assert s.online_alpha and s.online_alphas == (0.0, 0.25, 3.0)
    assert (s.online_window, s.online_sample, s.online_period) == (80, 0.5, 20)
    assert MarconiSettings.from_env(s.to_env()) == s  # what scheduler processes read back
    default = settings_from_namespace(_namespace("--cache-policy", "marconi",
                                                 "--marconi-alpha", "online"))
    assert default.online_alphas == (0.0, 0.5, 1.0, 2.0)
    assert (default.online_window, default.online_sample) == (200, 1.0)


@pytest.mark.parametrize("flags,fragment", [
    # online is the default mode: its flags need no --marconi-alpha, but not another mode
    (("--marconi-alpha", "auto", "--marconi-online-window", "50"),
     "only apply with --marconi-alpha online"),
    (("--marconi-alpha", "0.5", "--marconi-online-alphas", "0,1"), "only apply with"),
    (("--marconi-alpha", "online", "--marconi-online-window", "0"), "positive integer"),
    (("--marconi-alpha", "online", "--marconi-online-sample", "1.5"), "(0, 1]"),
])
def test_bad_online_flags_are_rejected(flags, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace("]", r"\]")):
        settings_from_namespace(_namespace("--cache-policy", "marconi", *flags))


@pytest.mark.parametrize("alphas", ["a,b", "1,1", "-1,2", ""])
def test_bad_online_alphas_fail_in_argparse(alphas):
    with pytest.raises(SystemExit):
        _namespace("--cache-policy", "marconi", "--marconi-alpha", "online",
                   "--marconi-online-alphas", alphas)


def test_server_parses_online(monkeypatch):
    """Through SGLang's own parser (the plugin's flag hooks)."""
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    monkeypatch.delenv(ENV_ALPHA, raising=False)
    load_plugins()
    args = prepare_server_args(["--model-path", "dummy", "--cache-policy", "marconi",
                                "--marconi-alpha", "online", "--marconi-online-alphas",
                                "0,1", "--marconi-online-window", "40"])
    assert args.radix_cache_backend == "marconi"
    s = MarconiSettings.from_env()
    assert s.alpha == "online" and s.online_alphas == (0.0, 1.0) and s.online_window == 40


def test_native_factory_reads_online_fields(monkeypatch):
    """The patched build's native fields (defaults when the build predates them)."""
    from sglang_marconi.sglang_integration import backend

    monkeypatch.setattr(backend, "marconi_cache_factory", lambda ctx, settings: settings)
    memory = types.SimpleNamespace(marconi_alpha="online", marconi_bootstrap_multiplier=5.0,
                                   marconi_max_states_per_request=-1,
                                   marconi_online_alphas="0,4", marconi_online_window=30,
                                   marconi_online_sample=0.25)
    s = backend.native_cache_factory(None, memory)
    assert (s.alpha, s.online_alphas, s.online_window, s.online_sample) == (
        "online", (0.0, 4.0), 30, 0.25)
    old = types.SimpleNamespace(marconi_alpha="1", marconi_bootstrap_multiplier=5.0,
                                marconi_max_states_per_request=2)
    assert backend.native_cache_factory(None, old).online_alphas == (0.0, 0.5, 1.0, 2.0)


# -- the cache follows OnlineAlpha ----------------------------------------------------------
def test_the_cache_follows_online_alpha_on_a_replayed_trace():
    requests = alpha_shift()
    cache = online_cache()
    policy = cache.marconi
    # the reference: OnlineAlpha fed the same stream, with shadows built the same way
    reference = OnlineAlpha(policy.make_shadow, alphas=(0.0, 2.0), window=20, period=5)
    walk_alphas = []  # (alpha each eviction walk ranked with, the reference's alpha then)
    component = cache.components[MAMBA]
    # wraps SGLang's walk-start hook (``_evict_device_start``, which the MAMBA component
    # overrides) to see the alpha each walk ranks with: no public event marks a walk
    walk_start = component._evict_device_start

    def probe(request_cnt):
        walk_start(request_cnt)
        walk_alphas.append((component.queue.alpha, reference.alpha))

    component._evict_device_start = probe
    replayer = Replayer(cache, chunked_prefill_size=POOLS.chunked_prefill_size)
    for i, (inp, out) in enumerate(requests):
        replayer.run(ReplayRequest(f"r{i}", array("q", inp), out))
        full = np.asarray(inp + out[:-1], dtype=np.int64)
        reference.observe(np.asarray(inp, dtype=np.int64), full)
        assert policy.alpha == reference.alpha, f"request {i}"
    check_idle(cache)
    assert policy.online.history == reference.history
    assert len(reference.history) >= 3  # it moved, and back
    assert {a for a, _ in walk_alphas} == {0.0, 2.0}
    assert all(used == ref for used, ref in walk_alphas)
    st = policy.stats
    assert st.alpha == policy.alpha and st.online_switches == len(reference.history) - 1
    assert st.requests == len(requests)
    assert st.online_seconds > 0 and st.bookkeeping_seconds > 0
    assert st.shadow_tokens > 0 and st.tree_tokens > 0
    online = st.as_dict()["online"]
    assert online["time_ratio"] == pytest.approx(st.online_seconds / st.bookkeeping_seconds)
    assert online["memory_ratio"] == pytest.approx(st.shadow_tokens / st.tree_tokens)
    assert "online[switches=" in st.summary_line()


def test_shadows_are_metadata_only_simulator_caches():
    requests = alpha_shift(30)
    cache = online_cache(alphas=(0.0, 1.0, 2.0), sample=0.5)
    replayer = Replayer(cache, chunked_prefill_size=POOLS.chunked_prefill_size)
    for i, (inp, out) in enumerate(requests):
        replayer.run(ReplayRequest(f"r{i}", array("q", inp), out))
    shadows = list(cache.marconi.online.shadows.values())
    assert all(isinstance(s, PrefixCache) for s in shadows)
    assert sum(s.tree.num_kv_tokens for s in shadows) > 0
    # everything reachable from the shadows: no tensor (and no SGLang object) among it
    seen, stack, tensors, sglang_objects = set(), list(shadows), 0, 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(obj))
        tensors += isinstance(obj, torch.Tensor)
        sglang_objects += type(obj).__module__.startswith("sglang.")
        stack.extend(gc.get_referents(obj))
    assert len(seen) > 100 and tensors == 0 and sglang_objects == 0


def test_the_alpha_is_logged_and_exported(caplog):
    """Each move is logged and goes to the exporter behind ``sglang:marconi_alpha`` (a
    recording stand-in here: SGLang's own collector registers its Prometheus series once
    per process, which ``test_sglang_cache`` already does)."""
    cache = online_cache()
    exported = []
    cache.marconi.exporter = types.SimpleNamespace(
        set_alpha=exported.append, request=lambda *a: None, state=lambda *a: None)
    replayer = Replayer(cache, chunked_prefill_size=POOLS.chunked_prefill_size)
    with caplog.at_level("INFO", logger="sglang_marconi.cache"):
        for i, (inp, out) in enumerate(alpha_shift()):
            replayer.run(ReplayRequest(f"r{i}", array("q", inp), out))
    history = cache.marconi.online.history
    assert len(history) > 1 and exported == [a for _, a in history[1:]]
    assert exported[-1] == cache.marconi.alpha
    moves = [r.getMessage() for r in caplog.records if "moved to" in r.getMessage()]
    assert len(moves) == len(exported) and all("online" in m for m in moves)


# -- the CPU A/B ----------------------------------------------------------------------------
def test_ab_runs_with_online_alpha(tmp_path):
    from sglang_marconi.cli import ab as ab_cli
    from sglang_marconi.sim.traces import write_sessions

    trace = generate("alpha-shift", seed=1, requests_per_phase=20, long_len=400, short_len=40,
                     short_prompts=8, hot_len=200, hot_prompts=3, steady_docs=4, question=8,
                     output=4)
    path = tmp_path / "trace.jsonl"
    write_sessions(trace, path)
    parser = argparse.ArgumentParser()
    ab_cli.add_arguments(parser)
    args = parser.parse_args([
        "--trace", str(path), "--model", "paper-7b", "--kv-tokens", "3000",
        "--mamba-slots", "8", "--page-size", "64", "--caches", "stock,marconi", "--json",
        "--no-progress", "--marconi-alpha", "online", "--marconi-online-alphas", "0,2",
        "--marconi-online-window", "20"])
    out = io.StringIO()
    with redirect_stdout(out):
        assert ab_cli.run(args) == 0
    result = json.loads(out.getvalue())
    m = result["caches"]["marconi"]["marconi"]
    assert m["alpha_mode"] == "online" and m["alpha"] in (0.0, 2.0)
    assert m["online"]["shadow_tokens"] > 0 and m["online"]["time_ratio"] > 0
    assert result["config"]["marconi_alpha"] == "online"
    assert result["config"]["marconi_online_alphas"] == [0.0, 2.0]
    text = ab_cli.format_table(result)
    assert "online" in text and "switches" in text
