#!/usr/bin/env python3
"""Branch-and-pick reasoning as an SGLang frontend program: the prefix-sharing pattern
Marconi's branch-point checkpoints are for.

Every question shares one long few-shot prefix; each question then forks into N
reasoning branches and a final pick. The shared prefix, each question's stem and every
fork point are branch points in the server's radix tree: with a hybrid (attention + SSM)
model a branch only hits if an SSM state was checkpointed exactly there.

Run it against either server and compare the prompt tokens the server reports as cached:

    python -m sglang_marconi.launch_server --model-path MODEL --port 30000   # stock
    python -m sglang_marconi.launch_server --model-path MODEL --port 30001 \
        --cache-policy marconi                                              # Marconi
    python scripts/sgl_fork_example.py --url http://127.0.0.1:30000
    python scripts/sgl_fork_example.py --url http://127.0.0.1:30001
"""
import argparse
import time

import sglang as sgl

FEW_SHOT = "\n\n".join(
    f"Question: {q}\nReasoning: {r}\nAnswer: {a}" for q, r, a in [
        ("A train travels 120 km in 1.5 hours. What is its average speed?",
         "Speed is distance over time: 120 / 1.5 = 80.", "80 km/h"),
        ("If 3 pencils cost 45 cents, how much do 7 pencils cost?",
         "One pencil costs 45 / 3 = 15 cents, so 7 cost 7 * 15 = 105.", "105 cents"),
        ("What is 15% of 240?", "10% is 24 and 5% is 12, so 15% is 36.", "36"),
        ("A rectangle has perimeter 30 and width 5. What is its area?",
         "Length is (30 - 2*5) / 2 = 10, so the area is 10 * 5 = 50.", "50"),
        ("How many minutes are there in 3.5 hours?", "3.5 * 60 = 210.", "210"),
        ("Solve 4x + 7 = 31.", "4x = 24, so x = 6.", "6"),
    ]
) + "\n\n"

QUESTIONS = [
    "A shop sells apples at 4 for 1 dollar. How much do 18 apples cost?",
    "A car uses 6 litres of fuel per 100 km. How much fuel does it need for 350 km?",
    "The sum of two consecutive integers is 95. What are they?",
    "A tank fills in 6 hours with one pipe and 3 hours with another. How long with both?",
    "What is the next number: 2, 6, 12, 20, 30, ...?",
    "A price rises 20% and then falls 20%. What is the net change?",
    "How many edges does a cube have?",
    "If 5 workers build a wall in 8 days, how long do 4 workers take?",
]


@sgl.function
def branch_and_pick(s, question, branches: int = 4):
    s += "Solve each question step by step.\n\n" + FEW_SHOT
    s += f"Question: {question}\n"
    forks = s.fork(branches)
    for i, f in enumerate(forks):
        f += f"Reasoning (approach {i + 1}): "
        f += sgl.gen("reasoning", max_tokens=160, temperature=0.8, stop="\n")
    s += "Candidate reasonings:\n"
    for i, f in enumerate(forks):
        s += f"({i + 1}) {f['reasoning']}\n"
    s += "The most convincing candidate is number "
    s += sgl.gen("pick", choices=[str(i + 1) for i in range(branches)])
    s += ".\nAnswer: " + sgl.gen("answer", max_tokens=48, stop="\n")


def _cached(state, name):
    try:
        meta = state.get_meta_info(name) or {}
    except Exception:  # older servers / backends without meta info
        return None, None
    return meta.get("cached_tokens"), meta.get("prompt_tokens")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--branches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2,
                        help="passes over the questions (later passes reuse the tree)")
    parser.add_argument("--parallel", type=int, default=8)
    args = parser.parse_args()

    sgl.set_default_backend(sgl.RuntimeEndpoint(args.url))
    batch = [{"question": q, "branches": args.branches} for q in QUESTIONS] * args.rounds
    start = time.perf_counter()
    states = branch_and_pick.run_batch(batch, num_threads=args.parallel, progress_bar=True)
    elapsed = time.perf_counter() - start

    cached = prompt = 0
    for q, state in zip(QUESTIONS, states):
        print(f"- {q}\n  pick {state['pick']}: {state['answer'].strip()}")
    for state in states:
        c, p = _cached(state, "answer")
        if c is not None and p:
            cached, prompt = cached + c, prompt + p
    print(f"\n{len(states)} programs ({args.branches} branches each) in {elapsed:.1f} s")
    if prompt:
        print(f"final-answer calls: {cached}/{prompt} prompt tokens cached "
              f"({cached / prompt:.1%}); see the server log / metrics for all calls")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
