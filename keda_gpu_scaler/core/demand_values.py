"""`metric: demand` over a target's pods (SPEC §6): each fresh pod's rate from its track, and the pool's
pending requests added (no I/O: decide() hands in each pod page's track and what the gateway pages say)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from keda_gpu_scaler.core.demand import DemandPoint, DemandUnit, pending_demand, pod_demand
from keda_gpu_scaler.core.errors import ConfigError, NoData
from keda_gpu_scaler.core.scaling import (
    ROW_VALUE,
    Evaluation,
    PodRow,
    WhatIf,
    desired_replicas_average_value,
    desired_replicas_value,
    pod_row,
)
from keda_gpu_scaler.core.snapshot import Track
from keda_gpu_scaler.core.trigger import Aggregation, TriggerSpec
from keda_gpu_scaler.pages.engines import Missing, MissingKind

# demandUnit tokens: each pod's rate in requests per second, kept beside its value (an input /explain
# shows) so that the pool's pending requests can be weighed at the pods' own tokens per request.
REQUESTS_PER_SECOND = "requestsPerSecond"
# Inputs that mark a pod's value as assumed, not measured: counted as the mean of the others (no rate yet),
# or sized without a finished request. Such a value sizes the fleet, but is no sample of what a pod served.
MEAN_OF_OTHERS, SIZE_ASSUMED = "meanOfOthers", "sizeAssumed"


def is_measured(row: PodRow) -> bool:
    """Whether a demand row's value is the pod's own measured rate (see MEAN_OF_OTHERS, SIZE_ASSUMED)."""
    inputs = row[4 : 4 + 2 * row[3] : 2]
    return MEAN_OF_OTHERS not in inputs and SIZE_ASSUMED not in inputs


def demand_pod_values(
    tracks: Iterable[tuple[str, Track]],
    spec: TriggerSpec,
    tokens_per_request: float | None = None,
) -> tuple[dict[str, PodRow], dict[str, str], tuple[str, ...]]:
    """Each fresh pod's rate (rows for evaluate()) from its page's track over the window, why the other
    pods are missing, and notes.

    A pod whose newest page gives no point (a NaN or negative counter, a family gone, an engine not
    started) is missing: never a made-up rate. A Ready pod with a page but no rate yet (one page within
    the window) counts as the mean rate of the others (SPEC §6); if none has a rate, NoData. Any other pod
    without a rate is missing too (SPEC §4: a gap in data never scales down): with `demandUnit: tokens`,
    one whose requests arrive but none finished within the window has pages enough, and counted as the
    mean of an idle neighbour it read a busy pod as that neighbour's 50 tokens/s (2 replicas → 1). An
    engine that never exports a counter of finished requests (recognised by `auto`) is NoData naming it.

    `demandUnit: tokens` with `inferencePool`: a pod taking requests of which none finished within the
    window (a burst of long requests) is sized at `tokens_per_request`, the last the pods measured, else
    at one replica's worth (the threshold), so the pending part still sizes on top of it rather than the
    whole answer turning UNAVAILABLE while requests pile up.
    """
    rates: dict[str, tuple[float, str, int, float]] = {}
    request_rates: dict[str, float] = {}  # demandUnit tokens: the same pods' rates in requests per second
    without_rate: dict[str, tuple[str, str, int]] = {}
    problems: dict[str, str] = {}
    unfinished: list[str] = []  # pods taking requests of which none finished (sized, see above)
    for pod, track in tracks:
        if track.problem is not None:
            if track.problem.kind is MissingKind.MODEL_CASE:
                raise ConfigError(f"metadata model: pod {pod}: {track.problem.reason}")
            if track.problem.kind is MissingKind.NOT_EXPORTED:
                raise NoData(f"pod {pod}: {track.problem.reason}; metric demand cannot be served")
            problems[pod] = track.problem.reason
            continue
        if spec.demand_unit is not DemandUnit.REQUESTS and track.tokens_problem is not None:
            problems[pod] = track.tokens_problem.reason  # a NaN token counter: this pod's gap, a missing pod
            continue
        points = track.points
        rate = pod_demand(points, spec.demand_unit, spec.prefill_weight)
        if isinstance(rate, Missing) and rate.kind is MissingKind.NO_RATE and spec.inference_pool:
            rate = _sized_without_finishes(points, spec, tokens_per_request, rate)
            if not isinstance(rate, Missing):
                unfinished.append(pod)  # its value is no measure of tokens per request
        if isinstance(rate, Missing):
            if rate.kind is MissingKind.NOT_EXPORTED:
                raise NoData(f"pod {pod}: {rate.reason}")
            if len(points) < 2 or points[-1].at <= points[0].at:  # one page: no rate yet
                without_rate[pod] = (rate.reason, track.engine, track.used)
            else:
                problems[pod] = rate.reason
            continue
        span = points[-1].at - points[0].at
        rates[pod] = (rate, track.engine, track.used, span)
        if spec.demand_unit is not DemandUnit.REQUESTS and pod not in unfinished:
            requests = pod_demand(points, DemandUnit.REQUESTS)
            if not isinstance(requests, Missing):
                request_rates[pod] = requests
    rows = {
        pod: pod_row(
            pod,
            engine,
            rate,
            (),
            (("samplesUsed", float(used)), ("spanSeconds", span))
            + (((REQUESTS_PER_SECOND, request_rates[pod]),) if pod in request_rates else ())
            + (((SIZE_ASSUMED, 1.0),) if pod in unfinished else ()),
        )
        for pod, (rate, engine, used, span) in rates.items()
    }
    notes: tuple[str, ...] = ()
    if unfinished:
        how = (
            f"their requests per second × the {tokens_per_request:.0f} tokens per request measured earlier"
            if tokens_per_request is not None
            else "one replica's worth (no pod has measured tokens per request yet)"
        )
        notes = (
            f"{len(unfinished)} pod(s) took requests of which none finished within the window; they count"
            f" as {how}: {', '.join(sorted(unfinished)[:10])}",
        )
    if without_rate:
        if not rates:
            reasons = "; ".join(f"{pod}: {why}" for pod, (why, _, _) in sorted(without_rate.items())[:5])
            raise NoData(
                f"no target pod has a rate yet (a rate needs two pages within window {spec.window:g}s): {reasons}"
            )
        mean = math.fsum(rate for rate, _, _, _ in rates.values()) / len(rates)
        for pod, (_, engine, used) in without_rate.items():
            rows[pod] = pod_row(pod, engine, mean, (), (("samplesUsed", float(used)), (MEAN_OF_OTHERS, 1.0)))
        notes += (
            f"{len(without_rate)} Ready pod(s) without a rate yet count as the mean of the others"
            f" ({mean:g}): {', '.join(sorted(without_rate)[:10])}",
        )
    return rows, problems, notes


def _sized_without_finishes(
    points: Sequence[DemandPoint], spec: TriggerSpec, tokens_per_request: float | None, missing: Missing
) -> float | Missing:
    """demandUnit tokens: a pod whose requests arrive but none finished within the window, weighed at
    the tokens per request measured earlier, else one replica's worth; `missing` where it has no rate."""
    if spec.demand_unit is DemandUnit.REQUESTS or len(points) < 2:
        return missing
    requests = pod_demand(points, DemandUnit.REQUESTS)
    if isinstance(requests, Missing):
        return missing
    return spec.threshold if tokens_per_request is None else requests * tokens_per_request


def with_pending(
    evaluation: Evaluation,
    spec: TriggerSpec,
    growth: float,
    held: float,
    tokens_per_request: float | None = None,
    woken: bool = False,
) -> tuple[Evaluation, str, float]:
    """The pods' demand with what the pool's pending requests add (SPEC §6 with `inferencePool`), a note,
    and that demand S + pending as a sum over pods (before any floor: what a latency target's headroom is for).

    `held`: the requests the pool holds now; `growth`: their growth per second over the window, at the
    gateway pages' times. The pending part sizes on top of the FRESH pods' demand S, never on top of the
    floor SPEC §4 puts under missing and starting pods (those pods serve the same queue once up: adding
    the two asked for two more replicas at every sync): value = max(floor, S + pending), per pod for a
    mean; for a per-pod maximum, max(floor, the busiest fresh pod + each Ready pod's share of pending)
    (adding the pods' sum made `aggregation: max` a sum beside a note saying max). The demand returned
    is the fresh pods' as a sum (fresh_demand()) plus pending. With `demandUnit: tokens` pending requests
    are weighed at `tokens_per_request` (the pods' own,
    else the last they measured; None when never: then they ask for exactly one replica's worth, the
    wake). The pending part counts toward activity as S does (SPEC §4: S plus pending), so a pool at zero
    holding requests wakes and asks for at least one replica; so does `woken`, the pool turning requests
    away since its last page (SPEC §7's wake) while it holds none.
    """
    extra = pending_demand(growth, held, spec.window)
    weighed = ""
    if spec.demand_unit is not DemandUnit.REQUESTS and extra > 0:
        if tokens_per_request is not None:
            extra *= tokens_per_request
            weighed = f", weighed at the pods' {tokens_per_request:.0f} tokens per request"
        else:
            extra = spec.threshold
            weighed = ": no pod measures their tokens yet, so they ask for one replica's worth"
    current, ready = evaluation.what_if.current_replicas, evaluation.what_if.ready_replicas
    fresh = math.fsum(row[ROW_VALUE] for row in evaluation.pod_rows)
    busiest = max((row[ROW_VALUE] for row in evaluation.pod_rows), default=0.0)
    sized = fresh + extra
    # A per-pod mean (metricType Value) carries the workload's value per Ready pod: the HPA multiplies it
    # back by its ready pods. A per-pod maximum: the busiest pod, each Ready pod taking its share.
    if evaluation.aggregation is Aggregation.MEAN and ready > 0:
        sized /= ready
    elif evaluation.aggregation is Aggregation.MAX:
        sized = busiest + extra / ready if ready > 0 else extra
    value = max(evaluation.value, sized)
    what_if = WhatIf(
        current_replicas=current,
        average_value=desired_replicas_average_value(value, spec.threshold, current),
        value=desired_replicas_value(value, spec.threshold, current, ready),
        ready_replicas=ready,
    )
    # Activity on S (the fresh pods' own sum, never the value missing pods were filled into) plus pending;
    # for a per-pod maximum on the busiest pod plus pending, as evaluate() decides it without a pool.
    own = busiest if evaluation.aggregation is Aggregation.MAX else fresh
    active = evaluation.active or own + extra > spec.activation_threshold or woken
    # Requests held at the gateway say "active" whatever the missing pods hold; idle is still unknown.
    unknown = None if active else evaluation.activity_unknown
    on_top = (
        f"the busiest fresh pod's {busiest:g}, each of the {ready} Ready pods taking its share"
        if evaluation.aggregation is Aggregation.MAX and ready > 0
        else f"the fresh pods' {fresh:g}"
    )
    note = (
        f"InferencePool {spec.inference_pool}: {held:g} pending requests add {extra:g}/s (their growth and"
        f" what clears them within {spec.window:g}s){weighed}, on top of {on_top}"
        f" (value: the larger of that and the missing-pod floor {evaluation.value:g})"
    )
    replaced = dataclasses.replace(
        evaluation, value=value, active=active, what_if=what_if, activity_unknown=unknown
    )
    return replaced, note, fresh_demand(evaluation) + extra


def fresh_demand(evaluation: Evaluation) -> float:
    """The fresh pods' demand as a sum over them (what a latency target's headroom multiplies): their
    sum; for a per-pod maximum, the busiest pod's for each (the sum that maximum stands for)."""
    values = [row[ROW_VALUE] for row in evaluation.pod_rows]
    if evaluation.aggregation is Aggregation.MAX:
        return max(values, default=0.0) * len(values)
    return math.fsum(values)


def measured_tokens_per_request(evaluation: Evaluation) -> float | None:
    """`demandUnit: tokens`: the fresh pods' weighted tokens per request over the window (their tokens per
    second over their requests per second), None when no pod took a request."""
    tokens = requests = 0.0
    for pod in evaluation.pods:
        per_second = dict(pod.inputs).get(REQUESTS_PER_SECOND)
        if per_second is not None and per_second > 0:
            tokens += pod.value
            requests += per_second
    return tokens / requests if requests > 0 else None
