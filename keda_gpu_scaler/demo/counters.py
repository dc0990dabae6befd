"""The demo's inference servers' counters (requests finished, prompt and generated tokens), advanced one
simulated second at a time from the requests each engine ran, so `metric: demand` has rates to read."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from keda_gpu_scaler.demo.engines import EngineTotals

# A chat request: ~10 s in the batch (200 output tokens at ~50 ms each), ~600 prompt tokens.
SERVICE_SECONDS = 10.0
PROMPT_TOKENS_PER_REQUEST = 600.0
GENERATION_TOKENS_PER_REQUEST = 200.0


class ServedTotals:
    """Per pod, each engine's totals since the fleet started: a request in the batch finishes after
    SERVICE_SECONDS on average (Little's law: running / service time finish each second)."""

    def __init__(self) -> None:
        self._totals: dict[str, list[list[float]]] = {}
        self._counted_until: dict[str, int] = {}  # whole simulated seconds already counted, per pod

    def totals(
        self, pod: str, now: float, running_at: Callable[[float], Sequence[float]]
    ) -> list[EngineTotals]:
        """The pod's totals at `now`; `running_at(t)` gives each engine's running requests at second t."""
        step = self._counted_until.get(pod, 0)
        end = math.floor(now)
        for second in range(step, end):
            running = running_at(float(second))
            engines = self._totals.setdefault(pod, [[0.0, 0.0, 0.0] for _ in running])
            for engine, batch in zip(engines, running, strict=False):
                finished = batch / SERVICE_SECONDS
                engine[0] += finished
                engine[1] += finished * PROMPT_TOKENS_PER_REQUEST
                engine[2] += finished * GENERATION_TOKENS_PER_REQUEST
        self._counted_until[pod] = max(step, end)
        return [
            EngineTotals(float(math.floor(f)), math.floor(p), math.floor(g))
            for f, p, g in self._totals.get(pod, [])
        ]
