"""``serve-sim`` with SGLang's host tier (HiCache): the scheduler's HiCache calls in both
loops, load-backs on the virtual clock (a batch that loads from host takes max(forward,
load); the first token of a request that loaded waits for its load), the run's ``host``
section, both tiers' invariants after the run (no leaked host slot, no lock, every cached
token's KV right on each tier), the L3 file store, and the CLI's flags and one-line
errors."""
import importlib.util
import json
from array import array
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from sglang_marconi.cli.host_flags import host_ratio  # noqa: E402
from sglang_marconi.driver.replay import ReplayRequest  # noqa: E402
from sglang_marconi.errors import UserError  # noqa: E402
from sglang_marconi.model import preset_spec  # noqa: E402

SPEC = preset_spec("qwen3_next")
SLOW_LINK = 2e6  # bytes/s: every load-back is longer than its batch's forward


def _families(rounds: int = 4, families: int = 4) -> list:
    """Prefix families (1,024 shared tokens + 512 own) taken in turn: the device pool
    (4,000 tokens) holds about two, so a family's prefix comes back from host."""
    reqs = []
    for r in range(rounds):
        for f in range(families):
            i = len(reqs)
            ids = array("q", [10_000 * (f + 1) + j for j in range(1024)]
                        + [1_000_000 + 1000 * i + j for j in range(512)])
            out = [(1 << 40) + 100 * i + j for j in range(8)]
            reqs.append(ReplayRequest(f"r{i}", ids, out))
    return reqs


def _setup(overlap: bool, pcie_bytes_s: float = 64e9, l3: bool = False):
    from sglang_marconi.driver.pools import PoolConfig
    from sglang_marconi.serving.gpu_model import GpuTimeModel, preset
    from sglang_marconi.serving.run import ServeSetup
    from sglang_marconi.serving.scheduler import SchedulerConfig

    pools = PoolConfig(kv_tokens=4000, mamba_slots=16, page_size=16, max_context_len=1600,
                       max_running_requests=2, chunked_prefill_size=1024,
                       overlap_schedule=overlap, hicache_write_policy="write_through",
                       hicache_ratio=3.0)
    sched = SchedulerConfig(max_running_requests=2, chunked_prefill_size=1024,
                            schedule_policy="fcfs", measure_bookkeeping=False, clients=2,
                            overlap=overlap)
    gpu = preset("h200", pcie_bytes_s=pcie_bytes_s)
    return ServeSetup(spec=SPEC, time_model=GpuTimeModel(SPEC, gpu), pools=pools,
                      sched=sched, timestamps=[0.0] * 16, l3=l3)


def _stamping(reqs):
    """``on_launch``: the forward's KV writes, as token stamps (``TokenKV``)."""
    from marconi_checks.host_invariants import TokenKV

    sequences = {r.rid: list(r.input_ids) + list(r.output_ids) for r in reqs}
    writer = {}

    def on_launch(batch):
        kv = writer.setdefault("kv", TokenKV(batch.tree_cache, sequences))
        decode = batch.forward_mode.is_decode()
        for i, req in enumerate(batch.reqs):
            if decode:
                end = int(batch.seq_lens_cpu[i])
                kv(req, end - 1, end)
            else:
                kv(req, req.prefix_len, req.extend_end)
    return on_launch


def _serve(cache, overlap, **setup):
    from sglang_marconi.serving.run import run_serving

    reqs = _families()
    return run_serving(cache, reqs, _setup(overlap, **setup), rate_scale=0.0,
                       on_launch=_stamping(reqs))


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
@pytest.mark.parametrize("cache", ["stock-python", "marconi+"])
def test_load_backs_on_the_clock_and_both_tiers_clean(cache, overlap):
    from marconi_checks.host_invariants import check_host_idle
    from marconi_checks.invariants import check_idle

    fast, fast_sched = _serve(cache, overlap)
    slow, slow_sched = _serve(cache, overlap, pcie_bytes_s=SLOW_LINK)
    for run, sched in ((fast, fast_sched), (slow, slow_sched)):
        host = run["host"]
        assert run["finished"] == 16 and run["aborted"] == 0
        assert run["host_hit_tokens"] == host["hit_tokens"] > 0, cache  # loaded back
        assert host["requests_with_host_hits"] > 0 and host["steps_with_loads"] > 0
        assert host["bytes_loaded"] == (host["kv_tokens_loaded"] * SPEC.kv_bytes_per_token
                                        + host["states_loaded"] * SPEC.ssm_state_bytes) > 0
        assert host["load_s_total"] == pytest.approx(
            host["bytes_loaded"] / sched.tm.gpu.pcie_bytes_s)
        assert 0 < host["flops_saved"] <= run["flops_saved"]
        assert host["bytes_backed_up"] > 0 and host["device_kv_tokens_evicted"] > 0
        check_idle(sched.cache)               # device: every slot free or the tree's
        held = check_host_idle(sched.cache)   # host: no leaked slot, no lock, right KV
        assert held["kv"] and held["compared"] > 0
    again, _ = _serve(cache, overlap)  # deterministic in the request stream
    timed = ("wall_s", "gc_")              # this machine's wall time and collector pauses
    assert ({k: v for k, v in again.items() if not k.startswith(timed)}
            == {k: v for k, v in fast.items() if not k.startswith(timed)})
    # the clock does not steer the scheduler (all arrivals at 0, no measured bookkeeping):
    # the same batches, only their time differs
    assert slow["host_hit_tokens"] == fast["host_hit_tokens"]
    assert slow["host"]["bytes_loaded"] == fast["host"]["bytes_loaded"]
    assert [s.batch for s in slow_sched.steps] == [s.batch for s in fast_sched.steps]
    assert fast["host"]["load_exposed_s_total"] == 0.0  # 64 GB/s: hidden under the forward
    assert slow["host"]["load_exposed_s_total"] > 0.5   # 2 MB/s: the step waits for it
    tm = slow_sched.tm
    for fs, ss in zip(fast_sched.steps, slow_sched.steps):
        if ss.load_s:  # the same batch is longer by the load's excess over its forward
            assert ss.gpu_s - fs.gpu_s == pytest.approx(ss.load_exposed_s)
            assert ss.gpu_s == pytest.approx(ss.load_s + tm.gpu.step_overhead_s)
    hit = [r for r in slow_sched.records.values() if r.host_hit_len]
    assert hit and all(r.host_load_s > 0 for r in hit)
    for r in hit:  # a host hit's first token comes after its load-back
        assert r.first_token - r.arrival >= r.host_load_s
        fast_rec = fast_sched.records[r.rid]
        assert r.first_token - r.arrival > fast_rec.first_token - fast_rec.arrival


def test_l3_file_store_run():
    """--hicache-storage-backend file: the prefetch on arrival and the backups run (SGLang's
    storage threads, a temporary directory), and both tiers end clean."""
    from marconi_checks.host_invariants import check_host_idle

    run, sched = _serve("marconi+", True, l3=True)
    assert run["finished"] == 16 and run["host"]["hit_tokens"] > 0
    assert sched.cache.enable_storage and not sched.cache.ongoing_backup
    check_host_idle(sched.cache)


def test_step_time_is_the_longer_of_forward_and_load():
    from sglang_marconi.serving.gpu_model import GpuTimeModel, preset

    tm = GpuTimeModel(SPEC, preset("h200", step_overhead_s=0.0, pcie_bytes_s=1e9))
    flops = tm.prefill_flops_s * 0.5                      # a 0.5 s forward
    assert tm.load_seconds(2e8) == pytest.approx(0.2)
    assert tm.prefill_seconds(flops, tm.load_seconds(2e8)) == pytest.approx(0.5)  # hidden
    assert tm.prefill_seconds(flops, tm.load_seconds(8e8)) == pytest.approx(0.8)  # exposed
    assert tm.prefill_seconds(flops) == pytest.approx(0.5)


def _cli(*argv):
    from cli_helper import run_cli
    from sglang_marconi.cli import serve_sim

    return run_cli(serve_sim, *argv)


def _trace(tmp_path):
    path = tmp_path / "families.jsonl"
    lines, fresh = [], 1000
    for r in range(3):
        for family in range(4):
            lines.append(json.dumps({"timestamp": 0.01 * len(lines), "input_length": 1536,
                                     "output_length": 8,
                                     "hash_ids": [10 * family, 10 * family + 1, fresh]}))
            fresh += 1
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# a bfloat16 temporal state (--mamba-ssm-dtype): the 0.6 GB pools were sized in those bytes
BASE = ("--model", "qwen3_next", "--mamba-ssm-dtype", "bfloat16", "--cache-gb", "0.6",
        "--page-size", "16", "--chunked-prefill-size", "1024", "--no-progress",
        "--bookkeeping", "off")


def _table_script():
    spec = importlib.util.spec_from_file_location(
        "serve_sim_table", Path(__file__).resolve().parents[1] / "scripts" / "serve_sim_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_host_flags_section_and_table(tmp_path, capsys):
    trace = _trace(tmp_path)
    out = json.loads(_cli("--trace", trace, *BASE, "--caches", "stock,marconi+",
                          "--hicache-ratio", "3", "--pcie-gb-s", "32", "--json"))
    host_cfg = out["config"]["host"]
    assert host_cfg["write_policy"] == "write_through" and host_cfg["hicache_ratio"] == 3.0
    # SGLang's host KV pool: 3 x the device's, floored to its page, plus one page
    page = out["config"]["pools"]["page_size"]
    assert host_cfg["kv_tokens"] == (3 * out["config"]["pools"]["kv_tokens"] // page + 1) * page
    assert out["config"]["gpu"]["pcie_bytes_s"] == 32e9
    for run in out["runs"]:
        assert run["finished"] == 12
        assert {"hit_tokens", "bytes_loaded", "load_s_total", "load_exposed_s_total",
                "kv_tokens_evicted", "device_kv_tokens_evicted"} <= set(run["host"])
        assert run["host"]["bytes_backed_up"] > 0  # write_through backs every insert up
    saved = tmp_path / "runs.json"  # scripts/serve_sim_table.py: the table from the JSON
    saved.write_text(json.dumps(out))
    table = _table_script().main([str(saved)])
    assert table == 0 and "host hit" in capsys.readouterr().out.splitlines()[0]
    line = _table_script().against_stock(out["runs"])[0]
    ratio = out["runs"][1]["ttft_p95_s"] / out["runs"][0]["ttft_p95_s"]
    assert line.startswith("marconi+@") and f"= {ratio:.3f}x;" in line and "host hit" in line
    assert _table_script().main([str(saved), str(saved)]) == 0  # several files: brief
    brief = capsys.readouterr().out.splitlines()
    assert len(brief) == 4 and brief[0].startswith("qwen3_next, static 0.6 GB, host 3x "
                                                   "write_through, h200 PCIe 32 GB/s")
    text = _cli("--trace", trace, *BASE, "--caches", "stock", "--hicache-size", "2",
                "--hicache-write-policy", "write_back", "--load", "0.8")
    assert "host hit" in text.splitlines()[1] and "load exposed s" in text
    plain = _cli("--trace", trace, *BASE, "--caches", "stock", "--load", "0.8")
    assert "host hit" not in plain  # no host flag: no host tier, no host columns


def test_cli_refuses_unified_memory_and_replicas(tmp_path):
    trace = _trace(tmp_path)
    for extra, what in ((("--memory", "unified"), "--memory unified"),
                        (("--replicas", "2"), "--replicas")):
        with pytest.raises(UserError, match=what) as err:
            _cli("--trace", trace, *BASE, "--caches", "stock", "--hicache-size", "400",
                 *extra)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("flag,value", [("--hicache-size", "-1"), ("--pcie-gb-s", "0"),
                                        ("--hicache-ratio", "x"),
                                        ("--hicache-write-policy", "write_sometimes")])
def test_cli_bad_host_flags_are_one_line(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit):
        _cli("--trace", "t.jsonl", "--model", "qwen3_next", flag, value)
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and flag in errors[0] and value in errors[0]


def test_cli_flags_reach_the_pools(tmp_path):
    """--hicache-size splits the host memory as ``ab`` does (one helper, cli.host_flags)."""
    import argparse

    from sglang_marconi.cli import serve_sim

    parser = argparse.ArgumentParser()
    serve_sim.add_arguments(parser)
    args = parser.parse_args(["--trace", _trace(tmp_path), *BASE, "--hicache-size", "2",
                              "--hicache-storage-backend", "file"])
    _, setup, sizes = serve_sim.build_setup(args)
    assert setup.pools.hicache_ratio == host_ratio(args, setup.spec, sizes.kv_tokens,
                                                   sizes.mamba_slots) > 0
    assert setup.spec.cache_dtypes.temporal == "bfloat16"  # --mamba-ssm-dtype reached it
    assert setup.pools.hicache_write_policy == "write_through" and setup.l3
