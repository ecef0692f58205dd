"""``ClockLog``: SGLang's access counter at request-clock values, oldest first, so a node's
``last_access_time`` reads as the request clock of its last touch. Bounded: past
``CLOCK_LOG_LIMIT`` entries the oldest half goes, and what is older reads as clock 0 (the
oldest). Deterministic in the request stream."""
from array import array
from bisect import bisect_right

from sglang_marconi.policy.defaults import CLOCK_LOG_LIMIT


class ClockLog:
    def __init__(self):
        self.counters, self.clocks = array("d"), array("q")

    def append(self, counter: float, clock: int) -> None:
        self.counters.append(counter)
        self.clocks.append(clock)
        if len(self.counters) > CLOCK_LOG_LIMIT:
            del self.counters[:CLOCK_LOG_LIMIT // 2], self.clocks[:CLOCK_LOG_LIMIT // 2]

    def clock_at(self, counter: float) -> int:
        """The clock of the last entry at or before ``counter`` (0 before the first)."""
        i = bisect_right(self.counters, counter) - 1
        return self.clocks[i] if i >= 0 else 0
