"""The simulator's ``sglang`` baseline against ``ab``'s stock SGLang on the same bytes
(issue 18's agreement benchmark, ``scripts/bench_baseline_agreement.py``).

Two memory layouts: ``--memory unified`` (one byte buffer, below) and ``--memory static``
(SGLang's default: a KV token pool and a state pool, the static split of ``driver/sizing``;
the simulator gets the same two pools, ``sim_pools``).

``ab --cache-gb G --memory unified --caches stock --per-request`` replays a trace through
SGLang's own ``UnifiedRadixCache`` on one unified buffer sized the way a server sizes it
(``driver/sizing.py``); the simulator's ``sglang`` policy (``policy.stock``) replays the
same requests in one byte budget. ``sim_capacity`` is the budget that
gives both the same bytes: not ``sim --capacity 100GB`` (10**11 bytes; ``--cache-gb`` is in
GiB, and the unified buffer is what is left after SGLang's sizing), but the buffer's whole
KV pages less the state slot 0 SGLang reserves.

The same comparison for marconi+ (``--caches stock,marconi+``, both layouts): ``ab``'s
marconi+ (the ``--cache-policy marconi`` plugin in SGLang's cache objects) against the
simulator's ``marconi+:materialise=sglang:overlap=1`` (``policy.in_sglang``: the plugin's
admission and its walks in the model of SGLang's pools: the joint walk in the unified
buffer, the FULL and MAMBA walks of static pools) on the same bytes.

``compare`` returns both FLOPs-saved fractions (prefill FLOPs of the hits over the prefill
FLOPs of all inputs, the cost model's, the same for both), their difference in percentage
points, the share of requests whose hits are identical, and the requests that differ most.
"""
from __future__ import annotations

from sglang_marconi.policy.stock import StockSGLangCache
from sglang_marconi.sim.policies import build_cache, parse_policy
from marconi_reports.formatting import table, text_table

TARGET_PP = 0.5         # issue 18: within 0.5 percentage points of FLOPs saved
TARGET_IDENTICAL = 0.98  # ... and identical per-request hits for >= 98% of requests


def sim_capacity(sizes) -> int:
    """The simulator's byte budget for ``ab``'s unified buffer (``PoolSizes`` of mode
    "unified"): SGLang's KV side hands out whole pages of the buffer
    (``floor(unified bytes / page bytes)``) and slot 0 of the state side is reserved (one
    state's bytes; ``unified_memory_pool.py``, ``min_slot_index`` 1)."""
    if sizes.mode != "unified":
        raise ValueError("the simulator's one budget models the unified buffer only")
    page_bytes = sizes.page_size * sizes.kv_bytes_per_token
    return sizes.unified_bytes // page_bytes * page_bytes - sizes.state_bytes


def sim_pools(sizes) -> dict:
    """``StockSGLangCache`` keyword arguments that give the simulator ``ab``'s pools
    (``driver.sizing.PoolSizes``): the unified buffer's byte budget (``sim_capacity``), or
    the static split's two pools (``kv_tokens`` KV token slots, ``mamba_slots`` state
    slots: SGLang's ``MambaSlotAllocator`` hands out all of them). ``ab`` runs SGLang's
    default overlap schedule, under which a running request's ping-pong track buffer takes
    2 slots (``allocation_sizing.get_mamba_tracking_slots``), in both layouts."""
    if sizes.mode == "static":
        return {"capacity_bytes": None, "kv_tokens": sizes.kv_tokens,
                "state_slots": sizes.mamba_slots, "tracking_slots": 2}
    return {"capacity_bytes": sim_capacity(sizes), "tracking_slots": 2}


def ab_argv(trace_path, model: str, cache_gb: float, limit: int | None = None,
            chunk: int = 8192, track: int = 256, page: int = 64,
            memory: str = "unified", cache: str = "stock") -> list:
    """The ``ab`` command line (after ``python -m sglang_marconi``) the comparison needs."""
    argv = ["ab", "--trace", str(trace_path), "--model", model, "--cache-gb", f"{cache_gb:g}",
            "--memory", memory, "--caches", cache, "--page-size", str(page),
            "--chunked-prefill-size", str(chunk), "--mamba-track-interval", str(track),
            "--json", "--per-request", "--no-progress"]
    return argv + (["--limit", str(limit)] if limit else [])


def simulate(trace, spec, capacity: int | None, chunk: int = 8192, track: int = 256,
             page: int = 64, *, kv_tokens: int | None = None,
             state_slots: int | None = None, tracking_slots: int = 1):
    """The simulator's ``sglang`` on ``trace``: (hits per request, its ``CacheStats``).
    ``kv_tokens`` and ``state_slots``: the static pools (``capacity`` ignored)."""
    cache = StockSGLangCache(spec, capacity, chunk=chunk, track=track, page=page,
                             kv_tokens=kv_tokens, state_slots=state_slots,
                             tracking_slots=tracking_slots)
    hits = [cache.process(r.input_tokens, r.full_tokens) for r in trace.requests]
    return hits, cache.stats


def marconi_plus_policy(chunk: int = 8192, track: int = 256, page: int = 64,
                        kv_tokens: int | None = None, state_slots: int | None = None) -> str:
    """The simulator's image of ``ab``'s marconi+ (the overlap loop's 2 tracking slots);
    ``kv_tokens`` and ``state_slots``: on SGLang's static pools."""
    pools = f":kv_tokens={kv_tokens}:state_slots={state_slots}" if kv_tokens else ""
    return (f"marconi+:materialise=sglang:chunk={chunk}:page={page}:track={track}:overlap=1"
            + pools)


def simulate_marconi_plus(trace, spec, capacity: int | None, chunk: int = 8192,
                          track: int = 256, page: int = 64, kv_tokens: int | None = None,
                          state_slots: int | None = None, tracking_slots: int = 2):
    """The simulator's ``marconi_plus_policy`` on ``trace``: (hits per request, stats).
    The keywords after ``page`` are ``sim_pools``' (the loop's 2 tracking slots are the
    policy's ``overlap=1``)."""
    policy = marconi_plus_policy(chunk, track, page, kv_tokens, state_slots)
    cache = build_cache(parse_policy(policy), spec, capacity, page, trace)
    hits = [cache.process(r.input_tokens, r.full_tokens) for r in trace.requests]
    return hits, cache.stats


def compare(trace, spec, sim_hits, sim_stats, ab_result: dict, capacity: int | None,
            worst: int = 5, cache: str = "stock") -> dict:
    """Agreement of the simulator's hits with ``ab``'s (``ab --json --per-request``) for
    ``ab``'s ``cache`` (stock or marconi+)."""
    stock = ab_result["caches"][cache]
    ab_hits = stock["hit_tokens_per_request"]
    reqs = trace.requests
    if not (len(ab_hits) == len(sim_hits) == len(reqs)):
        raise ValueError(f"request counts differ: ab {len(ab_hits)}, simulator "
                         f"{len(sim_hits)}, trace {len(reqs)}")
    total = sum(spec.prefill_flops(r.input_len) for r in reqs)
    sim_frac = sum(spec.flops_saved(h, 0) for h in sim_hits) / total
    ab_frac = sum(spec.flops_saved(h, 0) for h in ab_hits) / total
    diffs = [(abs(s - a), i) for i, (s, a) in enumerate(zip(sim_hits, ab_hits)) if s != a]
    diffs.sort(reverse=True)
    identical = len(reqs) - len(diffs)
    pools = ab_result["config"]["pools"]
    return {
        "cache": cache,
        "chunk": ab_result["config"].get("chunked_prefill_size", 8192),
        "track": ab_result["config"].get("mamba_track_interval", 256),
        "requests": len(reqs),
        "capacity_bytes": capacity,
        "pools": pools,
        "sim": {"flops_saved_fraction": sim_frac, "hit_tokens": sum(sim_hits),
                "states_admitted": sim_stats.states_admitted,
                "states_evicted": sim_stats.states_evicted,
                "kv_tokens_evicted": sim_stats.kv_tokens_evicted},
        "ab": {"flops_saved_fraction": ab_frac, "hit_tokens": sum(ab_hits),
               "ab_reported_fraction": stock["flops_saved_fraction"],
               "states_admitted": stock["states_admitted"],
               "states_evicted": stock["states_evicted"],
               "kv_tokens_evicted": stock["kv_tokens_evicted"],
               "tree_core": stock.get("tree_core")},
        "diff_pp": 100 * (sim_frac - ab_frac),
        "identical": identical,
        "identical_fraction": identical / len(reqs) if reqs else 1.0,
        "worst": [{"request": i, "input_len": reqs[i].input_len, "sim_hit": sim_hits[i],
                   "ab_hit": ab_hits[i]} for _, i in diffs[:worst]],
    }


def verdicts(res: dict) -> dict:
    return {"pp": abs(res["diff_pp"]) <= TARGET_PP,
            "identical": res["identical_fraction"] >= TARGET_IDENTICAL}


def _pools_lines(res: dict, cache_gb: float, ab_command: str) -> list:
    p = res["pools"]
    tree_core = res["ab"]["tree_core"] or "tree core ?"
    if p["mode"] == "static":
        policy = (f"sglang:kv_tokens={p['kv_tokens']}:state_slots={p['mamba_slots']}:overlap=1"
                  if res.get("cache", "stock") == "stock" else
                  marconi_plus_policy(res["chunk"], res["track"], p["page_size"],
                                      p["kv_tokens"], p["mamba_slots"]))
        return [
            f"ab: `python -m sglang_marconi {ab_command}` (SGLang's UnifiedRadixCache, "
            f"{tree_core}): static pools, {p['kv_tokens']:,} KV token slots (pages of "
            f"{p['page_size']}) and {p['mamba_slots']:,} state slots.",
            f"simulator: policy `{policy}` (the same two pools; a running request's "
            "ping-pong track buffer takes 2 slots, as in ab's static pools).",
        ]
    cap = res["capacity_bytes"]
    page_bytes = p["page_size"] * p["kv_bytes_per_token"]
    policy = ("`sglang:overlap=1` (a running request holds 2 tracking slots, as under ab's "
              "default overlap schedule)" if res.get("cache", "stock") == "stock" else
              f"`{marconi_plus_policy(res['chunk'], res['track'], p['page_size'])}` "
              "(the plugin's admission and joint walk in the model of SGLang's buffer; "
              "2 tracking slots, as under ab's default overlap schedule)")
    return [
        f"ab: `python -m sglang_marconi {ab_command}` (SGLang's UnifiedRadixCache, "
        f"{tree_core}): one {p['unified_bytes']:,}-byte unified "
        f"buffer ({p['unified_bytes'] // page_bytes:,} KV pages of {p['page_size']} tokens, "
        f"a state = {p['state_bytes'] / p['kv_bytes_per_token']:.2f} KV tokens).",
        f"simulator: policy {policy}, capacity {cap:,} bytes = the buffer's "
        f"{p['unified_bytes'] // page_bytes:,} whole KV pages x {page_bytes:,} bytes less "
        f"SGLang's reserved state slot 0 ({p['state_bytes']:,} bytes); "
        f"`sim --capacity {cap}` (`--capacity {cache_gb:g}GB` would be "
        f"{cache_gb * 1e9:,.0f} bytes: decimal GB, and not the buffer).",
    ]


def format_report(res: dict, *, trace_name: str, model: str, cache_gb: float,
                  ab_command: str, limit: int | None) -> str:
    p = res["pools"]
    sim, ab = res["sim"], res["ab"]
    ok = verdicts(res)
    scope = f"first {res['requests']:,} requests" if limit else f"all {res['requests']:,} requests"
    cache = res.get("cache", "stock")
    sim_name = "sglang" if cache == "stock" else "marconi+:materialise=sglang"
    title = ("Simulator `sglang` vs `ab` stock SGLang" if cache == "stock" else
             "Simulator `marconi+:materialise=sglang` vs `ab` marconi+ (the plugin)")
    lines = [
        f"# {title}: {model}, {cache_gb:g} GiB "
        f"{p.get('mode', 'unified')}, {scope} of {trace_name}",
        "",
        *_pools_lines(res, cache_gb, ab_command),
        "",
        table(("", "FLOPs saved (of prefill)", "hit tokens", "states admitted",
               "states evicted", "KV tokens evicted"),
              [(f"ab {cache}", f"{100 * ab['flops_saved_fraction']:.3f}%", f"{ab['hit_tokens']:,}",
                f"{ab['states_admitted']:,}", f"{ab['states_evicted']:,}",
                f"{ab['kv_tokens_evicted']:,}"),
               (f"simulator {sim_name}", f"{100 * sim['flops_saved_fraction']:.3f}%",
                f"{sim['hit_tokens']:,}", f"{sim['states_admitted']:,}",
                f"{sim['states_evicted']:,}", f"{sim['kv_tokens_evicted']:,}")]),
        "",
        f"- FLOPs saved, simulator - ab: {res['diff_pp']:+.3f} pp "
        f"(target within {TARGET_PP:.1f} pp: {'PASS' if ok['pp'] else 'MISS'})",
        f"- identical per-request hits: {res['identical']:,} / {res['requests']:,} "
        f"({100 * res['identical_fraction']:.2f}%; target >= {100 * TARGET_IDENTICAL:.0f}%: "
        f"{'PASS' if ok['identical'] else 'MISS'})",
    ]
    if res["worst"]:
        lines += ["", "Requests that differ most:", ""]
        lines += text_table((("request", ">9"), ("input", ">9"), ("simulator hit", ">15"),
                             ("ab hit", ">9")),
                            [(w["request"], f"{w['input_len']:,}", f"{w['sim_hit']:,}",
                              f"{w['ab_hit']:,}") for w in res["worst"]])
    return "\n".join(lines)
