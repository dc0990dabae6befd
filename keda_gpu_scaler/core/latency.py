"""The latency a trigger's pods served, read from their own histograms, and what an SLO makes of it (pure).

The pods' pages carry time-to-first-token and per-output-token histograms (engines' LATENCY tables); the
demand history keeps each bucket's running total per series, so a window's increases are exact across
restarts. From them: the quantile the SLO names (Prometheus' histogram_quantile arithmetic), a guard that
raises the value while that quantile is over its target, the headroom the arrival rate's variability
asks for, and the requests over a target, whose share over recent windows says how much of the SLO's
allowance of misses was used (and so how much headroom and guard the SLO needs). No requests in the
window is no read: a latency is never made up.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from keda_gpu_scaler.core.scaling import HPA_TOLERANCE
from keda_gpu_scaler.core.slo import SloTarget
from keda_gpu_scaler.pages.engines import LATENCY_FAMILIES

_LE = ":le="


@dataclass(frozen=True, slots=True)
class LatencyRead:
    """One latency kind over a window, all pods' requests together (seconds)."""

    kind: str  # TTFT, TPOT (requests' means) or ITL (gaps between tokens)
    q: float  # the quantile asked for (the SLO's attainment)
    quantile: float | None  # None: no request in the window
    mean: float | None  # Δsum / Δcount; None: no request in the window
    requests: float  # observations in the window (Δcount)
    pods_read: int
    pods_without: tuple[str, ...]  # pods whose page prints none of `family`
    family: str  # the histograms that carry this kind, for messages
    # The quantile fell in the +Inf bucket: it is the highest finite bound, so the truth is at least it.
    above_highest_bound: bool = False
    # Requests over the target (interpolated within its bucket); None: no target given or no request.
    missed: float | None = None


def histogram_quantile(buckets: Mapping[float, float], q: float) -> tuple[float, bool] | None:
    """The q-quantile of cumulative bucket counts (upper bound → count), as Prometheus' histogram_quantile
    computes it: linear interpolation within the bucket the rank falls in (from 0 for the first bucket);
    in the +Inf bucket, the highest finite bound, flagged True. None without observations."""
    bounds = sorted(buckets)
    if not bounds or bounds[-1] != math.inf or len(bounds) < 2:
        return None
    counts, highest = [], 0.0
    for bound in bounds:
        # Increases summed over pods restarted at different times may dip: cumulative counts never do.
        highest = max(highest, buckets[bound])
        counts.append(highest)
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    index = next(i for i, count in enumerate(counts) if count >= rank)
    if index == len(bounds) - 1:
        return bounds[-2], True
    lower = bounds[index - 1] if index > 0 else 0.0
    below = counts[index - 1] if index > 0 else 0.0
    if index == 0 and bounds[0] <= 0:
        return bounds[0], False
    in_bucket = counts[index] - below
    return lower + (bounds[index] - lower) * (rank - below) / in_bucket, False


def count_above(buckets: Mapping[float, float], bound: float) -> float | None:
    """How many observations exceed `bound`, from cumulative bucket counts (upper bound → count): linear
    within the bucket `bound` falls in, as histogram_quantile interpolates; beyond the highest finite
    bound, the +Inf bucket's. None without observations."""
    bounds = sorted(buckets)
    if not bounds or bounds[-1] != math.inf:
        return None
    counts, highest = [], 0.0
    for upper in bounds:
        highest = max(highest, buckets[upper])  # sums over pods restarted apart may dip: counts never do
        counts.append(highest)
    total = counts[-1]
    if total <= 0:
        return None
    index = next(i for i, upper in enumerate(bounds) if upper >= bound)
    lower = bounds[index - 1] if index > 0 else 0.0
    below = counts[index - 1] if index > 0 else 0.0
    if bounds[index] == math.inf:
        return total - below
    share = (bound - lower) / (bounds[index] - lower) if bounds[index] > lower else 1.0
    return total - (below + (counts[index] - below) * max(0.0, share))


def _bound(text: str) -> float | None:
    try:
        return float(text)  # "+Inf" reads as inf
    except ValueError:
        return None


def latency_read(
    kind: str, pods: Mapping[str, Mapping[str, float]], q: float, target: float | None = None
) -> LatencyRead:
    """The `kind` latency of the pods' requests in the window: `pods` maps each pod to its history's
    increases (Track.latency); the buckets are summed over pods before the quantile is taken (pods whose
    bounds differ, two engine builds in a rolling update, on common bounds: see _on_common_bounds)."""
    per_pod: list[dict[float, float]] = []
    seconds = requests = 0.0
    read: list[str] = []
    without: list[str] = []
    for pod, increases in pods.items():
        if f"{kind}:count" not in increases:
            without.append(pod)
            continue
        read.append(pod)
        if increases[f"{kind}:count"] <= 0:
            continue  # no request in the window: its buckets (another build's bounds) must not cut the others'
        seconds += increases.get(f"{kind}:sum", 0.0)
        requests += increases[f"{kind}:count"]
        per_pod.append(
            {
                bound: increase
                for role, increase in increases.items()
                if role.startswith(f"{kind}{_LE}")
                and (bound := _bound(role[len(kind) + len(_LE) :])) is not None
            }
        )
    buckets = _on_common_bounds(per_pod)
    found = histogram_quantile(buckets, q) if requests > 0 else None
    # Beyond every finite bound the histograms cannot tell a miss from a request within the target.
    finite = [bound for bound in buckets if math.isfinite(bound)]
    reaches = target is not None and bool(finite) and max(finite) >= target
    missed = count_above(buckets, target) if requests > 0 and target is not None and reaches else None
    return LatencyRead(
        kind,
        q,
        None if found is None else found[0],
        seconds / requests if requests > 0 else None,
        requests,
        len(read),
        tuple(sorted(without)),
        ", ".join(LATENCY_FAMILIES[kind]),
        found is not None and found[1],
        missed,
    )


def _on_common_bounds(pods: Sequence[Mapping[float, float]]) -> dict[float, float]:
    """The pods' cumulative bucket counts summed on common bounds: every pod's finite bounds up to the
    lowest highest finite bound among them, each pod's count at a bound it does not print interpolated
    within its own bucket (as histogram_quantile interpolates), and +Inf. Summed bound by bound instead,
    a bound only some pods print would count only theirs: too few below it, made-up misses above."""
    if len(pods) <= 1:
        return dict(pods[0]) if pods else {}
    highest = [max((b for b in pod if math.isfinite(b)), default=None) for pod in pods]
    if any(h is None for h in highest):
        return {math.inf: math.fsum(pod.get(math.inf, 0.0) for pod in pods)}
    ceiling = min(h for h in highest if h is not None)
    bounds = sorted({b for pod in pods for b in pod if b <= ceiling} | {math.inf})
    return {bound: math.fsum(_count_at(pod, bound) for pod in pods) for bound in bounds}


def _count_at(buckets: Mapping[float, float], bound: float) -> float:
    """A pod's cumulative count at `bound` (at most its highest finite bound, or +Inf), linear within
    the bucket it falls in."""
    lower, below = 0.0, 0.0
    for upper in sorted(buckets):
        count = max(below, buckets[upper])  # increases of a pod restarted in the window may dip
        if upper >= bound:
            if upper == bound or not math.isfinite(upper):
                return count
            return below + (count - below) * (bound - lower) / (upper - lower)
        lower, below = upper, count
    return below


def late_observations(kind: str, increases: Mapping[str, float], target: float) -> float | None:
    """How many of one pod's `kind` observations in the window (Track.latency's increases) took longer
    than `target`: latency_read's count of misses, None where no finite bucket bound reaches the target
    or nothing was observed."""
    return latency_read(kind, {"pod": increases}, 0.5, target).missed


def overshoot(reads: Mapping[str, LatencyRead], slo: SloTarget | None) -> float | None:
    """The largest measured quantile ÷ its target over the SLO's targets with a read; None: none. A
    quantile in the +Inf bucket is beyond the highest finite bound: below the target, that says nothing; at
    the target, it is over it (read as 1 exactly, the guard did not act while every such request missed)."""
    if slo is None:
        return None
    ratios = [
        math.nextafter(read.quantile / target, math.inf)
        if read.above_highest_bound
        else read.quantile / target
        for kind, target in slo.targets().items()
        if (read := reads.get(kind)) is not None
        and read.quantile is not None
        and not (read.above_highest_bound and read.quantile < target)
    ]
    return max(ratios, default=None)


def guarded_value(
    value: float, ready_pods: int, threshold: float, reads: Mapping[str, LatencyRead], slo: SloTarget | None
) -> float:
    """`value` (a sum over pods, for an AverageValue target of `threshold` per pod), raised while the
    measured quantile is over its target so that the HPA adds replicas; never lowered.

    The rule: ready + extra pods, extra = the smallest step the HPA does not ignore (1, more than its
    tolerance on a large fleet), every sync while the quantile stays over; the next sync reads again. Not
    proportional to the overshoot: the quantile is interpolated in the engine's coarse buckets (vLLM's
    1–2.5 s around a 2 s target) and lags the pods already starting, so a proportional step up to doubling
    bought pods the demand did not need. On the simulator's developers' traces (seed 1, min 1, SLO 2 s /
    50 ms / 0.95) one step against proportional: step 24.0k GPU-s both (0.992), spike 16.8k (0.809)
    against 18.6k (0.818), day 125.2k against 125.9k (0.998), bursty 75.7k (0.689) against 80.1k (0.679),
    mix-shift 78.0k against 79.5k (0.994). decide() lets it act only once the last half hour's requests
    used the SLO's allowance of misses (spent_headroom() has the figures); alone, over ten minutes, that
    had saved 2.7 % on mix-shift and attained 0.011 less on bursty. Not kept: acting only when a window's
    misses exceed the SLO's share by more than sampling noise (mix-shift +3.4 %) (docs/BENCHMARKS.md).
    """
    if (ratio := overshoot(reads, slo)) is None or ratio <= 1 or ready_pods < 1:
        return value
    beyond_tolerance = math.floor(ready_pods * HPA_TOLERANCE) + 1
    return max(value, (ready_pods + beyond_tolerance) * threshold)


# Never size above twice the mean rate for variability alone: past that the latency guard, which reads
# what the requests actually waited, is the better evidence.
MAX_HEADROOM = 1.0


def headroom(slo: SloTarget | None, rates: Sequence[float]) -> float | None:
    """The share to add to the demand so that the SLO holds while the arrival rate varies: z × σ ÷ mean.

    Sizing for mean × (1 + z·σ/mean) = mean + z·σ covers the arrival rate in `attainment` of the
    intervals when it varies normally around its mean (the safety-stock rule): z is the normal quantile
    of the attainment (1.64 at 0.95). σ is the noise of the summed arrival rate, from its successive
    differences (von Neumann: σ² = Σ(xᵢ₊₁ − xᵢ)² ÷ 2(n − 1)), not the spread around the mean: a step or a
    daily trend is followed by the demand itself, and counting it as noise kept 10 minutes of up to
    100 % extra pods after every step. Chosen on the simulator's developers' traces (seed 1, min 1, SLO
    2 s / 50 ms / 0.95), against the spread: step 33.0k → 24.0k GPU-s (attainment 0.992 both), day
    152.9k → 125.9k (0.998), mix-shift 81.6k → 79.5k (0.995 → 0.994); where bursts are shorter than a
    cold start nothing meets it: spike 15.2k → 18.6k (0.795 → 0.818), bursty 85.1k → 80.1k (0.685 →
    0.679). MAX_HEADROOM at 0.5 gave the same on step, spike, day and mix-shift and less on bursty
    (0.613 at 76.5k): it stays 1. A steady rate needs none;
    bounded to [0, MAX_HEADROOM]. No SLO: 0. Fewer than two rates, or none arriving: None (not
    measured, never a made-up share).
    """
    if slo is None:
        return 0.0
    if len(rates) < 2 or (mean := statistics.fmean(rates)) <= 0:
        return None
    z = statistics.NormalDist().inv_cdf(slo.attainment)
    steps = [after - before for before, after in itertools.pairwise(rates)]
    noise = math.sqrt(math.fsum(step * step for step in steps) / (2 * len(steps)))
    return min(MAX_HEADROOM, max(0.0, z * noise / mean))


# The allowance of misses is judged from MIN_BUDGET_REQUESTS requests on: of fewer, one more or less
# moves a 5 % share too much to act on.
MIN_BUDGET_REQUESTS = 200.0
# The headroom is spent in proportion to the allowance used, but never below HEADROOM_FLOOR of it: a
# burst comes after calm half hours too, and the headroom is what it meets before new pods are up.
HEADROOM_FLOOR = 0.5


def budget_used(slo: SloTarget, windows: Sequence[tuple[float, float]]) -> float | None:
    """The share of the SLO's allowance of misses (1 − attainment) that recent windows used: missed ÷
    requests ÷ allowance, over (requests, requests over a target) per window. None: fewer than
    MIN_BUDGET_REQUESTS requests, not measured (never a made-up 0)."""
    requests = math.fsum(count for count, _ in windows)
    if requests < MIN_BUDGET_REQUESTS:
        return None
    return math.fsum(missed for _, missed in windows) / requests / (1 - slo.attainment)


def spent_headroom(share: float | None, used: float | None) -> float | None:
    """The headroom as far as the SLO needs it: all of it once the allowance is used up (or while that
    is not measured), in proportion to the allowance used below that, never under HEADROOM_FLOOR of it.

    Chosen on the simulator's developers' traces (seed 1, min 1, SLO 2 s / 50 ms / 0.95; this with the
    guard acting only once the allowance is spent, against both always on): step 24.0k → 23.6k GPU-s
    (0.992 both), day 125.2k → 123.2k (0.998 both), mix-shift 73.5k → 69.2k (0.994 → 0.993), bursty the
    same (75.7k, 0.689); spike, a first burst after a calm quarter hour, 16.8k → 17.6k at 0.809 → 0.791.
    Without the floor: mix-shift 67.7k, but bursty 0.681 and day 0.994. docs/BENCHMARKS.md has the rest.
    """
    if share is None or used is None:
        return share
    return share * max(HEADROOM_FLOOR, min(1.0, used))
