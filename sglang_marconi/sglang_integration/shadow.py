"""The alpha tuner's replay for the SGLang cache: the recorded window through shadow
``MarconiUnifiedRadixCache``s on CPU pools of the live pools' sizes.

``policy.alpha.AlphaTuner`` decides when to tune and keeps the best alpha; it asks a
``replay(window, alpha) -> FLOPs saved`` callable. The simulator's replay models one byte
budget and Marconi's two-state admission; SGLang has two pools and, under
``extra_buffer``, chunk-boundary states, and on long-prompt traces those differences pick
the wrong alpha (the simulator settles at 0 on the Mooncake trace, where SGLang's own
cache gains from alpha > 0). So the SGLang cache tunes on SGLang's own mechanics: the same
``Replayer`` the CPU A/B uses, on pools built with the process's current SGLang config
(chunk size, track interval, page) and tiny tensors. It runs in the scheduler process
once the bootstrap window completes, in slices: ``steps`` replays one prefill chunk or
one block of decode steps per step, and the tuner runs steps until a slice's token budget
(``policy.defaults.TUNE_SLICE_TOKENS``) is spent, one slice per finished live request, so
no single cache call carries more than one slice of the replay.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from array import array
from dataclasses import dataclass
from typing import Any

# A coarse grid: each point is a full replay of the window through SGLang's cache code.
TUNING_GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)


@dataclass
class ShadowReplay:
    """``replay(window, alpha)`` over window items ``(input_ids array('q'), output_ids)``."""

    cache_class: Any  # the live cache's class (``MarconiUnifiedRadixCache``)
    spec: Any
    settings: Any
    kv_tokens: int
    state_slots: int
    page_size: int
    extra_buffer: bool
    seconds: float = 0.0

    def _chunk_size(self) -> int:
        from sglang.srt.runtime_context import get_schedule

        chunk = getattr(get_schedule(), "chunked_prefill_size", None)
        return chunk if chunk and chunk > 0 else 1 << 30

    def __call__(self, window, alpha: float) -> float:
        """FLOPs saved on the whole window (all steps at once)."""
        return sum(saved for saved, _ in self.steps(window, alpha))

    def steps(self, window, alpha: float):
        """Replay ``window`` with ``alpha`` in steps of one prefill chunk or one block of
        decode steps (``Replayer.steps``): yields (FLOPs saved, tokens of the step); a
        request's saving comes with its last step. The shadow cache is built at the first
        step. Each step runs single-threaded torch and restores the caller's thread count
        before yielding, so the live cache's calls between two steps are unaffected."""
        import torch

        from sglang_marconi.driver.pools import PoolConfig, build_cache
        from sglang_marconi.driver.replay import Replayer, ReplayRequest

        replayer = None
        for n, (input_ids, output_ids) in enumerate(window):
            if len(input_ids) + len(output_ids) + 2 * self.page_size > self.kv_tokens:
                yield 0.0, 0  # cannot fit the shadow pool (nor did it fit the live one)
                continue
            request, finished = None, False
            while not finished:
                t0 = time.perf_counter()
                threads = torch.get_num_threads()
                torch.set_num_threads(1)
                try:
                    if replayer is None:
                        replayer = self._replayer(window, alpha, build_cache, PoolConfig,
                                                  Replayer, dataclasses)
                    if request is None:
                        request = replayer.steps(ReplayRequest(f"shadow-{n}", input_ids,
                                                               output_ids))
                    tokens, saved = next(request), 0.0
                except StopIteration as done:
                    # the release inserts the whole sequence
                    tokens = len(input_ids) + len(output_ids)
                    saved = self.spec.flops_saved(done.value.hit_len, 0)
                    finished = True
                finally:
                    torch.set_num_threads(threads)
                    self.seconds += time.perf_counter() - t0
                yield saved, tokens

    def _replayer(self, window, alpha, build_cache, PoolConfig, Replayer, dataclasses):
        longest = max(len(i) + len(o) for i, o in window)
        pc = PoolConfig(kv_tokens=self.kv_tokens, mamba_slots=self.state_slots,
                        page_size=self.page_size, max_context_len=longest + 2 * self.page_size,
                        extra_buffer=self.extra_buffer)
        settings = dataclasses.replace(self.settings, alpha=float(alpha))
        cls = functools.partial(self.cache_class, settings=settings, spec=self.spec)
        cache = build_cache(pc, cache_class=cls, tree_core="python", keep_global_args=True)[0]
        return Replayer(cache, chunked_prefill_size=self._chunk_size())


def window_item(req) -> tuple:
    """What the tuner records of a finished request."""
    ids = req.origin_input_ids
    return (ids if isinstance(ids, array) else array("q", ids), list(req.output_ids))
