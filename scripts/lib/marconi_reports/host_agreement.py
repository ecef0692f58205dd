"""The simulator's stock SGLang with a host tier (``policy.stock_host``) against ``ab``'s
stock SGLang with HiCache on the same pools (``scripts/bench_baseline_agreement.py --hicache-size H``,
``--hicache-write-policy``: write_through or write_through_selective); with ``cache``
"marconi+", the simulator's marconi+ with the host tier and the two-tier rule
(``policy.in_sglang_host``) against ``ab``'s marconi+ (the plugin) with HiCache.

``ab --memory static --hicache-size G --caches stock --per-request`` replays a trace through
SGLang's own ``UnifiedRadixCache`` with its host tier; the simulator's ``sglang`` policy on
the same two device pools (``baseline_agreement.sim_pools``) and the same host pools
(``HostTier``: ``--hicache-size`` split as SGLang splits it) replays the same requests.
``compare`` adds to ``baseline_agreement.compare`` (FLOPs saved, per-request hits) the host
section of both, field by field (``HOST_FIELDS``).
"""
from __future__ import annotations

from sglang_marconi.policy.stock_host import StockHiCache
from marconi_reports import baseline_agreement as agreement
from marconi_reports.formatting import table
from sglang_marconi.sim.policies import HostTier, build_cache, parse_policy

HOST_FIELDS = ("hit_tokens", "flops_saved", "kv_tokens_loaded", "states_loaded",
               "bytes_loaded", "kv_tokens_backed_up", "states_backed_up",
               "kv_tokens_evicted", "states_evicted")


def ab_argv(trace_path, model: str, cache_gb: float, host_gb: float,
            limit: int | None = None, chunk: int = 8192, track: int = 256,
            page: int = 64, write_policy: str = "write_through", cache: str = "stock") -> list:
    """``ab``'s command line (after ``python -m sglang_marconi``): static pools, HiCache
    with ``host_gb`` GB of host memory and ``write_policy``, the one ``cache``."""
    return agreement.ab_argv(trace_path, model, cache_gb, limit, chunk, track, page,
                             memory="static", cache=cache) + [
        "--hicache-size", f"{host_gb:g}", "--hicache-write-policy", write_policy]


def simulate(trace, spec, host_gb: float, *, kv_tokens: int, state_slots: int,
             tracking_slots: int = 2, chunk: int = 8192, track: int = 256, page: int = 64,
             write_policy: str = "write_through", cache: str = "stock"):
    """The simulator's image of ``ab``'s ``cache`` (stock, or marconi+) with ``host_gb`` of
    host tier: (hits, the cache)."""
    tier = HostTier(size_gb=host_gb, write_policy=write_policy)
    if cache == "marconi+":
        policy = agreement.marconi_plus_policy(chunk, track, page, kv_tokens, state_slots)
        sim = build_cache(parse_policy(policy), spec, None, page, trace, tier)
    else:
        sim = StockHiCache(spec, host=tier.pools(spec, kv_tokens, state_slots, page),
                           kv_tokens=kv_tokens, state_slots=state_slots,
                           tracking_slots=tracking_slots, chunk=chunk, track=track, page=page)
    hits = [sim.process(r.input_tokens, r.full_tokens) for r in trace.requests]
    return hits, sim


def compare(trace, spec, hits, cache, ab_result: dict, name: str = "stock") -> dict:
    """``baseline_agreement.compare`` plus both host sections and the host pools, for
    ``ab``'s cache ``name``."""
    res = agreement.compare(trace, spec, hits, cache.stats, ab_result, None, cache=name)
    ab_host = ab_result["caches"][name]["host"]
    sim_host = cache.host_stats.as_dict()
    res["host"] = {"sim": {k: sim_host[k] for k in HOST_FIELDS},
                   "ab": {k: ab_host[k] for k in HOST_FIELDS},
                   "pools": {"sim": [cache.host.kv_tokens, cache.host.state_slots],
                             "ab": [ab_result["config"]["host"]["kv_tokens"],
                                    ab_result["config"]["host"]["state_slots"]]}}
    res["host"]["identical_fields"] = [k for k in HOST_FIELDS
                                       if res["host"]["sim"][k] == res["host"]["ab"][k]]
    return res


def format_report(res: dict, *, title: str, ab_command: str,
                  columns=("ab stock + HiCache", "simulator sglang + host tier")) -> str:
    sim, ab, host = res["sim"], res["ab"], res["host"]
    rows = [("FLOPs saved (of prefill)", f"{100 * ab['flops_saved_fraction']:.3f}%",
             f"{100 * sim['flops_saved_fraction']:.3f}%"),
            ("hit tokens (device + host)", f"{ab['hit_tokens']:,}", f"{sim['hit_tokens']:,}"),
            ("states admitted", f"{ab['states_admitted']:,}", f"{sim['states_admitted']:,}"),
            ("device: states evicted", f"{ab['states_evicted']:,}", f"{sim['states_evicted']:,}"),
            ("device: KV tokens evicted", f"{ab['kv_tokens_evicted']:,}",
             f"{sim['kv_tokens_evicted']:,}")]
    for k in HOST_FIELDS:
        a, s = host["ab"][k], host["sim"][k]
        fmt = "{:.4e}" if isinstance(a, float) or isinstance(s, float) else "{:,}"
        rows.append((f"host: {k}", fmt.format(a), fmt.format(s)))
    return "\n".join([
        f"# {title}", "",
        f"ab: `python -m sglang_marconi {ab_command}`; host pools (KV tokens, states): "
        f"ab's config reports {host['pools']['ab']}, the simulator uses "
        f"{host['pools']['sim']} (as SGLang builds them: pool_host/base.py 226-229, "
        "pool_host/mamba.py 171-174)", "",
        table(("", *columns), rows), "",
        f"- FLOPs saved, simulator - ab: {res['diff_pp']:+.3f} pp",
        f"- identical per-request hits: {res['identical']:,} / {res['requests']:,}",
        f"- identical host fields: {len(host['identical_fields'])} / {len(HOST_FIELDS)}",
    ])
