"""marconi_reports/reuse_gap.py (scripts/gap_to_offline.py): reuse order and distance per request,
and the loss table against the never-evicting ceiling."""
import numpy as np
import pytest

from marconi_reports import reuse_gap


def test_classify_reuse_order_and_new_tokens_since_the_previous_use():
    reqs = [{"hash_ids": [1, 2]},        # fresh
            {"hash_ids": [7, 8, 9]},     # fresh, 3 new blocks
            {"hash_ids": [1, 2, 3]},     # reuses [1, 2] (seen once): 1st reuse
            {"hash_ids": [1, 5]},        # reuses [1] (seen twice before): 2nd reuse
            {"hash_ids": [1, 2, 3]}]     # reuses [1, 2, 3] (seen once): 1st reuse
    kinds = reuse_gap.classify(reqs, block=10)
    assert kinds[0] is None and kinds[1] is None
    # [1, 2] last used by request 0; new tokens since: request 1's 3 blocks
    assert kinds[2] == (1, 30)
    # [1] last used by request 2, right before: no request in between (the previous use's
    # own new block 3 is not counted)
    assert kinds[3] == (2, 0)
    # [1, 2, 3] last used by request 2; request 3 brought block 5
    assert kinds[4] == (1, 10)


def test_reuse_order_saturates_and_distances_bin():
    reqs = [{"hash_ids": [4]} for _ in range(8)]
    kinds = reuse_gap.classify(reqs, block=1)
    assert [k for k, _ in kinds[1:]] == [1, 2, 3, 4, 4, 4, 4]
    assert reuse_gap.distance_bin(0) == 0
    assert reuse_gap.distance_bin(reuse_gap.DISTANCE_EDGES[0]) == 1
    assert reuse_gap.distance_bin(10 ** 9) == len(reuse_gap.DISTANCE_EDGES)


def test_losses_are_ceiling_minus_saved_per_cell():
    kinds = [None, (1, 0), (4, 10 ** 9)]
    ceiling = np.array([0.0, 6.0, 4.0])
    tables = reuse_gap.losses(kinds, ceiling, {"p": np.array([0.0, 2.0, 4.0])}, prefill=10.0)
    cells = tables["p"]
    assert cells[(1, 0)] == pytest.approx((0.6, 0.4, 0.0))
    assert cells[(4, len(reuse_gap.DISTANCE_EDGES))] == pytest.approx((0.4, 0.0, 0.0))
    assert reuse_gap.totals(cells) == {1: pytest.approx((0.6, 0.4, 0.0)),
                                       4: pytest.approx((0.4, 0.0, 0.0))}
    # a request the policy hit nothing for: its whole ceiling is missed, and counted apart
    zero = reuse_gap.losses(kinds, ceiling, {"q": np.array([0.0, 0.0, 4.0])}, 10.0)["q"]
    assert zero[(1, 0)] == pytest.approx((0.6, 0.6, 0.6))
