"""`metric: demand` (SPEC §6): one pod's arrival rate from its counters over a window (pure: no I/O, no clock).

The one function the scaler and the simulator share:

    pod_demand(points, unit=DemandUnit.REQUESTS, prefill_weight=DEFAULT_PREFILL_WEIGHT) -> float | Missing

`points` are one pod's DemandPoints over the window, oldest first (over_window() picks them from a
longer history): when each page was read (`at`, seconds on any steady clock), the engine's counter of
finished requests (every finish reason), the requests in the server then (running + waiting), and where
the engine prints them its prompt and generation token counters and its per-request token histograms'
`_sum`/`_count`. The answer is work arriving per second:

- `requests`: λ = (Δ finished + Δ in flight) / Δt. What finished plus what piled up is what arrived,
  whatever the batch does to latency (in-flight counts alone grow with load faster than load does).
- `tokens`: λ × the work of one request over the same window in decode-token equivalents: from the
  per-request histograms where the page prints them, Δ prompt sum / Δ prompt count × prefill_weight +
  Δ generation sum / Δ generation count (each request observed once, whole); from the token counters
  otherwise, (Δ prompt tokens × prefill_weight + Δ generation tokens) / Δ finished (prompts count as
  they are admitted and finishes lag, so a step or a burst reads up to 2× the true size). A replica's capacity in requests per
  second changes several times over when the request mix does (long RAG prompts and answers against short
  chat); in weighted tokens per second it stays close to one figure, so one threshold holds all day.

Counters are running totals: one that goes down is a restarted server, counted from 0 (and its in-flight
count from an empty server), never a negative rate. A pod's history (collect/demand_history.py) hands in
totals already taken per series, which never go down: there a reset of one series is never a reset of all. Fewer than two points, or two at the same instant, is
Missing(NO_RATE): the pod has no rate yet (the caller counts it as the mean of the others). A point
never holds NaN or a negative number: the caller turns such a page into a missing pod instead.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypeVar

from keda_gpu_scaler.pages.engines import Missing, MissingKind

# The `window` metadata (seconds): what the rate is averaged over. Short reacts faster and is noisier
# (a pod finishing 10 requests a second sees ±30 % over 10 s); long smooths a burst away. 30 s measured
# best in the simulator (docs/BENCHMARKS.md, "LLM serving (simulator)"): 15 s waited the same for up to 5 % more
# GPU-seconds, 60 s saved 2-7 % GPU-seconds but waited 15 % more after a step, 120 s 25-41 % more.
DEFAULT_WINDOW_SECONDS = 30.0
MIN_WINDOW_SECONDS = 10.0  # two scrapes at the default 5 s interval at least
MAX_WINDOW_SECONDS = 600.0  # the history kept per page is bounded by it

# How much one prompt token weighs against one generated token for `demandUnit: tokens`. Each prefill
# stalls the whole batch's decoding, so against a per-output-token latency target a prompt token costs
# about as much as a generated one: in the simulator a replica's capacity in weighted tokens/s varied
# 1.26x over six request mixes at 0.75-0.8, 1.33x at 1 and 2.53x at 0.25 (10.7x in requests/s;
# docs/BENCHMARKS.md, "LLM serving"). 1 counts every token once. `prefillWeight` overrides it.
DEFAULT_PREFILL_WEIGHT = 1.0
MAX_PREFILL_WEIGHT = 4.0


class DemandUnit(StrEnum):
    """What one unit of demand is: a request, or a request weighed by its tokens."""

    REQUESTS = "requests"
    TOKENS = "tokens"


@dataclass(frozen=True, slots=True)
class DemandPoint:
    """One page of one pod, as `metric: demand` reads it (see the module docstring)."""

    at: float
    finished: float
    in_flight: float
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    # The per-request token histograms: (prompt sum, prompt count, generation sum, generation count).
    sizes: tuple[float, float, float, float] | None = None


class _Timed(Protocol):
    @property
    def at(self) -> float: ...


TimedT = TypeVar("TimedT", bound=_Timed)


# How far before the window's start its last page may be and still count, in steps between the window's
# own pages (the scrape interval, give or take the jitter of page times).
_STEP_SLACK = 1.5


def over_window(points: Sequence[TimedT], window: float) -> Sequence[TimedT]:
    """The points a rate over `window` reads: those within the window (newer than `window` before the
    newest), and the point just before the window's start where it is close to it, so that the span
    covers the window where the history is that long.

    Close: no further before the start than about one scrape interval, the longest step between the
    window's own points (with half again for jitter); with one point inside, within one window (a
    scrape interval is never longer than the window: a shorter window is refused). A point further back
    is from before a gap in the pages (an outage), when the load may have been another: reaching back to
    it read a page outage from 20 s to 100 s and three pages since as the load over 90 s, a third of the
    window's. Then the window's own points alone (one alone is no rate yet)."""
    if not points:
        return points
    boundary = points[-1].at - window
    inside = len(points)
    while inside > 0 and points[inside - 1].at > boundary:
        inside -= 1
    if inside == 0:
        return points  # the whole history is within the window
    own = points[inside:]
    steps = [after.at - before.at for before, after in itertools.pairwise(own)]
    close = _STEP_SLACK * max(steps) if steps else window
    return points[inside - 1 :] if boundary - points[inside - 1].at <= close else own


def _increase(values: Sequence[float]) -> float:
    """How much a running total grew over consecutive readings; a drop is a restart counted from 0."""
    grown = 0.0
    for before, after in itertools.pairwise(values):
        grown += after - before if after >= before else after
    return grown


def _arrivals(points: Sequence[DemandPoint]) -> tuple[float, float]:
    """Requests finished and requests arrived between the first point and the last."""
    finished = 0.0
    arrived = 0.0
    for before, after in itertools.pairwise(points):
        if after.finished >= before.finished:
            done = after.finished - before.finished
            piled = after.in_flight - before.in_flight
        else:
            # A restarted server: everything it counts arrived since, into an empty server.
            done = after.finished
            piled = after.in_flight
        finished += done
        arrived += done + piled
    return finished, arrived


def pod_demand(
    points: Sequence[DemandPoint],
    unit: DemandUnit = DemandUnit.REQUESTS,
    prefill_weight: float = DEFAULT_PREFILL_WEIGHT,
) -> float | Missing:
    """Work arriving per second at one pod over its points (see the module docstring)."""
    if len(points) < 2:
        return Missing(
            MissingKind.NO_RATE,
            "one page read so far: a rate needs two" if points else "no page read yet",
        )
    span = points[-1].at - points[0].at
    if span <= 0:
        return Missing(MissingKind.NO_RATE, "its pages were read at one instant: no time to take a rate over")
    finished, arrived = _arrivals(points)
    # Requests lost with a restart or turned away without a finish can make the sum dip below 0 where
    # nothing arrived; no demand is below none.
    if not math.isfinite(arrived):  # counters beyond a float's range: no rate, never max()'s made-up 0
        return Missing(MissingKind.NO_RATE, "its counters are beyond a float's range: no rate can be taken")
    rate = max(0.0, arrived / span)
    if unit is DemandUnit.REQUESTS:
        return rate
    per_request = _request_size(points, finished, prefill_weight)
    if isinstance(per_request, Missing):
        return per_request
    if per_request is None:
        if rate == 0:
            return 0.0
        return Missing(
            MissingKind.NO_RATE,
            "no request finished within the window: the size of its requests is not known yet",
        )
    value = rate * per_request
    return value if math.isfinite(value) else Missing(MissingKind.NO_RATE, "counters too large to rate")


def _request_size(
    points: Sequence[DemandPoint], finished: float, prefill_weight: float
) -> float | Missing | None:
    """The weighted tokens of one request over the points; None when none finished within them."""
    sizes = [p.sizes for p in points]
    if all(size is not None for size in sizes):
        grown = [_increase([size[part] for size in sizes if size is not None]) for part in range(4)]
        prompt_sum, prompt_count, generation_sum, generation_count = grown
        if prompt_count <= 0 or generation_count <= 0:
            return None
        return prompt_sum / prompt_count * prefill_weight + generation_sum / generation_count
    prompt = [p.prompt_tokens for p in points]
    generated = [p.generation_tokens for p in points]
    if any(v is None for v in prompt) or any(v is None for v in generated):
        return Missing(
            MissingKind.NOT_EXPORTED, "no token counters on its page (demandUnit tokens needs them)"
        )
    if finished <= 0:
        return None
    work = _increase([v for v in prompt if v is not None]) * prefill_weight + _increase(
        [v for v in generated if v is not None]
    )
    return work / finished


def growth_per_second(points: Sequence[tuple[float, float]]) -> float:
    """How fast a level grew between the first point (time, level) and the last; 0 with no time between."""
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return 0.0
    return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])


def pending_demand(growth: float, held: float, window: float) -> float:
    """What requests held at the gateway add (SPEC §6 with `inferencePool`): their rate of growth (never
    below 0: a queue draining is the pods' work, already counted) and enough to clear the `held` now
    within one window."""
    return max(0.0, growth) + held / window
