"""`threshold: auto` (SPEC §6): what one replica serves at the latency target, learned from its pods' pages.

Pure: no I/O and no clock (every time is passed in). Each pod gets its own line, latency ≈ a + b × rate,
fitted robustly over its recent samples; its capacity is the rate at which that line reaches the latency
target. The target is the mean capacity of the Ready pods, so Σ demand ÷ target counts replicas' worth of
work even in a pool of two GPU types or two model versions (the sum of n pods' capacities is n × their mean).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import fmean, median

# The target moves only within [LOWEST_FACTOR, HIGHEST_FACTOR] × thresholdStart: a bad fit can at most
# halve or double what the user chose, never run away.
LOWEST_FACTOR = 0.5
HIGHEST_FACTOR = 2.0
# A change under MIN_STEP is noise and is ignored: each move makes KEDA rewrite the HPA. A move back the
# other way needs REVERSAL_STEP (hysteresis), so a capacity near the middle of two steps cannot flap.
MIN_STEP = 0.10
REVERSAL_STEP = 0.20
# At most one move per MIN_MOVE_INTERVAL seconds: the HPA's own scale-down window is 300 s, so the fleet
# settles on one target before the next.
MIN_MOVE_INTERVAL = 300.0
# A window's mean latency over fewer observations (tokens, or requests) than this says nothing about
# load: an idle or nearly idle pod's mean is one request's luck.
MIN_OBSERVATIONS = 20.0
# A pod's line is fitted only from MIN_SAMPLES samples over MIN_LEVELS load levels at least; load levels
# are LEVEL_WIDTH × thresholdStart wide, so the fit spans at least a fifth of the starting target.
MIN_SAMPLES = 10
MIN_LEVELS = 3
LEVEL_WIDTH = 0.10
# Bounded memory: the newest MAX_SAMPLES_PER_POD samples of each pod (an hour at a 30 s cadence), at most
# MAX_PODS pods, and a pod with no sample for FORGET_POD_AFTER seconds is gone (deleted or replaced).
MAX_SAMPLES_PER_POD = 120
MAX_PODS = 1000
FORGET_POD_AFTER = 900.0
# The time per output token a learned target is set at unless the trigger states one: 50 ms is 20 tokens
# a second, faster than anyone reads, and reachable at a real batch by both GPUs of
# /work/shared/reference/llm-serving-model.md (H100 7 ms + 0.043 ms × batch; L40S 22.6 + 0.181 × batch).
DEFAULT_TPOT_SECONDS = 0.050


@dataclass(frozen=True, slots=True)
class Sample:
    """One pod over one window, from its own page (deltas of its counters and histograms)."""

    time: float  # seconds, on the caller's clock
    pod: str
    rate: float  # the pod's demand over the window, in the trigger's unit per second
    latency: float  # its mean time per output token over the window, seconds
    observations: float  # how many tokens (or requests) that mean is over


@dataclass(frozen=True, slots=True)
class PodFit:
    """One pod's line and the capacity read from it; capacity None says why not in `note`."""

    pod: str
    samples: int
    levels: int
    intercept: float | None  # seconds
    slope: float | None  # seconds per unit of rate
    capacity: float | None  # the rate at which the line reaches the latency target
    note: str


@dataclass(frozen=True, slots=True)
class LearnedTarget:
    """The trigger's target and why (for /explain and /metrics)."""

    target: float
    start: float
    latency_target: float  # seconds per output token
    mean_capacity: float | None  # over the Ready pods with a capacity; None: no fit yet
    proposed: float | None  # mean_capacity within the bounds
    bound: str  # which bound held: "none", "lower" (0.5× start) or "upper" (2× start)
    reason: str  # why the target is what it is now
    fits: tuple[PodFit, ...]
    samples_used: int  # samples behind the capacities that counted
    dropped_idle: int  # samples over too few observations, since the learner started
    dropped_invalid: int  # samples with a non-finite or negative number, since the learner started
    moved_at: float | None


class Learner:
    """One `threshold: auto` trigger's learned target, from thresholdStart on."""

    def __init__(self, start: float, latency_target: float = DEFAULT_TPOT_SECONDS) -> None:
        self.start = start
        self.latency_target = latency_target
        self.target = start
        self._samples: dict[str, deque[Sample]] = {}
        self._moved_at = -math.inf
        self._last_direction = 0  # +1 up, -1 down, 0 never moved
        self._dropped_idle = 0
        self._dropped_invalid = 0

    def observe(self, sample: Sample) -> None:
        """Keep one pod's window, unless it cannot say anything about capacity."""
        numbers = (sample.time, sample.rate, sample.latency, sample.observations)
        if not all(math.isfinite(n) for n in numbers) or sample.rate < 0 or sample.latency <= 0:
            self._dropped_invalid += 1
            return
        if sample.observations < MIN_OBSERVATIONS:
            self._dropped_idle += 1
            return
        kept = self._samples.get(sample.pod)
        if kept is None:
            if len(self._samples) >= MAX_PODS:
                del self._samples[min(self._samples, key=lambda pod: self._samples[pod][-1].time)]
            kept = self._samples[sample.pod] = deque(maxlen=MAX_SAMPLES_PER_POD)
        kept.append(sample)

    def update(self, now: float, ready_pods: Iterable[str]) -> LearnedTarget:
        """Move the target if the Ready pods' capacities say so and the rules allow; say why either way."""
        self._forget_gone(now)
        fits = tuple(
            fit_pod(pod, self._samples[pod], LEVEL_WIDTH * self.start, self.latency_target)
            for pod in sorted(set(ready_pods))
            if pod in self._samples
        )
        counted = [fit for fit in fits if fit.capacity is not None]
        if not counted:
            return self._answer(fits, None, None, "none", self._no_fit_reason(fits), 0)
        mean_capacity = fmean(fit.capacity for fit in counted if fit.capacity is not None)
        proposed, bound = self._bounded(mean_capacity)
        reason = self._move_towards(proposed, now)
        used = sum(fit.samples for fit in counted)
        return self._answer(fits, mean_capacity, proposed, bound, reason, used)

    def _forget_gone(self, now: float) -> None:
        for pod in [pod for pod, kept in self._samples.items() if kept[-1].time < now - FORGET_POD_AFTER]:
            del self._samples[pod]

    def _no_fit_reason(self, fits: Sequence[PodFit]) -> str:
        if not fits:
            return "no sample from a Ready pod yet: the target stays where it is"
        return "no Ready pod has a usable fit yet: the target stays where it is"

    def _bounded(self, capacity: float) -> tuple[float, str]:
        low, high = LOWEST_FACTOR * self.start, HIGHEST_FACTOR * self.start
        if capacity < low:
            return low, "lower"
        if capacity > high:
            return high, "upper"
        return capacity, "none"

    def _move_towards(self, proposed: float, now: float) -> str:
        change = proposed / self.target - 1
        direction = 1 if change > 0 else -1
        needed = REVERSAL_STEP if direction == -self._last_direction else MIN_STEP
        if abs(change) < needed:
            kind = "a move back" if needed == REVERSAL_STEP else "a move"
            return f"held: {change:+.1%} is less than the {needed:.0%} {kind} needs"
        since = now - self._moved_at
        if since < MIN_MOVE_INTERVAL:
            return f"held: the last move was {since:.0f} s ago (at most one per {MIN_MOVE_INTERVAL:.0f} s)"
        self.target, self._moved_at, self._last_direction = proposed, now, direction
        return f"moved {change:+.1%}"

    def _answer(
        self,
        fits: tuple[PodFit, ...],
        mean_capacity: float | None,
        proposed: float | None,
        bound: str,
        reason: str,
        used: int,
    ) -> LearnedTarget:
        return LearnedTarget(
            target=self.target,
            start=self.start,
            latency_target=self.latency_target,
            mean_capacity=mean_capacity,
            proposed=proposed,
            bound=bound,
            reason=reason,
            fits=fits,
            samples_used=used,
            dropped_idle=self._dropped_idle,
            dropped_invalid=self._dropped_invalid,
            moved_at=None if math.isinf(self._moved_at) else self._moved_at,
        )


def fit_pod(pod: str, samples: Sequence[Sample], level_width: float, latency_target: float) -> PodFit:
    """A pod's line through the medians of its load levels (Theil–Sen: robust to a few bad levels)."""
    levels = _level_medians(samples, level_width)
    if len(samples) < MIN_SAMPLES or len(levels) < MIN_LEVELS:
        note = (
            f"too few samples: {len(samples)} over {len(levels)} load levels"
            f" (at least {MIN_SAMPLES} over {MIN_LEVELS} are needed)"
        )
        return PodFit(pod, len(samples), len(levels), None, None, None, note)
    slope = median(
        (y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(levels) for x2, y2 in levels[i + 1 :] if x2 != x1
    )
    intercept = median(y - slope * x for x, y in levels)
    if slope <= 0:
        note = "latency does not rise with load over the levels seen: no capacity can be read"
        return PodFit(pod, len(samples), len(levels), intercept, slope, None, note)
    # A pod whose latency at no load already misses the target serves nothing within it.
    capacity = max((latency_target - intercept) / slope, 0.0)
    return PodFit(pod, len(samples), len(levels), intercept, slope, capacity, "")


def _level_medians(samples: Sequence[Sample], level_width: float) -> list[tuple[float, float]]:
    """(median rate, median latency) of each load level the samples fall in, by rising rate."""
    by_level: dict[int, list[Sample]] = {}
    for sample in samples:
        by_level.setdefault(math.floor(sample.rate / level_width), []).append(sample)
    return [
        (median(s.rate for s in level), median(s.latency for s in level))
        for _, level in sorted(by_level.items())
    ]
