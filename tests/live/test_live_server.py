"""SGLang's real HTTP server on CPU (forward replaced), stock vs marconi vs the paper's rule.

Every test runs against each configuration of ``conftest.CONFIGS`` (Qwen3-Next and
Nemotron-H; no_buffer with the normal loop, extra_buffer with SGLang's default overlap
loop; stock, ``--cache-policy marconi`` with default flags, and with the paper's ranking
(``--marconi-alpha 1``: ``marconi-alpha``, under extra_buffer), one server per
configuration. What is asserted comes from the server: ``meta_info.cached_tokens``, the
OpenAI ``usage``, ``/metrics``, the server's log (SGLang's own idle leak check).
"""
from __future__ import annotations

import pytest

from live_configs import page_size
from server import AB_CACHES, LEARNED_ADMISSION
from streams import (CHUNKED_PREFILL, KV_TOKENS, MAMBA_SLOTS, TRACK_INTERVAL,
                     disconnect_mid_stream, replay_hits, run_stream)

GRID = 64  # the checkpoint grid: lcm(FLA / Mamba2 chunk 64, page 1 or 16)


def _replay(cfg, server, record, tmp_path) -> list:
    """``sglang_marconi ab`` on the recorded stream with the server's own settings."""
    return replay_hits(server, record, tmp_path, *AB_CACHES[cfg[2]])


def test_server_runs_the_configuration(live):
    (model, buffer, policy), server = live
    info = server.server_info()
    assert info["mamba_radix_cache_strategy"] == buffer
    assert info["disable_overlap_schedule"] == (buffer == "no_buffer")
    assert info["radix_cache_backend"] == ("marconi" if policy != "stock" else None)
    assert (info["max_total_num_tokens"], info["max_mamba_cache_size"]) == (KV_TOKENS,
                                                                          MAMBA_SLOTS)
    assert (info["chunked_prefill_size"], info["mamba_track_interval"],
            info["page_size"]) == (CHUNKED_PREFILL, TRACK_INTERVAL, page_size(model, buffer))
    log = server.log_text()
    if policy == "stock":
        assert "impl=UnifiedRadixCache" in log
    else:
        assert "impl=MarconiUnifiedRadixCache" in log
        assert "policy=marconi" in log
        assert ("paper's ranking, alpha 1" in log) == (policy == "marconi-alpha")
        # the cost model's bytes are the ones SGLang's pools hold
        assert "Marconi cache: SGLang's pools hold" in log
        assert "differ from the cost model" not in log


def test_scripted_stream_hits_where_the_cache_keeps_states(live, farm):
    cfg, server = live
    _, buffer, policy = cfg
    rec = run_stream(server.generate)
    farm.records[cfg] = rec
    for s in rec.steps:
        assert 0 <= s.cached_tokens < len(s.input_ids), s
    assert rec.by_name("shared-1").cached_tokens == 0
    # the second sight of the system prompt: the chunk state at 256 (no_buffer, and
    # extra_buffer's first chunk); the third: extra_buffer's branch state at 320
    assert rec.by_name("shared-2").cached_tokens == 256
    assert rec.by_name("shared-3").cached_tokens == (320 if buffer == "extra_buffer" else 256)
    # a long prompt in chunks of 256: a request resuming inside it hits the chunk state
    assert rec.by_name("doc-prefix").cached_tokens == 512
    # continuations hit the previous turn (prompt + output)
    t1, t2 = rec.by_name("turn-1"), rec.by_name("turn-2")
    if buffer == "no_buffer":
        assert t2.cached_tokens == len(t1.input_ids) + len(t1.output_ids) - 1
    elif policy not in LEARNED_ADMISSION:
        # extra_buffer publishes the last decode-track snapshot (grid 128)
        end = len(t1.input_ids) + len(t1.output_ids) - 1
        assert t2.cached_tokens == end // TRACK_INTERVAL * TRACK_INTERVAL
    assert t2.cached_tokens >= len(t1.input_ids) // GRID * GRID - GRID


def test_live_hits_equal_the_replay(live, farm, tmp_path):
    """The check every CPU number rests on: the same token stream through ``ab`` (SGLang's
    cache objects driven with the scheduler's calls, one request at a time) and through
    the live server gives the same ``cached_tokens`` for every request."""
    cfg, server = live
    rec = farm.records.get(cfg)
    if rec is None:
        pytest.skip("the scripted stream did not run on this server")
    replayed = _replay(cfg, server, rec, tmp_path)
    names = [s.name for s in rec.steps]
    diff = [(n, a, b) for n, a, b in zip(names, rec.hits(), replayed) if a != b]
    assert not diff, f"live vs ab ({'/'.join(cfg)}): (request, live, replay) {diff}"


def test_chat_continuation_reports_cached_tokens(live):
    """OpenAI chat: the second turn carries the first one's answer; ``usage`` reports the
    cached prompt tokens (the outputs are text that re-tokenizes to the same ids)."""
    (_, buffer, policy), server = live
    msgs = [{"role": "user", "content": "Summarise the following notes. " + "note " * 90}]

    def chat(messages):
        r = server.post("/v1/chat/completions", {"model": "tiny", "messages": messages,
                                                 "max_tokens": 24, "temperature": 0})
        r.raise_for_status()
        return r.json()

    first = chat(msgs)
    answer = first["choices"][0]["message"]["content"]
    assert answer and answer.isascii()
    msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": "more"}]
    second = chat(msgs)
    p1, c1 = first["usage"]["prompt_tokens"], first["usage"]["completion_tokens"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    if buffer == "no_buffer":  # the end state: prompt + answer minus its last token
        assert cached == p1 + c1 - 1
        return
    # extra_buffer: the last snapshot of the first turn: a decode-track one (every 128
    # tokens of sequence) if the answer crossed one, else the prompt's grid-floored end,
    # which the last prefill chunk published (what learned admission keeps at least)
    track = (p1 + c1 - 1) // TRACK_INTERVAL * TRACK_INTERVAL
    prompt_state = p1 // GRID * GRID
    if policy in LEARNED_ADMISSION:
        assert cached >= prompt_state
    else:
        assert cached == (track if track > p1 else prompt_state)


def test_metrics_series(live):
    (_, _, policy), server = live
    text = server.get("/metrics").text
    assert "sglang:cache_hit_rate" in text or "sglang:num_requests_total" in text
    if policy == "stock":
        assert "sglang:marconi_" not in text
        return
    assert server.metric("sglang:marconi_hit_tokens_total") > 0
    assert server.metric("sglang:marconi_flops_saved_total") > 0
    assert "sglang:marconi_lost_reuse_tokens_total" in text  # KV matched past the hit


def test_flush_cache_empties_the_tree(live):
    (_, _, _), server = live
    ids = [7] * 200 + [8] * 100
    server.generate(ids, 4)
    server.generate(ids, 4)
    assert server.flush_cache(), "flush_cache kept answering 400 on an idle server"
    assert server.generate(ids, 4)["meta_info"]["cached_tokens"] == 0


def test_clients_that_disconnect_mid_stream_leak_nothing(live):
    """Streaming clients that hang up mid-generation; once the server is idle, SGLang's
    own leak check (KV, state slots, request slots) runs and must stay silent."""
    (_, _, _), server = live
    log = disconnect_mid_stream(server, first_token=11, clients=4, max_new_tokens=400)
    assert "leak" not in log and "traceback" not in log, log[-3000:]
