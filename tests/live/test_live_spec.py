"""Speculative decoding (NGRAM) with ``--cache-policy marconi`` on SGLang's real server (CPU).

One server: Qwen3-Next, extra_buffer, ``--speculative-algorithm NGRAM
--speculative-num-draft-tokens 4`` with NGRAM's default tree breadth, forward replaced
(docs/live_server.md). SGLang runs speculative decoding in the normal loop on CPU
(``arg_groups/speculative_hook.py`` ``_disable_overlap_schedule_for_cpu``). Each decode step
is a TARGET_VERIFY forward over the drafts; SGLang's verify path (``ngram_worker.py``,
``spec_utils.py``: ``prepare_mamba_track_for_verify``, ``commit_mamba_states_after_verify``,
``move_accept_tokens_to_target_kvcache``) runs on the test kit's torch versions of its CPU
ops (``cpu_shims/marconi_cpu_testkit/spec_kernels.py``). The replaced forward answers a
verify row with the letter a plain decode gives at that position, so the drafts NGRAM
proposes from earlier output are accepted several at a time and the accepted lengths vary.
What is asserted comes from the server: the letters, ``spec_verify_ct``, ``cached_tokens``
where the cache keeps states (chunk, branch, decode-track snapshots whose positions move
with the accepted lengths), the same hits as ``ab``'s one-token-a-step replay of the
stream, the hit counter, and SGLang's idle leak check in the log.
"""
from __future__ import annotations

import pytest

from live_configs import server_args
from server import LiveServer
from streams import (KV_TOKENS, MAMBA_SLOTS, MAX_RUNNING, TRACK_INTERVAL, disconnect_mid_stream,
                     replay_hits, run_stream)
from tiny_models import write_tiny_model

DRAFT_TOKENS = 4
NGRAM = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens",
         str(DRAFT_TOKENS)]


def letter(position: int) -> int:
    """The token the replaced forward puts at ``position`` (docs/live_server.md)."""
    return ord("a") + position % 26


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory):
    model = write_tiny_model(tmp_path_factory.mktemp("spec") / "qwen3_next", "qwen3_next")
    server = LiveServer(model, [*server_args("qwen3_next", "extra_buffer", "marconi"), *NGRAM],
                        max_total_tokens=KV_TOKENS, mamba_slots=MAMBA_SLOTS,
                        max_running=MAX_RUNNING).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def record(spec_server):
    return run_stream(spec_server.generate)


def test_server_runs_ngram_with_the_marconi_cache(spec_server):
    info = spec_server.server_info()
    assert info["speculative_algorithm"] == "NGRAM"
    assert info["speculative_num_draft_tokens"] == DRAFT_TOKENS
    assert info["radix_cache_backend"] == "marconi"
    assert info["mamba_radix_cache_strategy"] == "extra_buffer"
    assert info["disable_overlap_schedule"] is True  # SGLang's rule for spec on CPU
    log = spec_server.log_text()
    assert "impl=MarconiUnifiedRadixCache" in log
    assert "Marconi cache: SGLang's pools hold" in log
    assert "differ from the cost model" not in log


def test_verified_drafts_are_the_tokens_a_plain_decode_gives(spec_server, record):
    for s in record.steps:
        start = len(s.input_ids)
        assert s.output_ids == [letter(start + j) for j in range(len(s.output_ids))], s.name
    # drafts were accepted several at a time: fewer verify forwards than tokens
    r = spec_server.generate(record.by_name("turn-1").input_ids, 150)
    meta = r["meta_info"]
    assert meta["completion_tokens"] == 150
    assert meta["spec_verify_ct"] < 150 // 2, meta
    assert meta["spec_accept_length"] > 2.0, meta


def test_stream_hits_where_the_cache_keeps_states(record):
    assert record.by_name("shared-1").cached_tokens == 0
    assert record.by_name("shared-2").cached_tokens == 256      # the chunk state
    assert record.by_name("shared-3").cached_tokens == 320      # the branch state
    assert record.by_name("doc-prefix").cached_tokens == 512    # inside a long prompt
    t1, t2 = record.by_name("turn-1"), record.by_name("turn-2")
    # turn-1 decoded 150 tokens a few at a time past a decode-track boundary (every 128
    # tokens of sequence): turn-2 resumes at a snapshot no earlier than turn-1's prompt
    # state, at most at the last boundary turn-1 crossed
    crossed = (len(t1.input_ids) + len(t1.output_ids) - 1) // TRACK_INTERVAL * TRACK_INTERVAL
    assert len(t1.input_ids) // 64 * 64 <= t2.cached_tokens <= crossed
    assert t2.cached_tokens % 64 == 0


def test_hits_equal_the_one_token_a_step_replay(spec_server, record, tmp_path):
    """Decode-track snapshots land on the same grid points whatever the accepted lengths:
    ``ab`` (one token a decode step, the server's pools and settings) hits the same."""
    replayed = replay_hits(spec_server, record, tmp_path, "marconi")
    diff = [(s.name, s.cached_tokens, h) for s, h in zip(record.steps, replayed)
            if s.cached_tokens != h]
    assert not diff, f"(request, live, replay) {diff}"


def test_hit_counter_and_idle_leak_check(spec_server, record):
    """The Marconi hit counter is the sum of the stream's hits; clients that hang up
    mid-stream, then an idle round: SGLang's leak check (KV, state slots, request slots,
    ``scheduler_components/invariant_checker.py``) stays silent."""
    assert spec_server.wait_idle()
    hits = spec_server.metric("sglang:marconi_hit_tokens_total")
    assert hits >= sum(record.hits()) > 0
    log = disconnect_mid_stream(spec_server, first_token=20, clients=3, max_new_tokens=300)
    assert "leak" not in log and "traceback" not in log, log[-3000:]
