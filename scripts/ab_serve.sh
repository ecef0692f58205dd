#!/usr/bin/env bash
# A/B on a GPU: stock SGLang vs --cache-policy marconi, same model, same benchmark.
#
#   scripts/ab_serve.sh MODEL [extra sglang server flags...]
#
# For each policy in POLICIES (default: lru = stock, then marconi) it starts
#   python -m sglang_marconi.launch_server --model-path MODEL --cache-policy POLICY ...
# waits for /health, runs sglang.benchmark.serving on two workloads, stops the server:
#   1. the shared Mooncake trace (its `mooncake` dataset, timestamps replayed), and
#   2. a multi-turn shared-prefix workload (`generated-shared-prefix`, several turns).
# Then it prints TTFT P50/P95, throughput and cache hit rate side by side.
#
# Environment (all optional):
#   PORT=30000  TRACE=../shared/traces/mooncake/synthetic_trace.jsonl
#   MOONCAKE_PROMPTS=1000  MOONCAKE_SLOWDOWN=1.0  MULTITURN_GROUPS=32
#   MARCONI_FLAGS="--marconi-alpha 1" (marconi only: the paper's ranking)   POLICIES="lru marconi"
#   OUT=ab_serve_results   PYTHON=python
#
# On a CPU-only machine: scripts/ab_serve.sh --cpu [--model qwen3_next|nemotron_h]
#   [--buffer extra_buffer|no_buffer] [--policies stock,marconi,marconi-alpha]
# starts live CPU servers (SGLang's real server, forward replaced: docs/live_server.md)
# with capped pools and prints the table from the servers' own counters
# (scripts/ab_serve_cpu.py).
set -euo pipefail

if [[ "${1:-}" == "--cpu" ]]; then
    shift
    HERE="$(cd "$(dirname "$0")/.." && pwd)"
    PYTHON="${PYTHON:-$HERE/.venv/bin/python}"
    [[ -x "$PYTHON" ]] || PYTHON=python
    exec "$PYTHON" "$HERE/scripts/ab_serve_cpu.py" "$@"
fi

if [[ $# -lt 1 || "$1" == "-h" || "$1" == "--help" ]]; then
    sed -n '2,24p' "$0"; exit 2
fi
MODEL="$1"; shift
EXTRA_FLAGS=("$@")
HERE="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python}"
PORT="${PORT:-30000}"
TRACE="${TRACE:-$HERE/../shared/traces/mooncake/synthetic_trace.jsonl}"
MOONCAKE_PROMPTS="${MOONCAKE_PROMPTS:-1000}"
MOONCAKE_SLOWDOWN="${MOONCAKE_SLOWDOWN:-1.0}"
MULTITURN_GROUPS="${MULTITURN_GROUPS:-32}"
MARCONI_FLAGS="${MARCONI_FLAGS:-}"
read -r -a POLICY_LIST <<< "${POLICIES:-lru marconi}"
for policy in "${POLICY_LIST[@]}"; do
    case "$policy" in lru|marconi|marconi+) ;;
        *) echo "error: POLICIES: unknown policy '$policy' (lru, marconi, marconi+)" >&2; exit 2;;
    esac
done
OUT="${OUT:-ab_serve_results}"
mkdir -p "$OUT"
[[ -f "$TRACE" ]] || { echo "error: Mooncake trace not found: $TRACE" >&2; exit 2; }

SERVER_PID=""
stop_server() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
    fi
    SERVER_PID=""
}
trap stop_server EXIT

start_server() {  # policy
    local policy="$1"; local flags=()
    [[ "$policy" == "marconi" ]] && read -r -a flags <<< "$MARCONI_FLAGS"
    "$PYTHON" -m sglang_marconi.launch_server --model-path "$MODEL" --port "$PORT" \
        --cache-policy "$policy" "${flags[@]}" "${EXTRA_FLAGS[@]}" \
        > "$OUT/server_$policy.log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 600); do
        if curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; then return 0; fi
        kill -0 "$SERVER_PID" 2>/dev/null || { tail -30 "$OUT/server_$policy.log" >&2; exit 1; }
        sleep 2
    done
    echo "error: server ($policy) did not become healthy" >&2; exit 1
}

bench() {  # policy workload
    local policy="$1" workload="$2" args=()
    if [[ "$workload" == "mooncake" ]]; then
        args=(--dataset-name mooncake --dataset-path "$TRACE" --mooncake-workload synthetic
              --num-prompts "$MOONCAKE_PROMPTS" --mooncake-slowdown-factor "$MOONCAKE_SLOWDOWN")
    else
        args=(--dataset-name generated-shared-prefix --gsp-num-groups "$MULTITURN_GROUPS"
              --gsp-prompts-per-group 8 --gsp-system-prompt-len 4096 --gsp-question-len 256
              --gsp-output-len 256 --gsp-num-turns 4 --request-rate 4)
    fi
    "$PYTHON" -m sglang.benchmark.serving --backend sglang --port "$PORT" --model "$MODEL" \
        "${args[@]}" --cache-report --output-file "$OUT/${policy}_${workload}.jsonl" \
        > "$OUT/bench_${policy}_${workload}.log" 2>&1
}

for policy in "${POLICY_LIST[@]}"; do
    rm -f "$OUT/${policy}_mooncake.jsonl" "$OUT/${policy}_multiturn.jsonl"
    start_server "$policy"
    bench "$policy" mooncake
    bench "$policy" multiturn
    stop_server
done

"$PYTHON" - "$OUT" "${POLICY_LIST[@]}" <<'EOF'
import json, sys
out, policies = sys.argv[1], sys.argv[2:]
rows = [("TTFT P50 (ms)", "median_ttft_ms", "{:.1f}"), ("TTFT P95 (ms)", "p95_ttft_ms", "{:.1f}"),
        ("input tok/s", "input_throughput", "{:.0f}"), ("output tok/s", "output_throughput", "{:.0f}"),
        ("requests/s", "request_throughput", "{:.2f}")]
for workload in ("mooncake", "multiturn"):
    res = {}
    for policy in policies:
        with open(f"{out}/{policy}_{workload}.jsonl") as fh:
            res[policy] = json.loads(fh.read().strip().splitlines()[-1])
    names = ["stock (lru)" if p == "lru" else p for p in policies]
    print(f"\n{workload}:" + "".join(n.rjust(26 if i == 0 else 14) for i, n in enumerate(names)))
    for label, key, fmt in rows:
        print(f"  {label:<22}" + "".join(fmt.format(res[p][key]).rjust(14) for p in res))
    hit = [res[p].get("cache_report", {}).get("cache_hit_rate_pct") for p in res]
    print(f"  {'cache hit rate (%)':<22}" + "".join(f"{h:>14}" for h in hit))
EOF
echo "logs and raw results: $OUT/"
