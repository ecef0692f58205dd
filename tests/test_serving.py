"""The serving replay (``serve-sim``): with one client and zero arrival gaps it is the serial
A/B, hit for hit and FLOP for FLOP, for every cache; under concurrency every request
finishes or is reported aborted, SGLang's cache invariants hold after every step (retractions
included) and every slot returns to its pool; the time model, the load scaling and the CLI's
errors."""
import dataclasses
import json

import pytest

pytest.importorskip("sglang")

from sglang_marconi.errors import UserError  # noqa: E402
from sglang_marconi.model import preset_spec  # noqa: E402

OUT_CAP = 12  # output tokens per request in the fast tests (decode steps dominate the time)


@pytest.fixture(scope="module")
def spec():
    return preset_spec("qwen3_next")


@pytest.fixture(scope="module")
def requests(mooncake_path):
    from sglang_marconi.harness.ab import to_replay_requests
    from sglang_marconi.sim.traces import read_trace

    reqs = to_replay_requests(read_trace(mooncake_path), 160)
    return [dataclasses.replace(r, output_ids=r.output_ids[:OUT_CAP]) for r in reqs]


def _setup(spec, requests, *, kv, slots, running, clients=None, gpu="h200", policy="fcfs"):
    from sglang_marconi.driver.pools import PoolConfig
    from sglang_marconi.serving.gpu_model import GpuTimeModel, preset
    from sglang_marconi.serving.run import ServeSetup
    from sglang_marconi.serving.scheduler import SchedulerConfig

    longest = max(len(r.input_ids) + max(1, r.output_len) for r in requests)
    pools = PoolConfig(kv_tokens=kv, mamba_slots=slots, max_context_len=longest + 128,
                       max_running_requests=running)
    sched = SchedulerConfig(max_running_requests=running, schedule_policy=policy,
                            measure_bookkeeping=False, clients=clients)
    return ServeSetup(spec=spec, time_model=GpuTimeModel(spec, preset(gpu)), pools=pools,
                      sched=sched, timestamps=[0.0] * len(requests))


@pytest.mark.parametrize("cache", ["stock", "stock-python", "marconi", "marconi+"])
def test_one_client_zero_gaps_is_the_serial_ab(spec, requests, cache):
    from sglang_marconi.harness.ab import ABConfig, run_one
    from sglang_marconi.serving.run import run_serving

    setup = _setup(spec, requests, kv=400_000, slots=24, running=4, clients=1)
    ab = run_one(cache, requests, ABConfig(pools=setup.pools, spec=spec))
    served, sched = run_serving(cache, requests, setup, rate_scale=0.0)
    assert ab["hit_tokens"] > 0 and ab["states_evicted"] > 0  # the pools are under pressure
    assert served["hit_tokens"] == ab["hit_tokens"]
    assert served["flops_saved"] == ab["flops_saved"]
    assert served["finished"] == len(requests) and served["retractions"] == 0
    assert max(s.resident for s in sched.steps) == 1


@pytest.mark.parametrize("memory", ["static", "unified"])
@pytest.mark.parametrize("cache", ["stock-python", "marconi+"])
def test_concurrent_run_conserves_requests_and_slots(spec, requests, cache, memory):
    from marconi_checks.invariants import check_idle, check_sizes
    from sglang_marconi.serving.run import run_serving

    from array import array

    from sglang_marconi.driver.replay import ReplayRequest

    # short prompts sharing prefixes, long outputs: admission (new_token_ratio) lets in more
    # than the KV pool can decode, so SGLang's retract_decode runs
    reqs = [ReplayRequest(f"r{i}", array("q", [7] * (64 * (i % 4)) + [1000 + i] * 200),
                          list(range(1 << 40, (1 << 40) + 300 + 37 * (i % 7))))
            for i in range(48)]
    setup = _setup(spec, reqs, kv=4_096, slots=40, running=8)
    if memory == "unified":  # one buffer: the same KV bytes plus room for 10 states
        from sglang_marconi.driver.unified_pools import UnifiedConfig

        setup.unified = UnifiedConfig.for_tokens(spec, 4_096, states=10, mamba_slots=40)
    checked = []

    def after_step(sched):
        check_sizes(sched.cache)
        checked.append(1)

    served, sched = run_serving(cache, reqs, setup, rate_scale=0.0, after_step=after_step)
    assert len(checked) == len(sched.steps) > 0
    assert served["finished"] + served["aborted"] == len(reqs)
    assert all((r.finished is not None) != r.aborted for r in sched.records.values())
    if memory == "static":  # decode ran out of KV: SGLang's retract_decode
        assert served["retractions"] > 0
    assert max(s.resident for s in sched.steps) > 1
    check_idle(sched.cache)                   # every KV and state slot is free or the tree's


def test_deterministic_without_measured_bookkeeping(spec, requests):
    from sglang_marconi.serving.metrics import ttfts
    from sglang_marconi.serving.run import run_serving

    setup = _setup(spec, requests[:60], kv=400_000, slots=60, running=8, policy="lpm")
    setup.timestamps = [i * 0.05 for i in range(60)]
    a = run_serving("marconi", requests[:60], setup, load=0.9)[1]
    b = run_serving("marconi", requests[:60], setup, load=0.9)[1]
    assert ttfts(a) == ttfts(b) and a.now == b.now


def test_interleaved_runs_make_the_same_decisions(spec, requests):
    """``serve-sim --interleave``: the caches stepped in turn in one process make exactly
    the runs made one after the other (bookkeeping off, so nothing depends on timing); only
    the process-wide GC columns may differ."""
    from sglang_marconi.serving.run import run_grid
    from sglang_marconi.sglang_integration.options import MarconiSettings

    setup = _setup(spec, requests[:60], kv=400_000, slots=60, running=8)
    setup.timestamps = [i * 0.05 for i in range(60)]
    # alpha 1: marconi ranks KV leaves by recency normalised over its range, which the
    # other caches' ticks of SGLang's shared access counter would change (own counters)
    setup.settings = MarconiSettings(alpha=1.0)
    caches = ("stock", "marconi", "marconi+")
    apart = run_grid(requests[:60], setup, caches, [0.9], show_progress=False)
    side = run_grid(requests[:60], setup, caches, [0.9], show_progress=False, interleave=True)
    timing = {"wall_s", "gc_collections", "gc_pause_s_max", "gc_pause_s_total", "interleaved"}
    for a, b in zip(apart["runs"], side["runs"]):
        assert b["interleaved"] == 3 and "interleaved" not in a
        assert {k: v for k, v in a.items() if k not in timing} == {
            k: v for k, v in b.items() if k not in timing}, a["cache"]
    assert apart["ttft"] == side["ttft"]
    assert [r["cache"] for r in side["runs"]] == list(caches)


def test_time_model_and_load_scaling(spec, requests):
    from sglang_marconi.serving.arrivals import arrivals_for_load, offered_seconds
    from sglang_marconi.serving.gpu_model import GpuTimeModel, preset

    tm = GpuTimeModel(spec, preset("h200", mfu=0.5, step_overhead_s=0.0))
    assert tm.prefill_seconds(989e12 * 0.5) == pytest.approx(1.0)
    assert tm.extend_flops(0, 1000) == pytest.approx(spec.prefill_flops(1000))
    # attention over a cached context makes a chunk dearer than the same chunk from zero
    assert tm.extend_flops(8000, 9000) > tm.extend_flops(0, 1000)
    small, big = tm.decode_seconds(1000, 1), tm.decode_seconds(1_000_000, 1)
    assert big > small > tm.weight_bytes / tm.decode_bytes_s * 0.99
    assert preset("b200").peak_flops > preset("h100").peak_flops == preset("h200").peak_flops
    ts = [i * 1.0 for i in range(50)]
    times = arrivals_for_load(ts, requests[:50], tm, 0.5, batch=4)
    offered = offered_seconds(requests[:50], tm, 4)
    assert offered / (times[-1] - times[0]) == pytest.approx(0.5)
    # the load counts decode too, dearer per token in a smaller batch (the weights' read)
    prefill = sum(tm.extend_flops(0, len(r.input_ids)) for r in requests[:50]) / tm.prefill_flops_s
    assert offered_seconds(requests[:50], tm, 1) > offered > prefill
    poisson = arrivals_for_load([0.0] * 50, requests[:50], tm, 0.5, seed=1)
    assert poisson == sorted(poisson) and poisson[-1] > 0


def _cli(*argv):
    from cli_helper import run_cli
    from sglang_marconi.cli import serve_sim

    return run_cli(serve_sim, *argv)


def test_cli_json_plot_and_bad_input(mooncake_path, tmp_path):
    trace = str(mooncake_path)
    base = ("--trace", trace, "--model", "paper-7b", "--limit", "12", "--no-progress",
            "--bookkeeping", "off")
    png = tmp_path / "ttft.png"
    out = json.loads(_cli(*base, "--load", "0.5,0.9", "--caches", "stock,marconi+",
                          "--json", "--plot", str(png)))
    keys = {"cache", "load", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "queue_p95_s",
            "throughput_req_s", "output_tok_s", "flops_saved_fraction", "token_hit_rate",
            "gpu_busy_fraction", "max_running_requests", "mean_running", "busy_fraction",
            "cpu_critical_fraction", "overloaded", "gc_pause_s_max", "loop",
            "state_slots_by_running_mean", "state_slots_by_tree_mean", "retractions",
            "bookkeeping_ms_per_step_p99", "wall_s"}
    assert len(out["runs"]) == 4 and all(keys <= set(r) for r in out["runs"])
    assert all(r["finished"] == 12 for r in out["runs"]) and png.stat().st_size > 0
    assert "TTFT p50" in _cli(*base, "--caches", "stock", "--rate-scale", "0")
    assert "unified pools" in _cli(*base, "--caches", "marconi+", "--memory", "unified",
                                   "--load", "0.8")
    bad = [("--load", "abc"), ("--load", "0"),
           ("--cache-gb", "0.001"), ("--caches", "lru"), ("--mfu", "2"),
           ("--rate-scale", "-1")]
    for extra in bad:
        with pytest.raises(UserError) as err:
            _cli(*base, *extra)
        assert "\n" not in str(err.value)


def test_report_verdicts_and_markdown():
    from marconi_reports import serving_report

    def run(cache, load, p95):
        return {"cache": cache, "load": load, "ttft_p50_s": 0.1, "ttft_p95_s": p95,
                "ttft_p99_s": p95, "queue_p95_s": 0.0, "throughput_req_s": 1.0,
                "flops_saved_fraction": 0.1, "token_hit_rate": 0.1,
                "gpu_busy_fraction": 0.5, "mean_running": 2.0,
                "state_slots_by_running_mean": 8.0, "state_slots_by_tree_mean": 30.0,
                "retractions": 0, "bookkeeping_ms_per_step_p99": 0.5, "wall_s": 1.0}

    good = [run("stock", 0.8, 2.0), run("marconi+", 0.8, 1.0), run("stock", 0.5, 1.0),
            run("marconi+", 0.5, 1.01)]
    assert [v for _, v, _ in serving_report.verdicts("m", good)] == ["PASS", "PASS"]
    bad = [run("stock", 0.8, 2.0), run("marconi+", 0.8, 1.5), run("marconi", 0.8, 2.1)]
    assert [v for _, v, _ in serving_report.verdicts("m", bad)] == ["MISS", "MISS"]
    pools = {"mode": "static", "kv_tokens": 10, "mamba_slots": 5, "max_running_requests": 1}
    text = serving_report.markdown({"m": {"runs": good, "config": {"pools": pools,
                                                                     "requests": 4}}}, "cmd")
    assert "**PASS**" in text and text.count("\n| m |") == 4


def test_poisson_arrivals_are_seeded_and_keep_the_load(spec, requests):
    from sglang_marconi.serving.arrivals import arrivals_for_load, offered_seconds
    from sglang_marconi.serving.gpu_model import GpuTimeModel, preset

    tm = GpuTimeModel(spec, preset("h200"))
    ts = [i * 1.0 for i in range(100)]
    reqs = requests[:100]
    trace = arrivals_for_load(ts, reqs, tm, 0.8, batch=4)
    a, b = (arrivals_for_load(ts, reqs, tm, 0.8, seed=s, batch=4, poisson=True) for s in (1, 2))
    assert a == arrivals_for_load(ts, reqs, tm, 0.8, seed=1, batch=4, poisson=True)
    assert a != b and a != trace and a == sorted(a) and a[0] == 0.0
    # the same mean rate: the offered work over the span, within Poisson noise
    span = offered_seconds(reqs, tm, 4) / 0.8
    assert 0.6 * span < a[-1] < 1.4 * span


def test_grid_rows_medians_ratios_and_verdicts():
    from marconi_reports import serving_grid

    def run(cache, load, p95):
        return {"cache": cache, "load": load, "ttft_p50_s": p95 / 4, "ttft_p95_s": p95,
                "flops_saved_fraction": 0.1, "busy_fraction": 0.9, "overloaded": p95 > 9,
                "cpu_critical_fraction": 0.01, "gc_pause_s_max": 0.01,
                "bookkeeping_ms_per_step_max": 3.0, "bookkeeping_s_total": 1.0}

    cells = []
    for seed, (stock, plus) in enumerate([(2.0, 1.0), (4.0, 3.0), (10.0, 4.0)]):
        runs = [run("stock", 0.8, stock), run("marconi+", 0.8, plus),
                run("stock", 0.5, 1.0), run("marconi", 0.5, 1.1)]
        cells.append({"model": "paper-7b", "workload": "bundled", "memory": "unified",
                      "loop": "overlap", "seed": seed, "runs": runs})
    rows = serving_grid.rows(cells)
    plus = next(r for r in rows if r["cache"] == "marconi+")
    # medians over seeds: of P95 (1, 3, 4) -> 3; of the per-seed ratios (0.5, 0.75, 0.4)
    assert plus["ttft_p95_s"] == 3.0 and plus["p95_vs_stock"] == 0.5
    assert plus["overloaded"] == "0/3" and plus["seeds"] == 3
    assert next(r for r in rows if r["cache"] == "stock" and r["load"] == 0.8)[
        "overloaded"] == "1/3"
    verdicts = {t: v for t, v, _ in serving_grid.verdicts(rows)}
    assert verdicts["paper-7b, bundled: marconi and marconi+ P95 <= 1.02x stock at every "
                    "load"] == "MISS"   # marconi 1.1x at 0.5
    assert verdicts["paper-7b, bundled trace, load 0.8: marconi+ P95 <= 0.8x stock"] == "PASS"
    text = serving_grid.markdown(rows, "cmd")
    assert text.count("\n| paper-7b |") == 4 and "**MISS**" in text and "**PASS**" in text



def test_grid_rows_leave_crashed_servers_out_and_say_so():
    """A seed whose server SGLang crashed: its figures are left out of the medians and of
    the ratios (stock's crash takes that seed's ratios with it), the row counts it, and a
    Marconi cache that crashed fails the grid."""
    from marconi_reports import serving_grid

    def run(cache, p95, crashed=None):
        return {"cache": cache, "load": 0.95, "ttft_p50_s": 1.0, "ttft_p95_s": p95,
                "flops_saved_fraction": 0.1, "busy_fraction": 0.9, "overloaded": False,
                "cpu_critical_fraction": 0.0, "gc_pause_s_max": 0.0,
                "bookkeeping_ms_per_step_max": 1.0, "bookkeeping_s_total": 1.0,
                "crashed": crashed}

    boom = "SGLang raised 'Prefill out of memory. Try...' at t=1.0 s"
    cells = [{"model": "paper-7b", "workload": "bundled", "memory": "unified",
              "loop": "overlap", "seed": seed, "runs": runs} for seed, runs in enumerate([
                  [run("stock", 10.0), run("marconi+", 5.0), run("marconi", 9.0)],
                  [run("stock", 99.0, boom), run("marconi+", 7.0), run("marconi", 1.0, boom)],
                  [run("stock", 20.0), run("marconi+", 18.0), run("marconi", 19.0)]])]
    rows = {r["cache"]: r for r in serving_grid.rows(cells)}
    assert rows["stock"]["crashed"] == "1/3" and rows["stock"]["ttft_p95_s"] == 15.0
    # seed 1 has no stock P95: the ratios are seed 0's 0.5 and seed 2's 0.9
    assert rows["marconi+"]["p95_vs_stock"] == pytest.approx(0.7)
    assert rows["marconi+"]["ttft_p95_s"] == 7.0 and rows["marconi+"]["crashed"] == "0/3"
    verdicts = {t: (v, d) for t, v, d in serving_grid.verdicts(list(rows.values()))}
    verdict, detail = verdicts["marconi and marconi+ never crash the server"]
    assert verdict == "MISS" and "marconi paper-7b bundled load 0.95: 1/3" in detail
    cells[0]["runs"] = cells[1]["runs"] = [run("marconi", 1.0, boom)]
    cells.pop()
    only = serving_grid.rows(cells)
    assert only[0]["ttft_p95_s"] is None and only[0]["crashed"] == "2/2"
    assert "| 2/2 |" in serving_grid.markdown(only, "cmd")

def test_bookkeeping_ratios_against_both_stock_cores():
    from sglang_marconi.cli.serve_sim import format_ratios
    from sglang_marconi.serving.metrics import bookkeeping_ratios

    runs = [{"cache": c, "load": 0.8, "bookkeeping_s_total": s}
            for c, s in (("stock", 2.0), ("stock-python", 1.0), ("marconi+", 1.5))]
    runs.append({"cache": "marconi+", "load": 0.5, "bookkeeping_s_total": 1.0})
    got = bookkeeping_ratios(runs)
    assert got[0] == {"load": 0.8, "cache": "marconi+", "bookkeeping_s_total": 1.5,
                      "vs_stock": 0.75, "vs_stock_python": 1.5}
    assert got[1]["vs_stock"] is None  # no stock run at 0.5
    assert "1.50x stock-python" in format_ratios(got)[0]
