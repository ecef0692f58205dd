"""``verify-exact --live``'s report: one model's scenario table, its failures, the negative
control, and one PASS / FAIL line each for the speculative decoding and int8 scenarios
(``exact_live.run_all``'s result)."""
from __future__ import annotations


def print_live(result: dict, exact_live, titles: dict) -> None:
    print(f"verify-exact --live: fp32, seeded weights (seed {result['seed']}); "
          f"max |logprob - uncached| / |uncached| per scenario and configuration "
          f"(tolerance {result['rel_tol']:.0e}), cached_tokens of its requests")
    for model, res in result["models"].items():
        print(f"\n{titles.get(model, model)}")
        for line in exact_live.scenario_table(res):
            print(line)
        for cfg, cfg_res in res["configs"].items():
            for p in cfg_res["problems"]:
                print(f"FAIL {model} {cfg}: {p}")
        neg = res["negative_control"]
        print(f"negative control (every copied SSM state scaled by {1 + neg['perturb']:g}, "
              f"stock no_buffer): max rel diff of resumed requests "
              f"{neg['max_rel_resumed']:.2e} = {neg['max_rel_resumed'] / result['rel_tol']:.0f}x "
              f"the tolerance ({'breaks it' if neg['breaks_tolerance'] else 'DOES NOT break it'})")
        print_spec(model, res, exact_live, result["rel_tol"])
        print_int8(model, res["int8"], result["int8_rel_tol"])
    print("PASS" if result["passed"] else "FAIL")


def print_spec(model: str, res: dict, exact_live, tol: float) -> None:
    """The speculative decoding scenario (NGRAM drafts verified by the real forward): one
    PASS / FAIL line of figures."""
    r = res["configs"].get(exact_live.config_id((exact_live.SPEC, "marconi")))
    if r is None:
        return
    same, total = exact_live.identical_tokens(r["requests"])
    print(f"{'FAIL' if r['problems'] else 'PASS'} speculative decoding ({model}, NGRAM, "
          f"{exact_live.SPEC}, marconi): {same} of {total} greedy tokens identical to the "
          f"uncached server's, max rel diff {r['max_rel']:.2e} (tolerance {tol:.0e})")


def print_int8(model: str, res: dict, tol: float) -> None:
    """The int8 checkpoint scenario: its problems, then one PASS / FAIL line of figures."""
    for cfg, r in res["configs"].items():
        for p in r["problems"]:
            print(f"FAIL {model} {cfg}: {p}")
    figures = "; ".join(
        f"{cfg}: {r['audit']['equal']} hits resumed from a state bitwise equal to SGLang's "
        f"int8 round trip, max rel diff {r['max_rel']:.2e}" for cfg, r in res["configs"].items())
    neg = res["negative_control"]
    print(f"{'PASS' if res['passed'] else 'FAIL'} int8 checkpoints ({model}, tolerance "
          f"{tol:.0e}): {figures}; negative control (loaded states scaled by "
          f"{1 + neg['perturb']:g}): {neg['audit']['failed']} loads fail the audit, max rel "
          f"diff {neg['max_rel_resumed']:.2e} = {neg['max_rel_resumed'] / tol:.0f}x")
