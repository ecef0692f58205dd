"""The ``marconi`` router (scripts/lib/marconi_routing/cost_routers.py) rule by rule: reuse truncated to the
checkpoints it knows were created (request ends, chunk ends, branch points), corrected by
the cached-token count each response reports, FLOPs saved against queued prefill FLOPs,
cache_aware's balance guard, ties (the least queued, then the fewest in flight, then the
lowest index), bounded records, determinism. The oracle tests (read-only walk) and the CLI
rows are in tests/test_cluster_routers.py."""
from __future__ import annotations

import pytest

import marconi_routing.cost_routers as router_marconi
from marconi_routing.cost_routers import MarconiRouter, block_hashes
from sglang_marconi.errors import UserError

W = ["w0", "w1", "w2"]
OUT = [7, 8]                       # two output tokens: no decode-track snapshot


def ids(start: int, n: int) -> list:
    return list(range(start, start + n))


def router(spec, chunk=8192, kv_tokens=1 << 20, slots=1000, load_penalty=1.0,
           branch_weight=0.0, **options):
    """The plain rule (TTFT-greedy penalty, today's reuse only) unless told otherwise."""
    return MarconiRouter(W, spec, kv_tokens=kv_tokens, state_slots=slots, page_size=64,
                         chunked_prefill_size=chunk, mamba_track_interval=256,
                         load_penalty=load_penalty, branch_weight=branch_weight, **options)


def serve(r, rid, tokens, loads=(0, 0, 0), cached=None):
    """Route, then complete with ``cached`` tokens reported (default: what it believed)."""
    d = r.route_request(rid, tokens, list(loads))
    r.prefill_done(rid)
    r.complete(rid, d.believed_tokens if cached is None else cached, OUT)
    return d


def test_block_hashes_are_chained_prefix_hashes():
    a, b = block_hashes(ids(0, 200), 64), block_hashes(ids(0, 150) + [-1] * 50, 64)
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]
    assert block_hashes(ids(0, 200), 64, limit=127) == a[:1]


def test_reuse_is_truncated_to_the_checkpoints_it_knows(paper_spec):
    r = router(paper_spec)
    a = ids(0, 1000)
    d = serve(r, "a", a)
    assert (d.worker, d.believed_tokens, d.rule) == (0, 0, "flops_load")
    # a's prefill snapshot: its end on the 64-grid (960); a request sharing 700 tokens
    # matches 640 tokens of KV there but no state: nothing reusable yet
    b = a[:700] + ids(10_000, 300)
    assert r.reusable(0, b) == (0, 640)
    serve(r, "b", b)          # b leaves a at 700: SGLang snapshots the branch point 640
    c = a[:700] + ids(20_000, 300)
    d = r.route_request("c", c, [0, 0, 0])
    assert (d.worker, d.believed_tokens, d.rule) == (0, 640, "flops_hit")
    assert r.reusable(1, c) == (0, 0)
    # the request end: a repeat of a (key capped at 999 tokens) reuses the state at 960
    assert r.reusable(0, a + [5])[0] == 960


def test_feedback_drops_states_the_replica_did_not_have_and_replans(paper_spec):
    r = router(paper_spec, chunk=256)
    a = ids(0, 1000)
    serve(r, "a", a)          # chunk snapshots 256, 512, 768 and the end 960
    assert [r.reusable(0, a[:n] + [-1] * 10)[0] for n in (300, 600, 900)] == [256, 512, 768]
    a2 = a + ids(50_000, 600)
    d = r.route_request("a2", a2, [0, 0, 0])
    assert d.believed_tokens == 960
    r.complete("a2", 128, OUT)   # the replica reused only 128: the others were evicted
    assert r.corrections["dropped"] == 4
    # re-planned from the real hit 128: chunks 128-384-640-896, the branch point 960
    # (where a2 left a), then 1408 and the end 1600 (input 1600)
    assert [r.reusable(0, a[:n] + [-1] * 10)[0] for n in (200, 300, 600, 900)] == \
        [128, 128, 384, 896]
    assert r.reusable(0, a2 + [1])[0] == 1600


def test_feedback_adds_a_state_it_did_not_know(paper_spec):
    r = router(paper_spec)
    a = ids(0, 1000)
    r.route_request("a", a, [0, 0, 0])
    r.complete("a", 0, OUT)
    x = a[:300] + ids(30_000, 100)
    d = r.route_request("x", x, [0, 0, 0])
    assert d.believed_tokens == 0
    r.complete("x", 256, OUT)   # the replica had a state at 256 (another router's request)
    assert r.corrections["added"] == 1
    assert r.reusable(0, a[:300] + [-2] * 5)[0] == 256


def test_marconi_plus_replicas_are_believed_only_their_branch_and_chunk_states(paper_spec):
    a = ids(0, 1000)
    b = a[:700] + ids(10_000, 300)
    stock, plus = router(paper_spec), router(paper_spec, admission="marconi+")
    for r in (stock, plus):
        serve(r, "a", a)
        serve(r, "b", b)
    # the end of a's prompt (960) is an end-state candidate marconi+ may refuse; the
    # branch point b planted (640) is admitted by both
    assert stock.reusable(0, a + [1])[0] == 960
    assert plus.reusable(0, a + [1])[0] == 640
    assert plus.reusable(0, a[:700] + [-1])[0] == 640
    with pytest.raises(UserError, match="admission rule"):
        router(paper_spec, admission="lru")


def test_queued_prefill_flops_are_the_load_penalty(paper_spec):
    r = router(paper_spec)
    a = ids(0, 4096)
    serve(r, "a", a)                                          # state at 4096 on w0
    r.route_request("q", ids(100_000, 8000), [0, 0, 0])        # w1? no: w0 ties lowest
    # q went to w0 (all idle, lowest index): its 8000-token prefill is queued there
    assert r.in_flight["q"].replica == 0 and r.queued_flops(0) > 0
    saved = paper_spec.flops_saved(4096)
    assert r.queued_flops(0) > saved                         # waiting costs more than reuse
    d = r.route_request("a'", a + [1], [1, 0, 0])
    assert (d.worker, d.rule, d.believed_tokens) == (1, "flops_load", 0)
    r.prefill_done("q")                                       # its first token came back
    assert r.queued_flops(0) == 0
    d = r.route_request("a''", a + [2], [2, 1, 0])
    assert (d.worker, d.rule, d.believed_tokens) == (0, "flops_hit", 4096)
    # without a penalty the reuse wins even behind a queue
    r0 = router(paper_spec, load_penalty=0.0)
    serve(r0, "a", a)
    r0.route_request("q", ids(100_000, 8000), [0, 0, 0])
    assert r0.route_request("a'", a + [1], [1, 0, 0]).worker == 0


def test_branch_weight_values_the_branch_point_a_request_would_plant(paper_spec):
    a = ids(0, 1000)
    b = a[:700] + ids(10_000, 300)           # leaves a at 700: branch point 640 on w0
    for weight, expected in ((0.0, 1), (1.0, 0)):
        r = router(paper_spec, branch_weight=weight)
        serve(r, "a", a)
        r.route_request("q", ids(100_000, 64), [0, 0, 0])   # a small prefill queued on w0
        assert r.reusable(0, b) == (0, 640)
        d = r.route_request("b", b, [1, 0, 0])
        assert d.worker == expected and d.believed_tokens == 0
        if weight:
            assert r.score(0, 0, 640, len(b)) == pytest.approx(
                paper_spec.flops_saved(640) - r.queued_flops(0))


def test_balance_guard_is_cache_aware_s(paper_spec):
    r = router(paper_spec, balance_abs_threshold=4, balance_rel_threshold=1.5)
    a = ids(0, 2048)
    serve(r, "a", a)
    d = r.route_request("a1", a + [1], [9, 4, 6])   # 9 - 4 > 4 and 9 > 6: balance
    assert (d.worker, d.rule, d.believed_tokens) == (1, "balance", 0)
    d = r.route_request("a2", a + [2], [8, 4, 6])   # 8 - 4 = 4: not imbalanced
    assert (d.worker, d.rule) == (0, "flops_hit")


def test_ties_go_to_the_lowest_index_and_runs_are_deterministic(paper_spec):
    def stream(r):
        out = []
        for i in range(12):
            tokens = ids(1000 * (i % 3), 700 + 64 * i)
            d = r.route_request(f"r{i}", tokens, [i % 2, 0, 1])
            if i % 2:
                r.prefill_done(f"r{i}")
            if i % 3 == 2:
                r.complete(f"r{i - 1}", (i * 64) % 512, OUT)
            out.append((d.worker, d.rule, d.believed_tokens))
        return out

    first = stream(router(paper_spec))
    assert first == stream(router(paper_spec))
    assert first[0] == (0, "flops_load", 0)
    assert len({w for w, _, _ in first}) > 1


def test_records_are_bounded_by_the_replica_s_pools(paper_spec):
    r = router(paper_spec, kv_tokens=64 * 20, slots=3)
    for i in range(10):
        serve(r, f"r{i}", ids(10_000 * i, 640), loads=(0, 0, 0))
    rec = r.records[0]
    assert len(rec.blocks) <= 20 and len(rec.states) <= 3
    assert all(h in rec.blocks for h in rec.states.keys)


def test_bad_options_are_user_errors(paper_spec):
    with pytest.raises(UserError, match="--router-load-penalty"):
        router(paper_spec, load_penalty=-1)
    with pytest.raises(UserError, match="--router-branch-weight"):
        router(paper_spec, branch_weight=float("nan"))


def test_ties_go_to_the_least_queued_then_the_fewest_in_flight(paper_spec):
    r = router(paper_spec, load_penalty=0.0)   # every score is 0 without reuse: all tie
    d = r.route_request("a", ids(0, 2000), [0, 0, 0])
    assert d.worker == 0                       # nothing queued anywhere: the lowest index
    d = r.route_request("b", ids(10_000, 500), [1, 0, 0])
    assert d.worker == 1                       # replica 0 has a's prefill queued
    r.prefill_done("a"), r.prefill_done("b")   # nothing queued: the fewest in flight
    assert r.route_request("c", ids(20_000, 500), [1, 1, 0]).worker == 2


def test_affinity_threshold_is_cache_awares_rule_in_flops(paper_spec):
    r = router(paper_spec, branch_weight=1.0, affinity_threshold=0.3)
    a = ids(0, 1000)
    serve(r, "a", a)
    serve(r, "b", a[:700] + ids(10_000, 300))          # plants the branch state at 640 on w0
    assert r.route_request("q", ids(100_000, 8000), [0, 1, 1]).worker == 0   # all idle
    assert r.queued_flops(0) > 0                        # q's prefill is queued on w0
    # c saves F(640) of F(1000) on w0 (> 0.3): it goes there, however long w0's queue
    c = r.route_request("c", a[:700] + ids(20_000, 300), [1, 0, 0])
    assert (c.worker, c.rule, c.believed_tokens) == (0, "affinity", 640)
    # d shares one 64-token block with a (far below 0.3 of its prefill): the least queued
    d = r.route_request("d", a[:64] + ids(30_000, 2000), [2, 0, 1])
    assert (d.worker, d.rule) == (1, "flops_load")
    with pytest.raises(UserError, match="--router-affinity-threshold"):
        router(paper_spec, affinity_threshold=1.5)


def test_owner_memory_outlives_the_replica_s_kv_record(paper_spec):
    """A family whose KV the record believes evicted goes back to the replica it was sent
    to (rule ``owner``) when that prefix is above the threshold x its tokens; with the
    owner memory off, to the least queued replica."""
    routed = {}
    for owner_tokens in (1 << 26, 0):
        r = router(paper_spec, kv_tokens=64 * 20, branch_weight=1.0, affinity_threshold=0.3,
                   owner_tokens=owner_tokens)
        a = ids(0, 1000)
        serve(r, "a", a)                                    # w0 (all idle)
        for i in range(3):                                  # push a out of w0's KV record
            serve(r, f"x{i}", ids(100_000 * (i + 1), 640))
        assert r.reusable(0, a[:700] + ids(10_000, 300)) == (0, 0)
        r.route_request("q", ids(900_000, 4000), [0, 0, 0])   # w0 busy: q queued there
        d = r.route_request("b", a[:700] + ids(10_000, 300), [1, 0, 0])
        routed[owner_tokens] = (d.worker, d.rule)
        # a prefix below the threshold (one block of 1000) never uses the owner memory
        e = r.route_request("e", a[:64] + ids(20_000, 936), [1, 1, 0])
        assert e.rule == "flops_load"
    assert routed == {1 << 26: (0, "owner"), 0: (1, "flops_load")}
    with pytest.raises(UserError, match="--router-owner-tokens"):
        router(paper_spec, owner_tokens=-1)


def test_owner_memory_is_bounded(paper_spec):
    r = router(paper_spec, affinity_threshold=0.3, owner_tokens=64 * 10)
    for i in range(5):
        serve(r, f"r{i}", ids(10_000 * i, 640))
    assert all(len(owned) <= 10 for owned in r.owners)


def test_a_routing_call_hashes_the_request_once(paper_spec, monkeypatch):
    """Every record lookup of one call (each replica's record, the owner memory, the
    chosen replica's update) reuses one hashing of the request's blocks."""
    calls = []

    def counting(ids, grid, limit=None):
        calls.append(len(ids))
        return block_hashes(ids, grid, limit)

    monkeypatch.setattr(router_marconi, "block_hashes", counting)
    r = router(paper_spec, affinity_threshold=0.3)
    r.route_request("a", ids(0, 5000), [0, 0, 0])
    assert calls == [5000]
