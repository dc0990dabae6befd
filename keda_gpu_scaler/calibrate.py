"""`keda-gpu-scaler calibrate`: what one replica serves, measured on one pod while a load ramp runs.

The `demand` threshold is the work one replica should serve per second. It depends on the model, the GPU,
the engine's settings and the request mix, so it is measured, not guessed: run a load generator against
one pod with a slowly rising rate, and let this command read the pod's own page every few seconds. It
prints the arrival rate over the last window (requests per second, and weighted tokens per second where
the engine prints token counters) beside the requests waiting, and at the end the highest rate the pod
took while nothing waited: past it, requests queue and latency climbs. A threshold a little below that
figure leaves the headroom you want for your latency target.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from keda_gpu_scaler.collect.demand_history import demand_point
from keda_gpu_scaler.collect.http import FetchError
from keda_gpu_scaler.collect.inference import POD_PAGE_NAMES
from keda_gpu_scaler.demand import (
    DEFAULT_PREFILL_WEIGHT,
    DemandPoint,
    DemandUnit,
    over_window,
    pod_demand,
)
from keda_gpu_scaler.engines import Missing, PodSamples, pod_reading
from keda_gpu_scaler.exposition import ExpositionError, Sample, parse_exposition


@dataclass(frozen=True, slots=True)
class Step:
    """One page read: the rates over the window up to it, and what the pod held then."""

    at: float
    requests: float | None  # requests per second arriving (None: no rate yet)
    tokens: float | None  # weighted tokens per second (None: no token counters, or no rate yet)
    in_flight: float
    waiting: float


@dataclass(slots=True)
class Calibration:
    """Pages of one pod in, steps and the capacity out (pure: the caller reads pages and keeps time)."""

    window: float
    waiting_above: float = 0.0  # requests waiting above this count as "requests wait"
    sustain: int = 3  # pages in a row with requests waiting end the ramp
    engine: str = "auto"
    model: str | None = None
    prefill_weight: float = DEFAULT_PREFILL_WEIGHT
    points: list[DemandPoint] = field(default_factory=list)
    best: Step | None = None  # the step with the highest rate while nothing waited in its window
    waited_in_a_row: int = 0
    _waiting: list[tuple[float, float]] = field(default_factory=list)

    def observe(self, at: float, page: bytes) -> Step | str:
        """Read one page; a Step, or why this page gives none."""
        try:
            samples = parse_exposition(page, POD_PAGE_NAMES)
        except ExpositionError as error:
            return f"not a metrics page: {error}"
        engine, point = demand_point(PodSamples("", "", tuple(samples)), (self.engine, self.model), at)
        if isinstance(point, Missing):
            return f"{engine}: {point.reason}"
        waiting = _waiting_of(samples, self.engine, self.model)
        self.points.append(point)
        self.points = list(over_window(self.points, self.window))
        self._waiting.append((at, waiting))
        start = self.points[0].at
        self._waiting = [(t, w) for t, w in self._waiting if t >= start]
        requests = pod_demand(self.points, DemandUnit.REQUESTS)
        tokens = pod_demand(self.points, DemandUnit.TOKENS, self.prefill_weight)
        step = Step(
            at,
            None if isinstance(requests, Missing) else requests,
            None if isinstance(tokens, Missing) else tokens,
            point.in_flight,
            waiting,
        )
        self.waited_in_a_row = self.waited_in_a_row + 1 if waiting > self.waiting_above else 0
        calm = all(w <= self.waiting_above for _, w in self._waiting)
        if (
            calm
            and step.requests is not None
            and (self.best is None or step.requests > (self.best.requests or 0))
        ):
            self.best = step
        return step

    @property
    def saturated(self) -> bool:
        """Requests have waited on `sustain` pages in a row: the ramp is past what the pod serves."""
        return self.waited_in_a_row >= self.sustain


def _waiting_of(samples: list[Sample], engine: str, model: str | None) -> float:
    # demand_point() read the same page whole: the waiting gauge is there (Triton's pending count too).
    reading = pod_reading(samples, engine, model)
    return 0.0 if isinstance(reading.waiting, Missing) else reading.waiting


def step_line(step: Step, started: float) -> str:
    tokens = f"{step.tokens:10.0f}" if step.tokens is not None else "         -"
    requests = f"{step.requests:8.2f}" if step.requests is not None else "       -"
    return f"{step.at - started:7.0f}s {requests} req/s {tokens} tok/s  in flight {step.in_flight:5.0f}  waiting {step.waiting:4.0f}"


def summary(calibration: Calibration) -> str:
    best = calibration.best
    if best is None or best.requests is None:
        return "no rate was measured while nothing waited: start the ramp lower, or give it longer"
    tokens = f" ({best.tokens:.0f} weighted tokens/s, demandUnit: tokens)" if best.tokens is not None else ""
    reached = (
        "requests started waiting past it"
        if calibration.saturated
        else "requests never waited: the ramp did not reach this pod's capacity, so this is a lower bound"
    )
    return (
        f"highest arrival rate with nothing waiting: {best.requests:.2f} requests/s{tokens}; {reached}.\n"
        f'threshold for metric: demand: a little below it, e.g. "{best.requests * 0.9:.3g}" (90 %), lower'
        " for more latency headroom"
    )


async def run(
    url: str,
    calibration: Calibration,
    *,
    fetch: Callable[[str], Awaitable[bytes]],
    interval: float,
    duration: float,
    out: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Calibration:
    """Read `url` every `interval` seconds until the pod saturates or `duration` has passed."""
    started = clock()
    out(
        f"reading {url} every {interval:g}s, rates over the last {calibration.window:g}s; run the load ramp now"
    )
    while clock() - started <= duration:
        try:
            body = await fetch(url)
        except FetchError as error:
            out(f"{clock() - started:7.0f}s page not read: {error}")
        else:
            step = calibration.observe(clock(), body)
            out(step_line(step, started) if isinstance(step, Step) else f"{clock() - started:7.0f}s {step}")
            if calibration.saturated:
                break
        await sleep(interval)
    out(summary(calibration))
    return calibration
