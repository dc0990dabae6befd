"""Admission of costly HTTP requests (/explain): a limit on those in flight and a budget of their cost.

Whatever the clients do, /explain may take only a bounded share of the process: its JSON is rendered by
the interpreter that answers every gRPC call (a worker thread still holds the GIL), so 8 clients asking
for a big namespace over and over once raised a healthy tenant's GetMetrics p99 from 2 to 40 ms. A
request over either limit is refused at once (429 with Retry-After), before any work.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

# Requests rendered at once: one thread competing with the event loop for the GIL, plus one.
EXPLAIN_IN_FLIGHT = 2
# The cost of one answer: 1, plus 1 per EXPLAIN_PODS_PER_UNIT pods (or replicas, ScaledObjects) it lists.
EXPLAIN_PODS_PER_UNIT = 100
# Cost units granted per second, and how many may be spent at once after a quiet spell. A unit is well
# under a millisecond of rendering, so /explain takes at most a few percent of one core on average.
EXPLAIN_UNITS_PER_SECOND = 100.0
EXPLAIN_BURST_UNITS = 200.0


def explain_cost(pods: int) -> float:
    """What an answer listing `pods` pods (or ScaledObjects) costs beyond the 1 every request costs."""
    return float(pods // EXPLAIN_PODS_PER_UNIT)


class Admission:
    """At most `in_flight` admitted requests at once, and a token bucket of cost units.

    `admit(cost)` returns None when the request may go on (call `done()` when it ends), else the seconds
    after which the client may try again (for Retry-After)."""

    def __init__(
        self,
        *,
        in_flight: int = EXPLAIN_IN_FLIGHT,
        units_per_second: float = EXPLAIN_UNITS_PER_SECOND,
        burst: float = EXPLAIN_BURST_UNITS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit = in_flight
        self._rate = units_per_second
        self._burst = burst
        self._clock = clock
        self._busy = 0
        self._tokens = burst
        self._at = clock()

    def admit(self, cost: float) -> float | None:
        if self._busy >= self._limit:
            return 1.0
        wait = self.charge(cost)
        if wait is None:
            self._busy += 1
        return wait

    def charge(self, cost: float) -> float | None:
        """Spend `cost` more units on an admitted request (once its size is known); None when they were
        there, else the seconds until they are."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        # A request costing more than half the burst goes through while half of it is there (then the
        # bucket is in debt): it is refused only while the budget is being spent, never for good.
        needed = min(cost, self._burst / 2)
        if self._tokens < needed:
            return max(1.0, math.ceil((needed - self._tokens) / self._rate))
        self._tokens -= cost
        return None

    def done(self) -> None:
        self._busy -= 1
