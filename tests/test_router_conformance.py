"""Conformance: the real sglang-router 0.3.2 binary and ``serving/router.py`` choose the same
worker for every request of a fixed script.

``smg launch`` runs on 127.0.0.1 (free ports, every cache_aware threshold passed
explicitly) in front of three stub workers (``tests/router_stubs.py``). The script
(seeded, 160 requests) mixes ``text`` and ``input_ids`` requests over shared prefixes
(non-ASCII characters included), unrelated prompts, and bursts that pile requests on one
worker so the balance rule fires. Determinism: each arrival waits until a stub has
recorded it (the router increments the load before it forwards), and a completion is the
test releasing that stub's held response and waiting for the client's answer (the router
decrements the load once it has read the worker's body, before it answers), so arrivals
and completions reach the binary in exactly the script's order. The re-implementation is
fed the same sequence, with the workers in the binary's own order (``GET /workers``; the
registry is a hash map keyed by random UUIDs, so that order changes per run).

round_robin is held to the same script; random is not (the binary's RNG is not seeded).
The main script sets the eviction interval to an hour and the cap to 2^26 characters, so
eviction never changes the tree there.

Eviction has its own script (``make_eviction_script``), because its thread fires on the
wall clock (every ``--eviction-interval-secs``, 1 s here) at moments the test cannot
choose. The script makes the moment irrelevant: every text starts with a character no
other text starts with (a leaf of its own under the root, with its own epoch: no ties, and
the 1-in-8 access refresh lands on the root, which is never evicted here); every worker
stays within the cap until the last round, whose long texts push each over it and which
that worker receives no more inserts after; then the test waits 2.5 s (at least two
ticks; a second pass changes nothing), and asks for every surviving text again (no tree
growth: a hit re-inserts a text its worker holds) and then the evicted ones (no match, so
the first worker, whatever is evicted meanwhile). A text the binary evicted but the model
kept (or the reverse) then goes to a different worker. Not covered: ties between equal
epochs (their pop order in the binary depends on a hash order) and eviction racing a
request that changes the same worker's leaves.
"""
from __future__ import annotations

import random
import threading
import time

import pytest

from router_stubs import RouterProcess, StubWorker, http_json, smg_path
from sglang_marconi.serving.router import CacheAwareRouter, RoundRobinRouter, text_for_input_ids

pytestmark = pytest.mark.skipif(smg_path() is None,
                                reason="sglang-router 0.3.2 (smg) is not installed")

N_WORKERS = 3
N_REQUESTS = 160
THRESHOLDS = {"cache_threshold": 0.3, "balance_abs_threshold": 4,
              "balance_rel_threshold": 1.5}
CLI_FLAGS = ["--cache-threshold", "0.3", "--balance-abs-threshold", "4",
             "--balance-rel-threshold", "1.5", "--eviction-interval-secs", "3600",
             "--max-tree-size", str(1 << 26)]
WAIT_S = 10.0


def make_script(seed: int = 21):
    """(requests, steps): requests[i] is a /generate body; steps are ("arrive", i) and
    ("complete", i) in the order the binary must see them."""
    rng = random.Random(seed)
    text_prefixes = ["You are a helpful assistant. Answer briefly. ",
                     "Résumé des documents: le café, l'été, naïve coöperation. ",
                     "日本語のシステムプロンプト：丁寧に答えてください。",
                     "Tool output follows:\n```\n"]
    id_prefixes = [[rng.randrange(1, 50000) for _ in range(rng.randrange(20, 60))]
                   for _ in range(4)]
    requests = []
    for i in range(N_REQUESTS):
        kind = rng.random()
        if kind < 0.4:
            body = {"text": rng.choice(text_prefixes) + f"question {i}: "
                    + "".join(rng.choice("abcdefgh ") for _ in range(rng.randrange(5, 40)))}
        elif kind < 0.85:
            prefix = rng.choice(id_prefixes)
            keep = rng.randrange(len(prefix) // 2, len(prefix) + 1)
            body = {"input_ids": prefix[:keep]
                    + [rng.randrange(1, 50000) for _ in range(rng.randrange(1, 30))]}
        else:                                   # unrelated prompt: the min-load path
            body = {"text": f"{i} unrelated " + "".join(rng.choice("xyz") for _ in range(9))}
        body["rid"] = f"req-{i}"
        body["sampling_params"] = {"max_new_tokens": 1}
        requests.append(body)
    steps, in_flight = [], []
    i = 0
    while i < N_REQUESTS:
        burst = rng.choice([1, 1, 2, 3, 8, 14])      # bursts pile load on one worker
        for _ in range(min(burst, N_REQUESTS - i)):
            steps.append(("arrive", i))
            in_flight.append(i)
            i += 1
        for _ in range(rng.randrange(0, len(in_flight) + 1) if rng.random() < 0.6 else 0):
            j = in_flight.pop(rng.randrange(len(in_flight)))
            steps.append(("complete", j))
    steps.extend(("complete", j) for j in in_flight)
    return requests, steps


EVICT_CAP = 120        # --max-tree-size of the eviction script (characters per worker)


def make_eviction_script(rounds: int = 8):
    """(requests, steps, quiet): phase A fills each worker to within EVICT_CAP, its last
    round overflows every worker; ("evict", None) waits for the eviction thread; phase B
    asks again. ``quiet`` lists the arrivals after which no worker may exceed the cap."""
    requests, steps, quiet = [], [], set()

    def body(k: int, length: int) -> dict:
        text = chr(0x4E00 + k) + "".join(chr(ord("a") + (k * 7 + j) % 26)
                                         for j in range(length - 1))
        return {"text": text, "rid": f"evict-{len(requests)}",
                "sampling_params": {"max_new_tokens": 1}}

    for r in range(rounds):              # three arrivals per round: one per worker
        last = r == rounds - 1
        ids = []
        for _ in range(N_WORKERS):
            k = len(requests)
            requests.append(body(k, 60 if last else 8 + (k * 5) % 13))
            ids.append(k)
            steps.append(("arrive", k))
            if not last:
                quiet.add(k)
        steps.extend(("complete", k) for k in ids)
    steps.append(("evict", None))
    for k in range(len(requests)):       # phase B: every text again, one at a time
        again = dict(requests[k], rid=f"again-{k}")
        requests.append(again)
        steps.extend([("arrive", len(requests) - 1), ("complete", len(requests) - 1)])
    return requests, steps, quiet


def request_text(body) -> str:
    return body["text"] if "text" in body else text_for_input_ids(body["input_ids"])


def wait_until(predicate, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found is not None:
            return found
        time.sleep(0.002)
    raise AssertionError(f"timed out waiting for {what}")


def replay_through_binary(router: RouterProcess, workers, order, requests, steps):
    """Run the script through the binary; returns the chosen worker index per request."""
    by_url = {w.url: w for w in workers}
    chosen, threads, answers = {}, {}, {}

    def post(i):
        answers[i] = http_json(router.url + "/generate", requests[i], timeout=WAIT_S * 3)

    for action, i in steps:
        if action == "evict":
            time.sleep(2.5)              # at least two ticks of a 1 s eviction thread
            continue
        rid = requests[i]["rid"]
        if action == "arrive":
            threads[i] = threading.Thread(target=post, args=(i,), daemon=True)
            threads[i].start()
            chosen[i] = wait_until(
                lambda: next((k for k, url in enumerate(order)
                              if rid in by_url[url].rids()), None), f"{rid} at a worker")
        else:
            by_url[order[chosen[i]]].release(rid)
            threads[i].join(WAIT_S)
            assert i in answers, f"no answer for {rid}"
    return [chosen[i] for i in range(len(requests))]


def replay_through_model(model, requests, steps, track_load: bool):
    loads = [0] * N_WORKERS
    chosen, rules, ambiguous = {}, {}, 0
    for action, i in steps:
        if action == "evict":
            model.tree.evict_tenant_by_size(model.max_tree_size)
        elif action == "arrive":
            decision = model.route(request_text(requests[i]), loads)
            chosen[i], rules[i] = decision.worker, decision.rule
            ambiguous += decision.ambiguous
            if track_load:
                loads[decision.worker] += 1
        elif track_load:
            loads[chosen[i]] -= 1
    return [chosen[i] for i in range(len(requests))], rules, ambiguous


@pytest.fixture
def stub_workers():
    workers = [StubWorker() for _ in range(N_WORKERS)]
    yield workers
    for w in workers:
        w.stop()


@pytest.mark.parametrize("policy", ["cache_aware", "round_robin"])
def test_real_router_and_reimplementation_choose_the_same_worker(policy, stub_workers,
                                                                 tmp_path):
    requests, steps = make_script()
    router = RouterProcess([w.url for w in stub_workers], policy,
                           CLI_FLAGS if policy == "cache_aware" else [],
                           log_path=tmp_path / "smg.log")
    try:
        order = router.wait_ready(N_WORKERS)
        real = replay_through_binary(router, stub_workers, order, requests, steps)
        assert sum(router.loads().values()) == 0       # every in-flight count came back
    finally:
        router.stop()
    if policy == "cache_aware":
        model = CacheAwareRouter(order, **THRESHOLDS, eviction_interval_secs=3600)
    else:
        model = RoundRobinRouter(order)
    mine, rules, ambiguous = replay_through_model(model, requests, steps,
                                                  track_load=policy == "cache_aware")
    mismatches = [(i, real[i], mine[i], rules[i]) for i in range(N_REQUESTS)
                  if real[i] != mine[i]]
    assert not mismatches, f"{len(mismatches)} of {N_REQUESTS} differ (i, real, mine, rule): " \
                           f"{mismatches[:10]}"
    assert ambiguous == 0
    counts = {rule: list(rules.values()).count(rule) for rule in sorted(set(rules.values()))}
    print(f"\n{policy}: {N_REQUESTS - len(mismatches)} of {N_REQUESTS} requests on the same "
          f"worker as the binary; rules {counts}")
    if policy == "cache_aware":                # the script exercises all three rules
        used = {rule for rule in rules.values()}
        assert {"balance", "cache_hit", "min_load"} <= used, used
        assert len(set(real)) == N_WORKERS


def test_eviction_matches_the_real_router(stub_workers, tmp_path):
    requests, steps, quiet = make_eviction_script()
    phase_a = len(requests) // 2
    # the premise: until the last round no worker exceeds the cap, so an eviction tick
    # then changes nothing; phase B's hits add no characters
    probe = CacheAwareRouter([w.url for w in stub_workers], **THRESHOLDS,
                             max_tree_size=EVICT_CAP)
    loads = [0] * N_WORKERS
    for action, i in steps:
        if action == "arrive" and i < phase_a:
            loads[probe.route(request_text(requests[i]), loads).worker] += 1
            if i in quiet:
                assert max(probe.tree.tenant_char_count.values()) <= EVICT_CAP
        elif action == "complete" and i < phase_a:
            loads = [0] * N_WORKERS
    assert all(size > EVICT_CAP for size in probe.tree.tenant_char_count.values())

    flags = ["--cache-threshold", "0.3", "--balance-abs-threshold", "4",
             "--balance-rel-threshold", "1.5", "--eviction-interval-secs", "1",
             "--max-tree-size", str(EVICT_CAP)]
    router = RouterProcess([w.url for w in stub_workers], "cache_aware", flags,
                           log_path=tmp_path / "smg.log")
    try:
        order = router.wait_ready(N_WORKERS)
        real = replay_through_binary(router, stub_workers, order, requests, steps)
    finally:
        router.stop()
    model = CacheAwareRouter(order, **THRESHOLDS, max_tree_size=EVICT_CAP)
    mine, rules, ambiguous = replay_through_model(model, requests, steps, track_load=True)
    assert real == mine, [(i, real[i], mine[i], rules[i]) for i in range(len(real))
                          if real[i] != mine[i]]
    assert ambiguous == 0
    hits = [rules[i] for i in range(phase_a, len(requests))].count("cache_hit")
    evicted = len(requests) - phase_a - hits
    print(f"\neviction: {len(requests)} of {len(requests)} requests on the same worker as "
          f"the binary; asked again: {hits} found, {evicted} evicted")
    assert hits > 0 and evicted >= N_WORKERS * 3          # several leaves per worker went
