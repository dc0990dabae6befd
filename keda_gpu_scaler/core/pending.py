"""Pure arithmetic of `metric: pending` (SPEC §7): EPP replicas' queues → the pool's value and activity.

No I/O and no clock: the caller says which replicas are fresh (with their samples) and why the others
are not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from keda_gpu_scaler.core.errors import ConfigError, NoData, quoted
from keda_gpu_scaler.core.scaling import Evaluation, PodRow, WhatIf, hpa_desired_replicas, pod_row
from keda_gpu_scaler.core.trigger import Aggregation, TriggerSpec
from keda_gpu_scaler.core.wire import check_rows, check_total
from keda_gpu_scaler.pages.engines import folded_model
from keda_gpu_scaler.pages.gateways import OTHER, PoolQueue, QueueTable, read_queue

# How a replica's row names its family in /explain (a replica is shown where pods are for other metrics).
REPLICA_FAMILY = "epp"


@dataclass(frozen=True, slots=True)
class ReplicaInput:
    """One EPP replica of the pool: its fresh page's queue, or why it has none (`problem`)."""

    name: str
    table: QueueTable | None
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class PendingResult:
    evaluation: Evaluation
    notes: tuple[str, ...]  # for /explain
    to_log: tuple[str, ...]  # worth one log line per ScaledObject (the caller logs each once)


def pending_evaluation(
    replicas: Sequence[ReplicaInput], spec: TriggerSpec, namespace: str, no_replica: str
) -> PendingResult:
    """The requests the pool's EPP replicas hold, and notes for /explain; NoData when it cannot be known.

    Every replica read: their sum. Some cannot be read (failing, stale, a queue without a usable value,
    flow control off): the sum over the others is a lower bound, returned when above 0 (SPEC §7); a
    lower bound of 0 is no value (`value_unknown`: GetMetrics answers UNAVAILABLE), since the unread
    replicas may hold the requests. Activity is known where the replicas read say active; else it cannot
    be told (`activity_unknown`: IsActive answers UNAVAILABLE) — an outage never turns into 0 or false.
    Neither known: NoData. `no_replica`: why there is no replica at all (the message).

    Active also when some replica turned requests away for want of an endpoint since its previous page:
    those requests left the queue before any scrape may have seen them, and asked for the wake all the
    same. A `model` matching no series while the pool shows others: ConfigError when it differs from a
    shown model only by case or blanks (it never will match); else a note naming the models shown (a
    model with nothing queued legitimately reads 0).
    """
    assert spec.inference_pool is not None
    if not replicas:
        raise NoData(no_replica)
    rows: list[PodRow] = []
    unread: dict[str, str] = {}
    notes: list[str] = []
    to_log: list[str] = []
    total = 0.0
    turned_away = 0.0
    shown: set[str] = set()  # the models the pool's replicas show, when a `model` is asked for
    for replica in replicas:
        if replica.table is None:
            unread[replica.name] = replica.problem or "no data yet"
            continue
        queue = read_queue(replica.table, spec.inference_pool, namespace, spec.model)
        if not isinstance(queue, PoolQueue):
            unread[replica.name] = queue.reason
            continue
        total += queue.total
        turned_away += queue.turned_away
        if spec.model is not None:
            every = read_queue(replica.table, spec.inference_pool, namespace, None)
            if isinstance(every, PoolQueue):
                shown.update(model for model, _ in every.by_model)
        rows.append(_row(replica.name, queue))
        if queue.other_counted:
            notes.append(
                f"replica {replica.name}: requests its EPP reports as model {OTHER!r} (past its cardinality"
                f" cap) or with no model label are counted for model {spec.model!r}: any model may be among"
                " them"
            )
    pool = f"InferencePool {namespace}/{spec.inference_pool}"
    if spec.model is not None and shown and spec.model not in shown and "" not in shown:
        notes.append(_unknown_model(spec.model, shown, pool))
        # Logged once per ScaledObject: the line does not change as the pool shows other models.
        to_log.append(
            f"model {quoted(spec.model)} is not among the models {pool} has shown: read as 0 (/explain"
            " lists the models shown)"
        )
    if turned_away > 0:
        notes.append(
            f"active: the endpoint picker turned {turned_away:g} requests away for want of an endpoint"
            " (RejectedNoEndpoints, EvictedNoEndpoints) since its previous page: they asked for the wake"
            " as a queue above activationThreshold does, and were answered 503"
        )
    value_unknown = activity_unknown = None
    if unread:
        reasons = "; ".join(f"{name}: {why}" for name, why in sorted(unread.items())[:5])
        if not rows:
            raise NoData(f"no endpoint-picker replica of {pool} can be read: {reasons}")
        if total <= spec.activation_threshold and turned_away == 0:
            # Whether the pool is idle cannot be told: the unread replicas may hold the requests.
            activity_unknown = (
                f"{len(rows)} of {len(replicas)} endpoint-picker replicas of {pool} hold {total:g} requests,"
                f" not above activationThreshold {spec.activation_threshold:g}, and the others cannot be read"
                f" (they may hold requests): {reasons}"
            )
            if total <= 0:
                raise NoData(activity_unknown)  # neither the value nor activity can be told
        if total > 0:
            notes.insert(
                0,
                f"value is a lower bound: {len(unread)} of {len(replicas)} endpoint-picker replicas of {pool}"
                f" cannot be read ({reasons})",
            )
        else:
            # Active (requests were turned away), but a lower bound of 0 is no value: the HPA would size
            # the pool on it while the unread replicas may hold many (SPEC §7).
            value_unknown = (
                f"{len(rows)} of {len(replicas)} endpoint-picker replicas of {pool} hold no request and the"
                f" others cannot be read (they may hold requests): a lower bound of 0 is no value ({reasons})"
            )
            notes.insert(0, f"value unknown: {value_unknown}")
    # A replica's queue beyond what KEDA can carry (or a sum of them) is UNAVAILABLE naming it.
    check_rows(rows)
    check_total(total, rows)
    evaluation = _evaluation(
        total,
        spec,
        tuple(sorted(rows)),
        tuple(sorted(unread)),
        turned_away > 0,
        value_unknown,
        activity_unknown,
    )
    return PendingResult(evaluation, tuple(notes), tuple(to_log))


def _unknown_model(model: str, shown: set[str], pool: str) -> str:
    """The note for a `model` no series of the pool names; ConfigError when it can never match."""
    names = sorted(name for name in shown if name)
    near = [name for name in names if folded_model(name) == folded_model(model)]
    if near:
        raise ConfigError(
            f"model {quoted(model)} matches no series of {pool}, whose endpoint picker shows model"
            f" {quoted(near[0])}: the two differ only in case or blanks, and the endpoint picker compares"
            f" model names exactly; set `model: {near[0][:253]}`"
        )
    listed = ", ".join(quoted(name) for name in names[:20]) + (
        f" and {len(names) - 20} more" if len(names) > 20 else ""
    )
    return (
        f"model {quoted(model)} is not among the models {pool} has shown ({listed}): read as 0, nothing"
        " is queued for it; if requests for it are expected, check the name against the endpoint picker's"
        " target_model_name"
    )


# A replica has no GPUs: its row's GPU slots carry its flow-control signals as (signal, stage, value).
TURNED_AWAY = "turnedAway"  # requests turned away for want of an endpoint since the previous page
SATURATION = "saturation"  # per stage (empty: an EPP without the label); 1.0 for an empty pool, never load


def _row(name: str, queue: PoolQueue) -> PodRow:
    by_model = [(model or "(no model label)", count) for model, count in queue.by_model]
    signals = [(SATURATION, stage, value) for stage, value in queue.saturation]
    if queue.turned_away:
        signals.append((TURNED_AWAY, "", queue.turned_away))
    return pod_row(name, REPLICA_FAMILY, queue.total, signals, by_model)


def _evaluation(
    value: float,
    spec: TriggerSpec,
    rows: tuple[PodRow, ...],
    unread: tuple[str, ...],
    turned_away: bool,
    value_unknown: str | None,
    activity_unknown: str | None,
) -> Evaluation:
    # The workload's replica count is not known here (it is usually 0): the what-if reads the value
    # alone, as the HPA does with metricType AverageValue.
    desired = hpa_desired_replicas(value, spec.threshold, 0, average_value=True)
    return Evaluation(
        value=value,
        active=value > spec.activation_threshold or turned_away,
        aggregation=Aggregation.SUM,
        pod_rows=rows,
        missing_pods=unread,
        missing_pod_value=0.0,
        what_if=WhatIf(current_replicas=0, average_value=desired, value=desired),
        value_unknown=value_unknown,
        activity_unknown=activity_unknown,
    )
