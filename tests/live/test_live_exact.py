"""Cached outputs equal uncached ones through SGLang's own Qwen3-Next and Nemotron-H
code (live, CPU).

For each model (one after the other), one server per configuration (``exact_live``): the
reference with ``--disable-radix-cache`` first, then stock / marconi / marconi-alpha under
no_buffer (overlap off), extra_buffer (overlap on) and extra_buffer with overlap off, then
the negative control; each gets the reference's inputs in order. Qwen3-Next runs three of
the nine configurations (each buffer and loop, each policy once) and Nemotron-H two unless
``MARCONI_LIVE_EXACT=full`` (``exact_live.QUICK_CONFIGS``: the time budget of ``make
test``; ``verify-exact --live`` runs all nine, and marconi with NGRAM speculative
decoding, ``exact_live.SPEC``). A configuration passes when the scripted resumes really happened
(``cached_tokens`` at the chunk, branch, decode-track and end states) and every output
token equals the reference's where its top-1 lead is clear, with logprobs within a
relative 1e-4. With ``--enable-int8-mamba-checkpoint`` (Qwen3-Next here, both models in
``verify-exact --live``) every hit must resume from a state bitwise equal to SGLang's int8
round trip of the stored one (the test kit's audit), within the int8 rounding's tolerance.
"""
from __future__ import annotations

import math
from functools import partial

import pytest

import exact_live as ex
from farm import ServerFarm
from tiny_models import VOCAB

# the int8 scenario runs on Qwen3-Next in make test (both models in verify-exact --live)
INT8_MODELS = ("qwen3_next",)


def _start(model_path, model, cfg):
    return ex.server_for(model_path, cfg, model).start()


@pytest.fixture(scope="module", params=ex.MODELS)
def exact_farm(request, tmp_path_factory):
    """(model, farm): the model's reference, the configurations it is checked on
    (``ex.checked_configs``) and the negative control, one server each, in that order."""
    model = request.param
    path = ex.write_model(tmp_path_factory.mktemp(f"exact-{model}"), model)
    int8 = [*ex.INT8_CONFIGS, ex.INT8_NEGATIVE] if model in INT8_MODELS else []
    farm = ServerFarm([ex.REFERENCE, *ex.checked_configs(model), ex.NEGATIVE, *int8],
                      partial(_start, path, model))
    yield model, farm
    farm.close()


@pytest.fixture(scope="module")
def reference(exact_farm):
    return ex.build_stream(exact_farm[1].get(ex.REFERENCE))


def test_reference_is_uncached_and_its_logits_are_decisive(reference):
    """Real weights, not SGLang's dummy U(-1e-3, 1e-3) (every logprob about -ln V): the
    greedy token leads clearly on most positions and is far likelier than uniform."""
    assert all(s.cached_tokens == 0 for s in reference)
    tops = [t for s in reference for t in s.top]
    clear = sum(ex._margin(t) >= ex.CLEAR_MARGIN for t in tops)
    assert clear >= 0.9 * len(tops), f"{clear}/{len(tops)} positions with a clear lead"
    mean_top = sum(t[0][0] for t in tops) / len(tops)
    assert mean_top > -math.log(VOCAB) + 1.0, mean_top


@pytest.mark.parametrize("cfg", ex.CONFIGS, ids=ex.config_id)
def test_cached_outputs_equal_uncached(cfg, reference, exact_farm):
    model, farm = exact_farm
    if cfg not in ex.checked_configs(model):
        pytest.skip(f"{model}: {ex.config_id(cfg)} runs with {ex.FULL_ENV}=full "
                    "(or verify-exact --live)")
    got = ex.replay(farm.get(cfg), reference)
    assert sum(s.cached_tokens > 0 for s in got) >= 6
    assert ex.problems(cfg, reference, got) == []


def test_negative_control_a_perturbed_resumed_state_breaks_the_tolerance(reference,
                                                                         exact_farm):
    """Stock no_buffer with every copied SSM state doubled: requests that resume
    differ by orders of magnitude more than the tolerance; the others stay exact."""
    steps = reference[:ex.NEGATIVE_STEPS]
    comparisons = ex.compare_all(steps, ex.replay(exact_farm[1].get(ex.NEGATIVE), steps))
    assert [c.cached_tokens > 0 for c in comparisons] == [False, True, True, True, True]
    _, worst_resumed = ex.summary(comparisons)
    assert worst_resumed > 100 * ex.REL_TOL, worst_resumed
    assert all(c.max_rel <= ex.REL_TOL for c in comparisons if c.cached_tokens == 0)


def test_int8_hits_resume_from_the_bitwise_round_trip(reference, exact_farm):
    """--enable-int8-mamba-checkpoint with marconi: the scripted hits happen, each loads a
    state bitwise equal to SGLang's int8 round trip of the state stored for it (the test
    kit's audit), and the outputs stay within the int8 rounding of the uncached ones; with
    every loaded state scaled, the audit fails on every load and the outputs break the
    tolerance by more than 10x."""
    model, farm = exact_farm
    if model not in INT8_MODELS:
        pytest.skip(f"{model}: the int8 scenario runs in verify-exact --live")
    result = ex.run_int8(farm, reference, model, log=lambda _msg: None)
    for cfg, res in result["configs"].items():
        assert res["problems"] == [], cfg
        assert res["audit"]["equal"] >= 6
    neg = result["negative_control"]
    assert neg["audit"]["failed"] >= 3 and neg["audit"]["equal"] == 0, neg
    assert neg["max_rel_resumed"] > 10 * ex.INT8_REL_TOL, neg
