"""A waiting request is re-matched every scheduling round (LPM): the re-matches neither
advance the request clock nor repeat marconi+'s ghost lookup while the ghost index is
unchanged; a release (finish or retraction) makes the next match a new admission."""
import functools
from array import array

import pytest

pytest.importorskip("sglang")

from sglang_marconi.driver.pools import PoolConfig, build_cache  # noqa: E402
from sglang_marconi.driver.replay import Replayer, ReplayRequest  # noqa: E402
from sglang_marconi.model import preset_spec  # noqa: E402
from sglang_marconi.sglang_integration.cache import MarconiUnifiedRadixCache  # noqa: E402
from sglang_marconi.sglang_integration.options import MarconiSettings  # noqa: E402

PC = PoolConfig(kv_tokens=1024, mamba_slots=10, page_size=16, max_context_len=1024,
                chunked_prefill_size=128, mamba_track_interval=64)


def test_rematches_are_not_new_requests():
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    cls = functools.partial(MarconiUnifiedRadixCache, spec=preset_spec("paper-7b"),
                            settings=MarconiSettings())
    cache = build_cache(PC, cache_class=cls, tree_core="python")[0]
    policy = cache.marconi
    lookups = []
    lookup = policy.ghost.lookup
    policy.ghost.lookup = lambda *a: lookups.append(1) or lookup(*a)
    replayer = Replayer(cache, chunked_prefill_size=PC.chunked_prefill_size)
    replayer.run(ReplayRequest("a", array("q", range(200)), [7, 8]))
    assert (policy.clock, len(lookups)) == (1, 1)

    waiting = Req(rid="w", origin_input_text="", origin_input_ids=array("q", range(150)),
                  sampling_params=SamplingParams(temperature=0, max_new_tokens=2))
    for _ in range(5):  # five scheduling rounds
        waiting.init_next_round_input(cache, cow_mamba=False)
    assert (policy.clock, len(lookups)) == (2, 2)
    assert policy.plan(waiting).hit_len == waiting.prefix_len > 0

    replayer.run(ReplayRequest("b", array("q", range(100, 300)), [9]))  # ghost changes
    waiting.init_next_round_input(cache, cow_mamba=False)
    assert (policy.clock, len(lookups)) == (3, 4)  # b ticked; w looked up again, no tick
