"""marconi_reports/hicache_bench.py (issue 20's grid with SGLang's HiCache): the cells, one tiny
cell through the real replay with its host tier, the ratios to stock, the targets'
PASS/MISS and the table."""
import pytest

from marconi_reports import hicache_bench


def test_grid_puts_the_target_first_and_names_every_cell_once():
    cells = hicache_bench.grid()
    assert len(cells) == 2 * 2 * 3 * 2  # models x host sizes x write policies x caches
    first = cells[0]
    assert (first["model"], first["host_gb"], first["policy"]) == hicache_bench.TARGET
    assert len({hicache_bench.cell_key(c) for c in cells}) == len(cells)
    assert hicache_bench.parse_cache("marconi+:host=lru") == ("marconi+", {"host": "lru"})
    assert hicache_bench.parse_cache("stock") == ("stock", {})


def _row(host_gb, policy, cache, saved, frac):
    return {"model": "paper-7b", "device_gb": 100, "host_gb": host_gb, "policy": policy,
            "cache": cache, "flops_saved": saved, "flops_saved_fraction": frac,
            "kv_tokens_evicted": 5, "states_evicted": 1, "bookkeeping_ms_per_request": 2.0,
            "host": {"hit_tokens": 64, "bytes_loaded": 1e9, "kv_tokens_evicted": 7,
                     "states_evicted": 0}}


def test_targets_pass_and_miss_and_the_table():
    rows = [_row(400, "write_through", "stock", 10.0, 0.10),
            _row(400, "write_through", "marconi+", 12.5, 0.125),
            _row(200, "write_back", "stock", 10.0, 0.10),
            _row(200, "write_back", "marconi+", 9.9, 0.099)]
    an = hicache_bench.analyze(rows)
    assert [r["ratios"]["marconi+"] for r in an["rows"]] == pytest.approx([0.99, 1.25])
    verdicts = [(m, res) for _, m, res in an["targets"]]
    assert verdicts == [("1.250x", "PASS"),
                        ("worst 0.990x (paper-7b 200 GB write_back; 2 cells)", "MISS")]
    sliced = [res for _, _, res in hicache_bench.analyze(rows, limit=9)["targets"]]
    assert sliced == ["PASS on the first 9 requests only", "MISS on the first 9 requests only"]
    md = hicache_bench.markdown(an, "python scripts/bench_hicache.py --limit 9", limit=9)
    assert "first 9 requests" in md and "| paper-7b | 400 | write_through | marconi+ | " \
        "12.50% | 1.250x | 64 | 1.000e+09 | 5 / 7 | 1 / 0 | 2.0 |" in md


def test_a_tiny_cell_replays_with_the_host_tier(tmp_path):
    pytest.importorskip("sglang")
    cell = {"model": "paper-7b", "device_gb": 100, "host_gb": 200,
            "policy": "write_through", "cache": "marconi+:host=lru"}
    from marconi_reports.sweeps import MOONCAKE_TRACE

    if not MOONCAKE_TRACE.is_file():
        pytest.skip(f"the bundled trace is not at {MOONCAKE_TRACE}")
    row = hicache_bench.run_cell(cell, str(MOONCAKE_TRACE), limit=4)
    assert row["requests"] == 4 and row["cache_class"] == "MarconiUnifiedRadixCache"
    assert row["marconi"]["host_evicted"] == {"full": 0, "mamba": 0}  # SGLang's host LRU
    # 200 GB over the device pools' bytes (SGLang's proportional split)
    device = (row["pools"]["kv_tokens"] * row["pools"]["kv_bytes_per_token"]
              + row["pools"]["mamba_slots"] * row["pools"]["state_bytes"])
    assert row["hicache_ratio"] == pytest.approx(200e9 / device)
    assert row["host"]["bytes_backed_up"] > 0
