"""Writes tests/data/serving_normal_loop_golden.json: serve-sim's normal loop as it was at
commit 60b8b61, before the overlap loop existed (run there, from the repository root:
``PYTHONPATH=. python tests/data/gen_serving_golden.py TRACE OUT``). tests/test_overlap.py
checks that ``--disable-overlap-schedule`` still gives these numbers, bit for bit. The
marconi+ entries were regenerated (with ``{"overlap": False}`` and
``--disable-overlap-schedule``) when issue 18 changed marconi+'s policy (the learned chain
weight); the stock entries are still 60b8b61's."""
import json
import sys
from array import array

sys.path.insert(0, "tests")
from cli_helper import run_cli  # noqa: E402
from sglang_marconi.cli import serve_sim  # noqa: E402
from sglang_marconi.driver.pools import PoolConfig  # noqa: E402
from sglang_marconi.driver.replay import ReplayRequest  # noqa: E402
from sglang_marconi.model import preset_spec  # noqa: E402
from sglang_marconi.serving.gpu_model import GpuTimeModel, preset  # noqa: E402
from sglang_marconi.serving.run import ServeSetup, run_serving  # noqa: E402
from sglang_marconi.serving.scheduler import SchedulerConfig  # noqa: E402

# measured, not deterministic: left out of the comparison
DROP = ("wall_s", "gc_collections", "gc_pause_s_max", "gc_pause_s_total")
# the golden was written when serve-sim's default queue order was lpm: pinned here
CLI_ARGS = ("--model", "paper-7b", "--limit", "60", "--no-progress", "--bookkeeping", "off",
            "--memory", "unified", "--cache-gb", "20", "--rate-scale", "0.02", "--json",
            "--schedule-policy", "lpm")


def retraction_requests():
    """Short prompts sharing prefixes, long outputs: decode runs out of KV and retracts."""
    return [ReplayRequest(f"r{i}", array("q", [7] * (64 * (i % 4)) + [1000 + i] * 200),
                          list(range(1 << 40, (1 << 40) + 300 + 37 * (i % 7))))
            for i in range(48)]


def retraction_setup(overlap_kwargs: dict) -> ServeSetup:
    """Static pools as they were built at 60b8b61 (2 tracking slots), 8 running; the cost
    model's bytes as they were then (a bfloat16 temporal state: SGLang's float32 default
    came later and doubles the state the GPU time model moves)."""
    spec = preset_spec("qwen3_next", mamba_ssm_dtype="bfloat16")
    reqs = retraction_requests()
    longest = max(len(r.input_ids) + r.output_len for r in reqs)
    pools = PoolConfig(kv_tokens=4096, mamba_slots=40, max_context_len=longest + 128,
                       max_running_requests=8)
    return ServeSetup(spec=spec, time_model=GpuTimeModel(spec, preset("h200")), pools=pools,
                      sched=SchedulerConfig(max_running_requests=8, schedule_policy="fcfs",
                                            measure_bookkeeping=False, **overlap_kwargs),
                      timestamps=[0.0] * len(reqs))


def records(sched) -> list:
    return [[r.rid, r.hit_len, r.admitted, r.first_token, r.finished, r.aborted,
             r.retractions] for r in sched.records.values()]


def main(trace: str, out_path: str, overlap_kwargs: dict, cli_extra=(),
         cli_caches: str = "stock,marconi+") -> dict:
    out = {}
    cli = json.loads(run_cli(serve_sim, "--trace", trace, *CLI_ARGS,
                             "--caches", cli_caches, *cli_extra))
    out["cli_unified"] = [{k: v for k, v in r.items() if k not in DROP} for r in cli["runs"]]
    for cache in ("stock-python", "marconi+"):
        s, sched = run_serving(cache, retraction_requests(), retraction_setup(overlap_kwargs),
                               rate_scale=0.0)
        out[f"static_retract_{cache}"] = {
            "summary": {k: v for k, v in s.items() if k not in DROP},
            "records": records(sched)}
    if out_path:
        with open(out_path, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
    return out


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], {})
