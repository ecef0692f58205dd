"""The alpha-mode sweep's rule (``marconi_reports.alpha_sweep.choose``): among the modes never more
than 2% below stock in any cell, the best on average; its markdown names the command."""
from marconi_reports.alpha_sweep import choose, markdown


def rows(table):
    return [{"trace": t, "slots": s, "mode": m, "flops_saved_fraction": v}
            for (t, s), cells in table.items() for m, v in cells.items()]


def test_the_default_is_never_2pct_below_stock_and_best_on_average():
    table = {("mc", 60): {"stock": 0.10, "fixed-1": 0.20, "auto": 0.10, "online": 0.15},
             ("mc", 200): {"stock": 0.20, "fixed-1": 0.19, "auto": 0.25, "online": 0.22},
             ("chat", 60): {"stock": 0.50, "fixed-1": 0.60, "auto": 0.50, "online": 0.55}}
    default, summary = choose(rows(table))
    assert summary["fixed-1"][1] < -0.02  # 5% below stock at ("mc", 200): excluded
    assert default == "online"  # online (+16.7%) beats auto (+8.3%) on average
    text = markdown(rows(table), "python scripts/sweep_alpha_mode.py --limit 9")
    assert "--limit 9" in text and "**online**" in text and "| mc | 200 |" in text


def test_no_mode_qualifies_keeps_stock():
    table = {("mc", 60): {"stock": 0.2, "auto": 0.1}}
    assert choose(rows(table))[0] == "stock"
