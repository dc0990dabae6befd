"""The decision: a trigger's value and activity from its snapshot (SPEC §4, §6, §7). Pure: no I/O, no
clock, no logging; the caller records the Decision, logs what it asks to and shows it on /explain."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from keda_gpu_scaler.core.demand_values import (
    demand_pod_values,
    fresh_demand,
    measured_tokens_per_request,
    with_pending,
)
from keda_gpu_scaler.core.errors import ConfigError, NoData, quoted
from keda_gpu_scaler.core.latency import (
    LatencyRead,
    budget_used,
    guarded_value,
    headroom,
    latency_read,
    overshoot,
    spent_headroom,
)
from keda_gpu_scaler.core.pending import pending_evaluation
from keda_gpu_scaler.core.scaling import (
    Evaluation,
    PodRow,
    WhatIf,
    desired_replicas_average_value,
    desired_replicas_value,
    evaluate,
    inference_pod_values,
    pod_values,
)
from keda_gpu_scaler.core.slo import SloTarget
from keda_gpu_scaler.core.snapshot import Snapshot
from keda_gpu_scaler.core.trigger import Aggregation, Metric, TriggerSpec
from keda_gpu_scaler.core.wire import check_rows, check_total
from keda_gpu_scaler.pages.engines._common import ITL, TPOT


@dataclass(frozen=True, slots=True)
class SloReading:
    """What a latency target made of the demand, for /explain."""

    target: SloTarget
    headroom: float | None  # the share added for the arrival rate's variability; None: not measured
    reads: tuple[LatencyRead, ...]  # one per latency kind the SLO names
    demand: float  # the value before the SLO
    # The share of the SLO's allowance of misses the last half hour's windows used (1: all of it, or more);
    # None: too few requests yet to say.
    budget_used: float | None = None
    # What the headroom multiplies (a sum over pods): the fresh pods' demand, the pool's pending requests
    # and Ready pods without data at the threshold; never the floor of pods still starting.
    headroom_base: float | None = None


@dataclass(slots=True)
class Decision:
    """What decide() found: the evaluation or the error, and what /explain and the log show beside it.
    New shown fields (e.g. a latency reading) are new fields here."""

    evaluation: Evaluation | None = None
    error: NoData | ConfigError | None = None
    notes: tuple[str, ...] = ()  # for /explain
    to_log: list[tuple[str, int]] = field(default_factory=list)  # (note, level): once per ScaledObject
    aggregation_mismatch: bool = False  # metricType contradicts the trigger's aggregation (counted)
    tokens_per_request: float | None = None  # `demand` with a pool: measured now, to be remembered
    # `demand` with a pool: the requests its endpoint pickers hold now (flow control holds one only when
    # no pod has room: the pods are saturated); None where the pool was not read whole.
    pool_held: float | None = None
    slo: SloReading | None = None  # `demand` with a latency target: what it read and added


def decide(spec: TriggerSpec, snapshot: Snapshot) -> Decision:
    """The trigger's value now; a Decision carrying the error (UNAVAILABLE or INVALID_ARGUMENT) when it
    cannot be known or the trigger can never be served."""
    decision = Decision()
    try:
        if spec.metric.gateway:
            decision.evaluation = _pending(spec, snapshot, decision)
        else:
            decision.evaluation = _pods(spec, snapshot, decision)
    except (NoData, ConfigError) as error:
        decision.error, decision.notes = error, ()
    return decision


def aggregation_for(spec: TriggerSpec, metric_type: str | None) -> tuple[Aggregation, str | None]:
    """The aggregation to use and, when the trigger's explicit choice contradicts metricType, why that is wrong."""
    matching = Aggregation.MEAN if metric_type == "Value" else Aggregation.SUM
    if spec.aggregation is None:
        return (matching if metric_type else Aggregation.SUM), None
    if metric_type is None:
        return spec.aggregation, None
    fits = (spec.aggregation is Aggregation.SUM) == (metric_type == "AverageValue")
    if fits:
        return spec.aggregation, None
    return spec.aggregation, (
        f"aggregation={spec.aggregation.value} contradicts metricType={metric_type}: the HPA computes"
        f" {'ceil(value / target)' if metric_type == 'AverageValue' else 'ceil(pods × value / target)'},"
        f" which needs aggregation={matching.value}"
    )


def _pending(spec: TriggerSpec, snapshot: Snapshot, decision: Decision) -> Evaluation:
    """`pending` (SPEC §7): the pool's endpoint-picker replicas' queues."""
    pool = snapshot.pool
    assert pool is not None
    if pool.unreadable is not None:
        raise NoData(pool.unreadable)
    result = pending_evaluation(pool.replicas, spec, snapshot.namespace, pool.no_replica)
    decision.notes = result.notes
    decision.to_log += [(note, logging.INFO) for note in result.to_log]
    return result.evaluation


def _pods(spec: TriggerSpec, snapshot: Snapshot, decision: Decision) -> Evaluation:
    """The target pods' value (SPEC §4), with the pool's pending requests for `demand` (SPEC §6)."""
    targets, view = snapshot.targets, snapshot.view
    if view is None:
        # Scaled to zero with discovery healthy: 0 and inactive, whatever the sources say (SPEC §4),
        # but for the requests the gateway holds for a `demand` trigger's pool.
        # A target with pods that are not Ready yet is not at zero: evaluate() says UNAVAILABLE.
        assert targets is not None
        if targets.replicas is None and not targets.starting:
            # No /scale read since the pods went yet: a scale to zero cannot be told from pods evicted
            # while the target still asks for them (read as 0 and inactive until the read came back).
            raise NoData(
                "the target has no pod and its scale target's replicas are being read again since its"
                " pods went: never 0 until it says none are asked for"
            )
        if targets.replicas and not targets.starting:
            many = "replica" if targets.replicas == 1 else "replicas"
            what, why = (
                (
                    f"podSelector {quoted(spec.pod_selector)} selects",
                    "a typo, or labels its pods do not carry?",
                )
                if spec.pod_selector is not None
                else (
                    "there is",
                    "none was created or all were deleted: a ResourceQuota, an admission webhook"
                    " or a pod template error? See its ReplicaSet's events",
                )
            )
            raise NoData(
                f"{what} no pod while the scale target asks for {targets.replicas} {many} (its /scale"
                f" spec.replicas): {why}; never 0 while it has replicas"
            )
        aggregation = aggregation_for(spec, targets.metric_type)[0]
        at_zero = evaluate({}, (), spec, aggregation, targets.starting)
        at_zero = _add_pending(spec, snapshot, at_zero, decision)[0]
        # The pool's pending requests alone make this value: beyond the wire, UNAVAILABLE as on every path.
        check_total(
            at_zero.value, at_zero.pod_rows, f"from InferencePool {spec.inference_pool}'s pending requests"
        )
        return at_zero
    problems = _problems(spec, snapshot)
    if view.sources == 0:
        raise NoData(
            f"no {snapshot.kind.value} source is configured or discovered for namespace {snapshot.namespace!r}"
        )
    if view.fresh_sources == 0:
        raise NoData(f"no source has fresh data: {problems}")
    target_pods = snapshot.target_pods
    if targets is None and not target_pods:
        prefix = spec.pod_name_prefix or ""
        failing = view.problems or any(pod.startswith(prefix) for pod in view.pod_problems)
        if view.fresh_sources < view.sources and failing:
            # "Scaled to zero" is only an answer when every exporter could have named the pods: a failing
            # page of another workload's pod (not named by the prefix) could not have named them.
            raise NoData(
                f"no pod named {spec.pod_name_prefix or ''}* is in the data and not every exporter answers,"
                f" so zero pods cannot be told from an outage: {problems}"
            )
        if view.readings:
            note = _prefix_matching_nothing(spec, sorted({r.pod for r in view.readings}))
            decision.to_log.append((note, logging.INFO))
            decision.notes = (note,)
    aggregation, mismatch = aggregation_for(spec, targets.metric_type if targets else None)
    if mismatch:
        # Every new evaluation counts it; the log says it once per ScaledObject, not on every scrape.
        decision.to_log.append((mismatch, logging.WARNING))
        decision.aggregation_mismatch = True
        decision.notes += (mismatch,)
    reporting, without_value = _pod_rows(spec, snapshot, decision)
    if without_value:
        reasons = "; ".join(f"{pod}: {why}" for pod, why in sorted(without_value.items())[:5])
        problems = "; ".join(part for part in (_problems(spec, snapshot, without_value), reasons) if part)
    try:
        # A pod's value beyond what KEDA can carry is UNAVAILABLE naming it (never INTERNAL); each
        # within it, their sum is finite and checked below.
        check_rows(reporting.values())
        starting = targets.starting if targets is not None else ()
        evaluation = evaluate(reporting, target_pods - reporting.keys(), spec, aggregation, starting)
    except NoData as error:
        raise NoData(f"{error}{'; ' + problems if problems else ''}") from None
    evaluation, demand = _add_pending(spec, snapshot, evaluation, decision)
    if spec.metric is Metric.REQUESTS:
        evaluation = _gated_by_pool(spec, snapshot, evaluation, decision)
    elif spec.slo is not None:
        evaluation = _with_slo(spec, spec.slo, snapshot, evaluation, demand, decision)
    # The workload's value (the pool's pending requests added, for demand) may still be beyond it.
    check_total(evaluation.value, evaluation.pod_rows)
    return evaluation


def _problems(spec: TriggerSpec, snapshot: Snapshot, said: Collection[str] = ()) -> str:
    """The problems of the sources this trigger reads: each source not tied to one pod, then the pod pages
    it reads but those in `said`. With discovery those are the target's own pods'; without it those its
    podNamePrefix names. Another workload's pages are not its to name, unless the prefix names no page
    at all, failing or read (then every failing page: the names may show a typo)."""
    assert snapshot.view is not None
    view = snapshot.view
    pages = view.pod_problems
    if snapshot.targets is not None:
        pods = pages.keys() & snapshot.target_pods
    else:
        prefix = spec.pod_name_prefix or ""
        pods = {pod for pod in pages if pod.startswith(prefix)}
        read = {pod for reading in view.readings if isinstance(pod := getattr(reading, "pod", None), str)}
        if not pods and not any(pod.startswith(prefix) for pod in read):
            pods = set(pages)
    own = [f"{pod}: {pages[pod]}" for pod in sorted(pods - set(said))]
    return "; ".join([*view.problems, *own][:5])


def _pod_rows(
    spec: TriggerSpec, snapshot: Snapshot, decision: Decision
) -> tuple[dict[str, PodRow], dict[str, str]]:
    """Each reporting pod's row, and why the others have no value."""
    if spec.metric is Metric.DEMAND:
        size = snapshot.pool.tokens_per_request if snapshot.pool is not None else None
        reporting, without_value, notes = demand_pod_values(snapshot.tracks, spec, size)
        decision.notes += notes
        return reporting, without_value
    if spec.metric.inference:
        return inference_pod_values(snapshot.pods, spec)
    gpu_without: dict[str, str] = {}
    return pod_values(snapshot.gpu, spec, gpu_without), gpu_without


def _add_pending(
    spec: TriggerSpec, snapshot: Snapshot, evaluation: Evaluation, decision: Decision
) -> tuple[Evaluation, float | None]:
    """`demand` with `inferencePool`: the pods' demand plus the pool's pending requests (SPEC §6), and that
    demand as a sum over pods before SPEC §4's floors (None where no pending part was added).

    The pool cannot be read (its replicas failing, none known): the pods' demand alone where it
    already says active (a lower bound, noted), else NoData: the unread queue may hold the requests
    that should wake the workload."""
    pool = snapshot.pool
    if spec.metric is not Metric.DEMAND or pool is None:
        return evaluation, None
    if pool.unknown is not None:
        raise NoData(pool.unknown)  # even when the pods say active: a pool-name typo is no lower bound
    try:
        # Held requests are counted, not compared with activationThreshold: for `demand` it is a rate,
        # decided below on what they add (a count against a rate made a made-up `false`, or held a wake).
        pending = _held(dataclasses.replace(spec, activation_threshold=0.0), snapshot)
    except NoData as error:
        if evaluation.active:
            decision.notes += (
                f"value is a lower bound: the pool's pending requests cannot be read: {error}",
            )
            return evaluation, None
        raise
    growth = sum(pool.growth.get(row[0], 0.0) for row in pending.pod_rows)  # the replicas read now
    decision.pool_held = None if pending.missing_pods else pending.value
    measured = measured_tokens_per_request(evaluation)
    decision.tokens_per_request = measured
    size = measured if measured is not None else pool.tokens_per_request
    # Requests turned away while the pool holds none wake it as they wake `pending` (SPEC §7).
    woken = pending.active and pending.value <= 0
    evaluation, note, demand = with_pending(evaluation, spec, growth, pending.value, size, woken)
    decision.notes += (note,)
    if pending.missing_pods:
        evaluation = _unread_replicas(spec, evaluation, pending.missing_pods, decision)
    return evaluation, demand


def _unread_replicas(
    spec: TriggerSpec, evaluation: Evaluation, unread: Collection[str], decision: Decision
) -> Evaluation:
    """Some endpoint-picker replicas cannot be read: the pending part is a lower bound. Active on it is
    active; not active, whether the pool is idle cannot be told (they may hold requests): activity
    unknown, and with a value of 0 nothing is known at all (SPEC §7: never a made-up `false`)."""
    replicas = ", ".join(sorted(unread)[:5])
    decision.notes += (f"value is a lower bound: endpoint-picker replicas {replicas} cannot be read",)
    if evaluation.active and evaluation.value > 0:
        return evaluation
    if evaluation.active:  # woken by requests turned away: a wake, but a lower bound of 0 is no value
        why = f"a lower bound of 0: endpoint-picker replicas {replicas} of InferencePool {spec.inference_pool} cannot be read"
        return dataclasses.replace(evaluation, value_unknown=why)
    unknown = (
        f"the pods' demand and the requests the readable endpoint-picker replicas of InferencePool"
        f" {spec.inference_pool} hold come to {evaluation.value:g}, not above activationThreshold"
        f" {spec.activation_threshold:g}, and {replicas} cannot be read (they may hold requests)"
    )
    if evaluation.value <= 0:
        raise NoData(unknown)
    return dataclasses.replace(evaluation, activity_unknown=unknown)


def _held(spec: TriggerSpec, snapshot: Snapshot) -> Evaluation:
    """The pool's pending requests as another trigger (`demand`, the `requests` guard) reads them: only
    where what they say is known whole. A lower bound whose activity cannot be told (some replica unread,
    the others at or below activationThreshold) is NoData here: it could neither hold a workload awake
    nor say it is idle; so is an inactive lower bound of 0 (a replica unread): counted as 0, a workload
    at zero read inactive while the unread replica may hold its requests."""
    pool = snapshot.pool
    assert pool is not None
    if pool.unreadable is not None:
        raise NoData(pool.unreadable)
    held = pending_evaluation(pool.replicas, spec, snapshot.namespace, pool.no_replica).evaluation
    if held.activity_unknown is not None:
        raise NoData(held.activity_unknown)
    if held.value_unknown is not None and not held.active:
        raise NoData(held.value_unknown)
    # Active on a lower bound of 0 (requests turned away on a replica read, another unread): a wake.
    return held


def _gated_by_pool(
    spec: TriggerSpec, snapshot: Snapshot, evaluation: Evaluation, decision: Decision
) -> Evaluation:
    """`requests` with `inferencePool`: the guard asks for replicas only while the pods are saturated —
    the pool's endpoint pickers hold requests (flow control holds one only when no pod has room) or, with
    a latency target, the pods' requests miss it once the last half hour's allowance of misses is spent;
    else its value is 0, which asks for none and leaves the sizing to the other triggers.

    Why: what a pod holds in flight at its latency target depends on the mix (about 50 for chat, 190 for
    300-token answers), so a guard at 64 asked for 3× the pods short answers need while nothing waited.
    Saturated, the same guard asks for pods sooner than the demand does (a day climbing faster than
    nodes arrive), and missing the target it holds up a threshold set too high. Measured in
    docs/BENCHMARKS.md. The pool's queue not readable: the guard acts as without the pool (noted), never
    made quiet by an outage. Activity is unchanged: pods with requests in flight are serving."""
    pool = snapshot.pool
    if pool is None:
        return evaluation
    if pool.unknown is not None:
        raise NoData(pool.unknown)  # a pool-name typo must not leave the guard quiet for good
    # Read whatever the pool says: the window's misses count in the allowance while the pool is unread too.
    missed = spec.slo is not None and _latency_missed(spec.slo, snapshot, evaluation, decision)
    try:
        held = _held(spec, snapshot)
    except NoData as error:
        decision.notes += (
            f"the guard acts whatever the pool holds: its pending requests cannot be read: {error}",
        )
        return evaluation
    pool_name = f"InferencePool {spec.inference_pool}"
    holding = held.value > 0 or held.active  # held now, or turned away since the last page
    if holding or missed:
        why = f"holds {held.value:g} requests" if holding else "holds none"
        why += ", and the requests miss the latency target" if missed else ""
        decision.notes += (f"{pool_name} {why}: the pods are saturated, the guard acts",)
        return evaluation
    decision.notes += (
        f"{pool_name} holds no request{_latency_said(decision)}: the pods are not saturated, so the guard"
        f" asks for no replica (value 0; the pods hold {evaluation.value:g} in flight)",
    )
    return _with_value(evaluation, spec, 0.0)


def _latency_said(decision: Decision) -> str:
    """What the guard's note says of the latency target: held only where a quantile was read."""
    if decision.slo is None:
        return ""
    if all(read.quantile is None for read in decision.slo.reads):
        return " and no fresh pod's latency was read in the window"
    return " and the latency target holds"


def _latency_missed(slo: SloTarget, snapshot: Snapshot, evaluation: Evaluation, decision: Decision) -> bool:
    """Whether the fresh pods' measured quantile is over its target once the allowance is spent (or while
    it is not measured): when the latency guard of `demand` acts too (_with_slo). The reading goes on the
    decision for /explain and the allowance's windows."""
    reads = _latency_reads(slo, snapshot, evaluation)
    used = budget_used(slo, snapshot.recent_latency)
    decision.slo = SloReading(slo, 0.0, tuple(reads.values()), evaluation.value, used)
    ratio = overshoot(reads, slo)
    return ratio is not None and ratio > 1 and (used is None or used >= 1)


def _latency_reads(slo: SloTarget, snapshot: Snapshot, evaluation: Evaluation) -> dict[str, LatencyRead]:
    """Each latency kind the SLO names, read over the fresh pods' histograms in the window. The time per
    output token is read apart as requests' means (TPOT) and as gaps between tokens (ITL), each where a
    pod prints it; with neither printed, the TPOT read says which pods print none."""
    fresh = {row[0] for row in evaluation.pod_rows}
    latency = {pod: track.latency for pod, track in snapshot.tracks if pod in fresh}
    reads = {kind: latency_read(kind, latency, slo.attainment, t) for kind, t in slo.targets().items()}
    if ITL in reads and not reads[ITL].pods_read:
        del reads[ITL]
    elif ITL in reads and not reads[TPOT].pods_read:
        del reads[TPOT]
    return reads


def _with_slo(
    spec: TriggerSpec,
    slo: SloTarget,
    snapshot: Snapshot,
    evaluation: Evaluation,
    pooled: float | None,
    decision: Decision,
) -> Evaluation:
    """The demand with the headroom the arrival rate's variability asks for, raised further while the
    fresh pods' measured latency quantile is over its target (latency.py); never lowered. Both as far as
    the SLO needs them: the headroom in proportion to the allowance of misses the last half hour used
    (at least HEADROOM_FLOOR of it), the guard once that allowance is spent."""
    reads = _latency_reads(slo, snapshot, evaluation)
    used = budget_used(slo, snapshot.recent_latency)
    share = spent_headroom(headroom(slo, snapshot.recent_demand), used)
    pods = evaluation.what_if.ready_replicas
    # guarded_value works on the workload's sum; a per-pod mean or maximum (metricType Value) is taken as
    # that sum ÷ Ready pods, which the HPA multiplies back (a maximum was raised as a sum: max 4, 4 → 8).
    per_pod = evaluation.aggregation is not Aggregation.SUM and pods > 0
    floored = evaluation.value * pods if per_pod else evaluation.value
    # The headroom is for the demand: the fresh pods' (and the pool's pending requests), Ready pods
    # without data at the target as SPEC §4 counts them. Never for the floor that holds pods still
    # starting: multiplied too, each sync asked for (1 + headroom) × the pods already asked for while
    # they started (3 Ready pods over target became 20 replicas in 90 s in the simulator).
    # `pooled`: the fresh pods' demand with the pool's pending requests (_add_pending), when it added them.
    missing = len(evaluation.missing_pods)
    demand = (pooled if pooled is not None else fresh_demand(evaluation)) + missing * spec.threshold
    total = max(floored, demand * (1 + (share or 0.0)))
    if used is None or used >= 1:  # the guard acts once the allowance is spent (or while not measured)
        # One pod over the Ready ones, whose latency it read: pods still starting are not in that read,
        # and counted they made it ask one more every sync until they were up (1 Ready pod → 9 replicas).
        total = guarded_value(total, len(evaluation.pod_rows) + missing, spec.threshold, reads, slo)
    decision.slo = SloReading(slo, share, tuple(reads.values()), evaluation.value, used, demand)
    return _with_value(evaluation, spec, total / pods if per_pod else total)


def _with_value(evaluation: Evaluation, spec: TriggerSpec, value: float) -> Evaluation:
    """The evaluation with another value, and the replicas the HPA would ask for at it."""
    if value == evaluation.value:
        return evaluation
    current, ready = evaluation.what_if.current_replicas, evaluation.what_if.ready_replicas
    what_if = WhatIf(
        current,
        desired_replicas_average_value(value, spec.threshold, current),
        desired_replicas_value(value, spec.threshold, current, ready),
        ready,
    )
    return dataclasses.replace(evaluation, value=value, what_if=what_if)


# A podNamePrefix shorter than this matching no pod is a workload at zero, never taken for a typo.
MIN_TYPO_PREFIX = 3


def _prefix_matching_nothing(spec: TriggerSpec, pods: list[str]) -> str:
    """The note for a podNamePrefix no pod of the namespace's pages has (legitimately 0: scaled to zero).

    NoData instead when the prefix is close to pods the pages do name: far likelier a typo than a
    workload at zero beside a near-namesake, and a typo must not read as 0 (KEDA would scale to zero)."""
    prefix = spec.pod_name_prefix or ""
    what = "inference-server" if spec.metric.inference else "GPU"
    # Close: a pod's name begins with the prefix but for one letter (two, for prefixes over 4 letters)
    # dropped, added or changed. A similarity ratio let short ones through: `vlm-` for vllm-0 read 0.
    # Prefixes and heads of 3 letters or more: any one letter is one change from any other, and `db` was
    # "close to deepseek-0" (its `d`), a workload at zero UNAVAILABLE.
    edits = 1 if len(prefix) <= 4 else 2
    shortest = max(MIN_TYPO_PREFIX, len(prefix) - edits)
    lengths = range(shortest, len(prefix) + edits + 1) if len(prefix) >= MIN_TYPO_PREFIX else range(0)
    close = [pod for pod in pods if any(_edits(prefix, pod[:n]) <= edits for n in lengths)][:3]
    if close:
        raise NoData(
            f"metadata podNamePrefix {prefix!r} matches none of the namespace's {what} pods, but is close to"
            f" {', '.join(close)}: a typo? Pods read: {_listed(pods)}. (A workload at zero reads 0 only when"
            " its prefix is not that close to another's: rename it, or use Kubernetes discovery)"
        )
    return f"podNamePrefix {prefix!r} matches none of the namespace's {what} pods: {_listed(pods)}"


def _edits(a: str, b: str) -> int:
    """The letters to drop, add or change to make `a` into `b` (Levenshtein distance)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def _listed(names: list[str], limit: int = 10) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
