"""scripts/ab_serve.sh (the GPU serving A/B) on CPU: its argument checks and the summary
it prints from sglang.benchmark.serving's result files (the parts that need no GPU)."""
import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "ab_serve.sh")


def run(args, **env):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)


def test_usage_and_bad_policies():
    r = run([])
    assert r.returncode == 2 and "POLICIES" in r.stdout
    r = run(["some/model"], POLICIES="lru fifo", OUT="/tmp/ab_serve_test_unused")
    assert r.returncode == 2 and "unknown policy 'fifo'" in r.stderr


def test_summary_table(tmp_path):
    text = open(SCRIPT).read()
    summary = re.search(r"<<'EOF'\n(.*?)\nEOF\n", text, re.S).group(1)
    policies = ["lru", "marconi", "marconi+"]
    for i, policy in enumerate(policies):
        for workload in ("mooncake", "multiturn"):
            row = {"median_ttft_ms": 100.0 - 10 * i, "p95_ttft_ms": 400.0 - 50 * i,
                   "input_throughput": 1000 + i, "output_throughput": 200 + i,
                   "request_throughput": 1.5, "cache_report": {"cache_hit_rate_pct": 10 * i}}
            (tmp_path / f"{policy}_{workload}.jsonl").write_text(json.dumps(row) + "\n")
    out = subprocess.run([sys.executable, "-", str(tmp_path), *policies], input=summary,
                         capture_output=True, text=True, check=True).stdout
    assert "stock (lru)" in out and "marconi+" in out
    p95 = [line for line in out.splitlines() if "TTFT P95" in line][0].split()[-3:]
    assert p95 == ["400.0", "350.0", "300.0"]
    hits = [line for line in out.splitlines() if "cache hit rate" in line][0].split()[-3:]
    assert hits == ["0", "10", "20"]


def test_cpu_mode_checks_its_policies():
    """``--cpu`` (live CPU servers, scripts/ab_serve_cpu.py) refuses an unknown policy
    before starting anything."""
    r = run(["--cpu", "--policies", "stock,fifo"])
    assert r.returncode == 2 and "unknown fifo" in r.stderr
