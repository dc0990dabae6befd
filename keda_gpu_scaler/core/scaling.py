"""Pure arithmetic: GPU readings → pod values → the workload value, missing pods, activation, HPA what-if."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from keda_gpu_scaler.core.errors import ConfigError, NoData
from keda_gpu_scaler.core.trigger import Aggregation, GpuAggregation, Metric, TriggerSpec
from keda_gpu_scaler.pages.engines import Missing, MissingKind, PodSamples, pod_reading, value_for
from keda_gpu_scaler.pages.vendors import Family, GpuReading, utilization_for

# Kubernetes' HPA leaves replicas alone while the usage ratio is within 10 % of 1.
HPA_TOLERANCE = 0.1
# Order in which one pod's families are preferred; a pod's value never mixes two families.
FAMILY_PRIORITY: tuple[Family, ...] = (Family.ACK, Family.NVIDIA, Family.AMD)


@dataclass(frozen=True, slots=True)
class GpuValue:
    gpu: str
    host: str
    value: float


@dataclass(frozen=True, slots=True)
class PodValue:
    pod: str
    family: str  # a GPU vendor family (Family), or the inference engine the page was read as
    value: float
    gpus: tuple[GpuValue, ...] = ()
    # Inference metrics: the pod's inputs as read (waiting, running, kvCache; None where not exported).
    inputs: tuple[tuple[str, float | None], ...] = ()

    @classmethod
    def from_row(cls, row: PodRow) -> PodValue:
        pod, value, count = row[0], row[2], row[3]
        family: str = row[1]
        inputs = tuple(zip(row[4 : 4 + 2 * count : 2], row[5 : 5 + 2 * count : 2], strict=True))
        rest = row[4 + 2 * count :]
        gpus = tuple(GpuValue(*rest[i : i + 3]) for i in range(0, len(rest), 3))
        return cls(pod, _FAMILIES.get(family, family), value, gpus, inputs)


# A PodValue as one flat tuple of strings and numbers (pod_row): how an Evaluation keeps its pods.
# Evaluations are kept per ScaledObject until the next one, long enough to reach the collector's older
# generations, where every tracked object slows each collection: with 100 pods a ScaledObject their
# PodValues and GpuValues made up nine tenths of the middle generation (collections of 30-50 ms with
# 50,000 pods under churn). Dataclass instances stay tracked for life; a tuple holding only strings and
# numbers is dropped from tracking by the first collection that looks at it. Flat, because one collection
# drops one level of nesting (it looks at an outer tuple before the tuples inside it).
PodRow = tuple[Any, ...]
ROW_VALUE = 2  # where a PodRow holds the pod's value
_FAMILIES: dict[str, Family] = {f.value: f for f in Family}


def pod_row(
    pod: str,
    family: str,
    value: float,
    gpus: Iterable[tuple[str, str, float]] = (),
    inputs: Iterable[tuple[str, float | None]] = (),
) -> PodRow:
    """A pod as one flat tuple: pod, family name, value, the number of inputs, then each input's name and
    value, then each GPU's id, host and value (PodValue.from_row reads it back)."""
    flat: list[Any] = [pod, str(family), value, 0]
    for name, input_value in inputs:
        flat += (name, input_value)
    flat[3] = (len(flat) - 4) // 2
    for gpu in gpus:
        flat += gpu
    return tuple(flat)


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The replicas an HPA would ask for given the returned value and the current replica count."""

    current_replicas: int
    average_value: int  # metricType AverageValue (KEDA's default): ceil(value / target)
    value: int  # metricType Value: ceil(ready × value / target)
    # The HPA's readyPodCount (Running and Ready: fresh and missing pods, not starting ones).
    ready_replicas: int = 0


@dataclass(frozen=True, slots=True)
class Evaluation:
    value: float
    active: bool
    aggregation: Aggregation
    pod_rows: tuple[PodRow, ...]  # pods with fresh data, as pod_row() made them (see PodRow)
    missing_pods: tuple[str, ...]  # target pods without fresh data
    missing_pod_value: float  # what each missing or starting pod counted as (0 or threshold)
    what_if: WhatIf
    starting_pods: tuple[str, ...] = ()  # the target's pods that exist but are not Ready yet
    rule: str = ""  # which SPEC §4 rule gave the value (a Rule), for /explain
    # Why activity cannot be told (the fresh pods idle while some pods are missing): IsActive answers
    # UNAVAILABLE with it, a stream keeps its last state; the value itself still answers GetMetrics.
    activity_unknown: str | None = None
    # Why the value cannot be told while activity can (SPEC §7: no EPP replica read holds a request, one
    # turned requests away, and another cannot be read): GetMetrics answers UNAVAILABLE with it.
    value_unknown: str | None = None

    @property
    def pods(self) -> tuple[PodValue, ...]:
        """The pods with fresh data (made from the rows on each call: for /explain and tests, not hot paths)."""
        return tuple(PodValue.from_row(row) for row in self.pod_rows)


def pod_values(
    readings: Iterable[GpuReading], spec: TriggerSpec, without_value: dict[str, str] | None = None
) -> dict[str, PodRow]:
    """One value per pod: the pod's GPUs of its preferred family, combined with gpuAggregation; why a pod
    read has none goes into `without_value` where given.

    The family is chosen from the series the pod has, whether or not they carry this metric's value: a
    pod with ACK series whose memory is not known has no value (a missing pod), never NVIDIA's device-level
    series, which on a shared GPU are the whole GPU, every sharing pod's (SPEC §4: one family per pod).

    Rows, not PodValues: this runs for every target pod on every evaluation (100 pods a ScaledObject are
    common), and a frozen dataclass costs a few µs to build where a tuple costs a tenth of one."""
    allowed = spec.vendor.families
    memory = spec.metric is Metric.MEMORY
    field = spec.nvidia_field
    by_pod: dict[str, dict[Family, dict[str, tuple[str, str, float]]]] = {}
    for reading in readings:
        if reading.family not in allowed:
            continue
        gpus = by_pod.setdefault(reading.pod, {}).setdefault(reading.family, {})
        value = reading.memory if memory else utilization_for(reading, field)
        if value is not None:
            # Keyed by GPU so the same GPU reported twice (e.g. by two scrapes of one page) counts once.
            gpus[reading.gpu] = (reading.gpu, reading.host, value)
    take_max = spec.gpu_aggregation is GpuAggregation.MAX
    result: dict[str, PodRow] = {}
    for pod, families in by_pod.items():
        family = (
            next(iter(families)) if len(families) == 1 else next(f for f in FAMILY_PRIORITY if f in families)
        )
        chosen = families[family].values()
        if not chosen:  # its family has no value for this metric: a missing pod
            if without_value is not None:
                without_value[pod] = f"its {family.value} series carry no {spec.metric.value} value"
            continue
        values = [gpu[2] for gpu in chosen]
        combined = max(values) if take_max else sum(values) / len(values)
        result[pod] = pod_row(pod, family, combined, chosen)
    return result


def inference_pod_values(
    pages: Iterable[PodSamples], spec: TriggerSpec
) -> tuple[dict[str, PodRow], dict[str, str]]:
    """One value per pod from its inference-server series (SPEC §6), and why the other pods have none.

    A pod whose page lacks what the metric needs (a vLLM server whose engine has not started, a model
    filter that matches nothing) is a missing pod, never a 0. An engine recognised by `auto` that never
    exports what the metric needs is not a gap in data but a trigger that cannot work: NoData naming it.
    """
    values: dict[str, PodRow] = {}
    problems: dict[str, str] = {}
    for page in pages:
        reading = pod_reading(page.samples, spec.engine, spec.model)
        value = value_for(reading, spec.metric.value)
        if isinstance(value, Missing):
            if value.kind is MissingKind.MODEL_CASE:
                raise ConfigError(f"metadata model: pod {page.pod}: {value.reason}")
            if value.kind is MissingKind.NOT_EXPORTED:
                raise NoData(f"pod {page.pod}: {value.reason}")
            problems[page.pod] = value.reason
            continue
        inputs = (
            (name, None if isinstance(v, Missing) else v)
            for name, v in (
                ("running", reading.running),
                ("waiting", reading.waiting),
                ("kvCache", reading.kv_cache),
            )
        )
        engine = reading.engine.value if reading.engine is not None else "unknown"
        values[page.pod] = pod_row(page.pod, engine, value, (), inputs)
    return values, problems


def aggregate(values: Collection[float], aggregation: Aggregation) -> float:
    if not values:
        return 0.0
    if aggregation is Aggregation.SUM:
        return math.fsum(values)
    if aggregation is Aggregation.MEAN:
        return math.fsum(values) / len(values)
    return max(values)


def hpa_desired_replicas(
    value: float,
    target: float,
    current: int,
    *,
    average_value: bool,
    tolerance: float = HPA_TOLERANCE,
    ready: int | None = None,
) -> int:
    """The HPA's formula for an External metric: the one place it is written.

    AverageValue (KEDA's default): ceil(value / target). Value: ceil(ready × value / target), `ready`
    the pods Running and Ready (its getReadyPodsCount; `current` when not given). Replicas stay as they
    are while the usage ratio is within `tolerance` of 1, and never go below 1 (only KEDA's activation
    reaches zero).
    """
    ratio = value / (target * current) if average_value and current > 0 else value / target
    if current > 0 and abs(ratio - 1) <= tolerance:
        return current
    wanted = value / target if average_value else (current if ready is None else ready) * value / target
    return max(1, math.ceil(wanted))


def desired_replicas_average_value(value: float, target: float, current: int) -> int:
    return hpa_desired_replicas(value, target, current, average_value=True)


def desired_replicas_value(value: float, target: float, current: int, ready: int) -> int:
    return hpa_desired_replicas(value, target, current, average_value=False, ready=ready)


class Rule:
    """Which SPEC §4 rule gave the value (shown in /explain)."""

    ALL_FRESH = "every target pod fresh: the fresh pods' value"
    SCALED_TO_ZERO = "no target pod and no replica: 0, inactive"
    SCALE_UP = "scale-up (u > 1): max(S, N × T); missing and starting pods count 0, N × T is the floor"
    HOLD = "no scale-up (u ≤ 1): S + (M + U) × T; missing and starting pods count as the target"


def evaluate(
    reporting: dict[str, PodRow],
    missing: Collection[str],
    spec: TriggerSpec,
    aggregation: Aggregation,
    starting: Collection[str] = (),
) -> Evaluation:
    """The workload value over the target pods (SPEC §4, missing data), with the HPA's own missing-pod rule.

    reporting: the Ready target pods with fresh data; missing: Ready target pods without; starting: the
    target's pods that exist but are not Ready yet (pulling an image, loading a model). With S the fresh
    pods' sum, nR their count, M missing, U starting, N = nR + M + U, T the threshold and u = S / (nR × T):
    u > 1 → max(S, N × T); u ≤ 1 → S + (M + U) × T; `mean` divides by the Ready pods nR + M, which the
    HPA multiplies a Value metric back by (its readyPodCount): divided by N, each starting pod made the
    HPA ask for fewer replicas than exist, and the ReplicaSet removes unready pods first. Activity is decided on the fresh
    pods alone: a missing pod can neither wake a workload nor hold it awake.

    Raises NoData when fewer than half of the Ready target pods, or none, have fresh data, and when pods
    exist but none is Ready (a model loading must never read as 0: KEDA would scale it to zero). When the
    fresh pods are at or below the activation threshold while some pods are missing, the value stands (it
    never scales down) but activity cannot be told: `activity_unknown` says why (IsActive: UNAVAILABLE).
    """
    missing = tuple(sorted(set(missing) - reporting.keys()))
    starting = tuple(sorted(set(starting) - reporting.keys() - set(missing)))
    ready = len(reporting) + len(missing)
    pods = tuple(reporting[name] for name in sorted(reporting))
    what = "inference-server" if spec.metric.inference else "GPU"
    if ready == 0:
        if starting:
            raise NoData(
                f"no target pod is Ready: {len(starting)} starting ({_names(starting)}); the value cannot be"
                " told until one is Ready, and 0 would let KEDA scale the workload to zero while it starts"
            )
        return _result(0.0, False, spec, aggregation, pods, missing, starting, 0.0, Rule.SCALED_TO_ZERO)
    if not reporting or 2 * len(reporting) < ready:
        raise NoData(
            f"only {len(reporting)} of {ready} Ready target pods have fresh {what} data"
            f" (missing: {_names(missing)}); at least half are needed"
        )
    reported = [p[ROW_VALUE] for p in pods]
    fresh_value = aggregate(reported, aggregation)
    active = fresh_value > spec.activation_threshold
    unknown = None
    if missing and not active:
        unknown = (
            f"the fresh pods' value {fresh_value:g} is at or below activationThreshold"
            f" {spec.activation_threshold:g} while {len(missing)} Ready target pods have no fresh {what}"
            f" data ({_names(missing)}): whether the workload is idle cannot be told"
        )
    if not missing and not starting:
        return _result(
            fresh_value, active, spec, aggregation, pods, missing, starting, 0.0, Rule.ALL_FRESH, unknown
        )
    total = ready + len(starting)
    threshold = spec.threshold
    if aggregation is Aggregation.MAX:
        # A per-pod maximum: over target it asks for more on its own; at or under it, an unread pod may be
        # the one at target, so it counts as exactly the target.
        if fresh_value > threshold:
            return _result(
                fresh_value, active, spec, aggregation, pods, missing, starting, 0.0, Rule.SCALE_UP, unknown
            )
        return _result(
            threshold, active, spec, aggregation, pods, missing, starting, threshold, Rule.HOLD, unknown
        )
    fresh_sum = math.fsum(reported)
    if fresh_sum > len(reporting) * threshold:
        value, fill, rule = max(fresh_sum, total * threshold), 0.0, Rule.SCALE_UP
    else:
        value = fresh_sum + (len(missing) + len(starting)) * threshold
        fill, rule = threshold, Rule.HOLD
    if aggregation is Aggregation.MEAN:
        value /= ready
    return _result(value, active, spec, aggregation, pods, missing, starting, fill, rule, unknown)


def _names(pods: tuple[str, ...]) -> str:
    return ", ".join(pods[:10]) + (" …" if len(pods) > 10 else "")


def _result(
    value: float,
    active: bool,
    spec: TriggerSpec,
    aggregation: Aggregation,
    pods: tuple[PodRow, ...],
    missing: tuple[str, ...],
    starting: tuple[str, ...],
    fill: float,
    rule: str,
    activity_unknown: str | None = None,
) -> Evaluation:
    ready = len(pods) + len(missing)
    current = ready + len(starting)
    what_if = WhatIf(
        current_replicas=current,
        average_value=desired_replicas_average_value(value, spec.threshold, current),
        value=desired_replicas_value(value, spec.threshold, current, ready),
        ready_replicas=ready,
    )
    return Evaluation(
        value=value,
        active=active,
        aggregation=aggregation,
        pod_rows=pods,
        missing_pods=missing,
        missing_pod_value=fill,
        what_if=what_if,
        starting_pods=starting,
        rule=rule,
        activity_unknown=activity_unknown,
    )
