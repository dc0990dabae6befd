"""`threshold: auto` (SPEC §6): what one replica serves at the latency target, learned from its pods' pages.

Pure: no I/O and no clock (every time is passed in). Each pod's samples fall in load levels; a level met
the target when its median time per output token and its median time to first token were within it, and
no larger share of its first tokens and output tokens came after their targets than the SLO allows (a
median far inside a target still lets the slow twentieth through, which the SLO counts). A
pod's capacity is read from what it was seen to do, never extrapolated: the highest load level that met
the target, with a small margin to try the next level, and below the lowest level above it that failed.
A pod seen failing at every level it ran at gets a step down from the lowest. A pod that met levels only
far below the target, and failed nowhere at or below it, says nothing about the target and is left out. Latency stays flat until a
pod saturates and then jumps (requests queue for the prefill): a line fitted below that knee cannot see
it, the time to first token does. The target is the mean capacity of the Ready pods, so Σ demand ÷
target counts replicas' worth of work even in a pool of two GPU types or two model versions.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import fmean, median

# The target moves only within [LOWEST_FACTOR, HIGHEST_FACTOR] × thresholdStart: a bad fit can at most
# halve or double what the user chose, never run away.
LOWEST_FACTOR = 0.5
HIGHEST_FACTOR = 2.0
# A change under MIN_STEP is noise and is ignored: each move makes KEDA rewrite the HPA. A move back up
# after a move down (a failure seen) needs REVERSAL_STEP (hysteresis): a capacity between two steps cannot
# flap, and a failure is acted on at the first step. A move down from a target at or above the load the
# pods were seen failing at is taken whatever its size (started 1.6× high on the simulator's day trace,
# 6 % over the capacity stayed for 6 hours; docs/BENCHMARKS.md).
MIN_STEP = 0.10
REVERSAL_STEP = 0.20
# At most one move per MIN_MOVE_INTERVAL seconds (6 an hour): twice the HPA's own 300 s scale-down window,
# so the fleet settles on one target, and its pods are seen at it, before the next.
MIN_MOVE_INTERVAL = 600.0
# A window's mean latency over fewer observations (tokens, or requests) than this says nothing about
# load: an idle or nearly idle pod's mean is one request's luck. A level's first-token reads likewise
# count from this many first tokens (requests) over its windows: a window of one 300-token request
# holds 300 token gaps but one first token.
MIN_OBSERVATIONS = 20.0
# A pod's capacity is read only from MIN_SAMPLES samples at least; load levels are LEVEL_WIDTH ×
# thresholdStart wide, and a level says something only from MIN_LEVEL_SAMPLES samples (one odd window,
# a burst the fleet had not scaled for yet, does not decide a level).
MIN_SAMPLES = 10
MIN_LEVEL_SAMPLES = 3
LEVEL_WIDTH = 0.10
# Above the highest level that met the target, a pod is trusted with TRY_ABOVE more (the next levels),
# so a target started low climbs by steps as the pods are seen to serve more; a failure seen above
# stops it. A pod failing at every level it ran at is given STEP_DOWN less than the lowest.
TRY_ABOVE = 0.15
STEP_DOWN = 0.10
# Bounded memory: the newest MAX_SAMPLES_PER_POD samples of each pod (an hour at a 30 s cadence), at most
# MAX_PODS pods, and a pod with no sample for FORGET_POD_AFTER seconds is gone (deleted or replaced).
MAX_SAMPLES_PER_POD = 120
MAX_PODS = 1000
FORGET_POD_AFTER = 900.0
# The time per output token a learned target is set at unless the trigger states one: 50 ms is 20 tokens
# a second, faster than anyone reads, and reachable at a real batch by both GPUs of
# /work/shared/reference/llm-serving-model.md (H100 7 ms + 0.043 ms × batch; L40S 22.6 + 0.181 × batch).
DEFAULT_TPOT_SECONDS = 0.050
# The time to first token a level must keep (its median over the windows) unless the trigger's SLO states
# one: below saturation a pod's mean is about a prefill (0.05–0.4 s in the simulator); past
# it requests queue and the mean reaches seconds within a window.
DEFAULT_TTFT_SECONDS = 2.0
# A level's median of the windows' mean TTFT must stay within this share of the TTFT target: with
# requests queueing, a mean at the target leaves far more than the SLO's few percent beyond it.
TTFT_SHARE = 0.5
# The share of a level's requests whose first token may come after the TTFT target unless the trigger's
# SLO states its attainment: the SLO's own allowance (1 - 0.95).
DEFAULT_ALLOWED_MISSES = 0.05
# A pod whose highest level met is below SEEN_NEAR × the target was only handed light load (added for a
# burst, then quiet): what it met says nothing about the target. Counted, such pods pulled the simulator's
# flash-crowd targets 10–25 % low (pods at 3–9k tokens/s beside older pods reading 18k). Chosen on the
# developers' traces (seed 1): bursty started ×0.6 93.8k → 87.5k GPU-s (attainment 0.801 → 0.737, over
# `recommended`'s 0.689), ×1.6 and mix-shift unchanged within 2.6 %; docs/BENCHMARKS.md has the held-out runs.
SEEN_NEAR = 0.5


@dataclass(frozen=True, slots=True)
class Sample:
    """One pod over one window, from its own page (deltas of its counters and histograms)."""

    time: float  # seconds, on the caller's clock
    pod: str
    rate: float  # the pod's demand over the window, in the trigger's unit per second
    latency: float  # its mean time per output token over the window, seconds
    observations: float  # how many tokens (or requests) that mean is over
    first_token: float | None = None  # its mean time to first token over the window, seconds
    # Of its requests with a first token in the window (`first_token_requests`), how many took longer than
    # the TTFT target (read from its histogram's buckets); None: the page prints no such histogram.
    first_token_late: float | None = None
    first_token_requests: float | None = None
    # Of its `observations`, how many took longer than the time-per-output-token target; None: unknown.
    per_token_late: float | None = None
    # The pool's endpoint pickers held requests at the window's end: no pod had room (flow control holds
    # a request only then), so the pod was at or past what it serves, whatever its own latency says.
    pool_held: bool = False


@dataclass(frozen=True, slots=True)
class PodFit:
    """One pod's evidence and the capacity read from it; capacity None says why not in `note`."""

    pod: str
    samples: int
    levels: int  # load levels with enough samples to say something
    met: float | None  # the highest level's rate that met the latency target
    failed: float | None  # the lowest level's rate above `met` (or anywhere, without one) that failed
    capacity: float | None
    note: str


@dataclass(frozen=True, slots=True)
class LearnedTarget:
    """The trigger's target and why (for /explain and /metrics)."""

    target: float
    start: float
    latency_target: float  # seconds per output token
    first_token_limit: float  # seconds: the most a level's median time to first token may be
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

    def __init__(
        self,
        start: float,
        latency_target: float = DEFAULT_TPOT_SECONDS,
        first_token_target: float = DEFAULT_TTFT_SECONDS,
        allowed_misses: float = DEFAULT_ALLOWED_MISSES,
    ) -> None:
        self.start = start
        self.latency_target = latency_target
        self.first_token_target = first_token_target
        self.first_token_limit = TTFT_SHARE * first_token_target
        self.allowed_misses = allowed_misses
        self.target = start
        self._samples: dict[str, deque[Sample]] = {}
        self._moved_at = -math.inf
        self._last_direction = 0  # +1 up, -1 down, 0 never moved
        self._dropped_idle = 0
        self._dropped_invalid = 0

    def observe(self, sample: Sample) -> None:
        """Keep one pod's window, unless it cannot say anything about capacity."""
        late = (
            sample.first_token_late or 0.0,
            sample.first_token_requests or 0.0,
            sample.per_token_late or 0.0,
        )
        numbers = (
            sample.time,
            sample.rate,
            sample.latency,
            sample.observations,
            sample.first_token or 1.0,
            *late,
        )
        if not all(math.isfinite(n) for n in numbers) or min(sample.rate, *late) < 0 or sample.latency <= 0:
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
            fit_pod(
                pod,
                self._samples[pod],
                LEVEL_WIDTH * self.start,
                self.latency_target,
                self.first_token_limit,
                self.allowed_misses,
            )
            for pod in sorted(set(ready_pods))
            if pod in self._samples
        )
        fits = tuple(_left_out_said(fit, self.target) for fit in fits)
        counted = [fit for fit in fits if fit.capacity is not None and _seen_near(fit, self.target)]
        if not counted:
            return self._answer(fits, None, None, "none", self._no_fit_reason(fits), 0)
        mean_capacity = fmean(fit.capacity for fit in counted if fit.capacity is not None)
        proposed, bound = self._bounded(mean_capacity)
        # The target sits at or above the load the pods were seen failing at (their mean): held there by
        # MIN_STEP it stays where requests miss, so a move down of any size is taken.
        failed = [fit.failed for fit in counted if fit.failed is not None]
        unsafe = bool(failed) and fmean(failed) <= self.target
        reason = self._move_towards(proposed, now, unsafe)
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

    def _move_towards(self, proposed: float, now: float, unsafe: bool) -> str:
        change = proposed / self.target - 1
        direction = 1 if change > 0 else -1
        needed = REVERSAL_STEP if direction == 1 and self._last_direction == -1 else MIN_STEP
        if direction == -1 and unsafe:
            needed = 0.0
        if change == 0:
            return "held: the capacity read is the target"
        if abs(change) < needed:
            kind = "a move back up" if needed == REVERSAL_STEP else "a move"
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
            first_token_limit=self.first_token_limit,
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


def _seen_near(fit: PodFit, target: float) -> bool:
    """Whether a pod's fit says something about the target: it met a level at SEEN_NEAR × the target or
    more, or it failed at or below the target (or at every level it ran at)."""
    failed_below = fit.failed is not None and fit.failed <= target
    return fit.met is None or failed_below or fit.met >= SEEN_NEAR * target


def _left_out_said(fit: PodFit, target: float) -> PodFit:
    """The fit, its note saying so when it is left out of the mean (for /explain)."""
    if fit.capacity is None or fit.met is None or _seen_near(fit, target):
        return fit
    why = f"left out: it met only {fit.met:.4g}, under {SEEN_NEAR:.0%} of the target {target:.4g}"
    return dataclasses.replace(fit, note=f"{why} ({fit.note})")


def fit_pod(
    pod: str,
    samples: Sequence[Sample],
    level_width: float,
    latency_target: float,
    first_token_limit: float,
    allowed_misses: float = DEFAULT_ALLOWED_MISSES,
) -> PodFit:
    """A pod's capacity from the load levels it was seen at: never beyond what its levels show."""
    levels = _levels(samples, level_width, latency_target, first_token_limit, allowed_misses)
    if len(samples) < MIN_SAMPLES or not levels:
        note = (
            f"too few samples: {len(samples)}, {len(levels)} load levels with {MIN_LEVEL_SAMPLES} or more"
            f" (at least {MIN_SAMPLES} samples and one such level are needed)"
        )
        return PodFit(pod, len(samples), len(levels), None, None, None, note)
    met = [rate for rate, missed in levels if missed is None]
    if not met:
        failed, why = levels[0]
        note = f"every level seen missed the latency target: {STEP_DOWN:.0%} below the lowest ({why})"
        return PodFit(pod, len(samples), len(levels), None, failed, failed * (1 - STEP_DOWN), note)
    best = max(met)
    failed_above = [(rate, missed) for rate, missed in levels if missed is not None and rate > best]
    if not failed_above:
        note = f"no level above the highest that met failed: {TRY_ABOVE:.0%} above it"
        return PodFit(pod, len(samples), len(levels), best, None, best * (1 + TRY_ABOVE), note)
    failed, why = min(failed_above)
    capacity = min(best * (1 + TRY_ABOVE), (best + failed) / 2)
    note = (
        f"between the highest level that met the latency target and the lowest above it that failed ({why})"
    )
    return PodFit(pod, len(samples), len(levels), best, failed, capacity, note)


def _levels(
    samples: Sequence[Sample],
    level_width: float,
    latency_target: float,
    first_token_limit: float,
    allowed_misses: float,
) -> list[tuple[float, str | None]]:
    """(median rate, why it missed the targets or None) of each load level with MIN_LEVEL_SAMPLES samples,
    by rising rate."""
    by_level: dict[int, list[Sample]] = {}
    for sample in samples:
        by_level.setdefault(math.floor(sample.rate / level_width), []).append(sample)
    levels = []
    for _, level in sorted(by_level.items()):
        if len(level) < MIN_LEVEL_SAMPLES:
            continue
        levels.append(
            (median(s.rate for s in level), _missed(level, latency_target, first_token_limit, allowed_misses))
        )
    return levels


def _missed(
    level: Sequence[Sample], latency_target: float, first_token_limit: float, allowed: float
) -> str | None:
    """Why a level missed the targets (for /explain), or None when it met them."""
    per_token = median(s.latency for s in level)
    if per_token > latency_target:
        return f"its median time per output token {per_token * 1000:.3g} ms is over {latency_target * 1000:.3g} ms"
    first_tokens = [s.first_token for s in level if s.first_token is not None]
    requests = math.fsum(s.first_token_requests or 0.0 for s in level if s.first_token is not None)
    if requests >= MIN_OBSERVATIONS and (first_token := median(first_tokens)) > first_token_limit:
        return f"its median time to first token {first_token:.3g} s is over {first_token_limit:.3g} s"
    for what, late, observed in (
        ("first tokens", "first_token_late", "first_token_requests"),
        ("output tokens", "per_token_late", "observations"),
    ):
        if (share := _late_share(level, late, observed)) > allowed:
            return f"{share:.1%} of its {what} came after the target, over the {allowed:.1%} the SLO allows"
    if 2 * sum(s.pool_held for s in level) > len(level):
        return "the pool's endpoint pickers held requests in most of its windows: no pod had room"
    return None


def _late_share(level: Sequence[Sample], late: str, observed: str) -> float:
    """The share of a level's observations (`observed`: first tokens, or output tokens) that came after
    their target (`late`); 0 when its pages print no such histogram or its windows hold fewer than
    MIN_OBSERVATIONS of them (a dozen requests' luck): the medians alone then decide."""
    counted = [(getattr(s, late), getattr(s, observed)) for s in level if getattr(s, late) is not None]
    total = math.fsum(n or 0.0 for _, n in counted)
    return math.fsum(k for k, _ in counted) / total if total >= MIN_OBSERVATIONS else 0.0
