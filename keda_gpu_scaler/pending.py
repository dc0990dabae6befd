"""Pure arithmetic of `metric: pending` (SPEC §7): EPP replicas' queues → the pool's value and activity.

No I/O and no clock: the caller says which replicas are fresh (with their samples) and why the others
are not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from keda_gpu_scaler.errors import NoData
from keda_gpu_scaler.gateways import OTHER, PoolQueue, QueueTable, read_queue
from keda_gpu_scaler.scaling import Evaluation, PodRow, WhatIf, hpa_desired_replicas, pod_row
from keda_gpu_scaler.trigger import Aggregation, TriggerSpec
from keda_gpu_scaler.wire import check_rows, check_total

# How a replica's row names its family in /explain (a replica is shown where pods are for other metrics).
REPLICA_FAMILY = "epp"


@dataclass(frozen=True, slots=True)
class ReplicaInput:
    """One EPP replica of the pool: its fresh page's queue, or why it has none (`problem`)."""

    name: str
    table: QueueTable | None
    problem: str | None = None


def pending_evaluation(
    replicas: Sequence[ReplicaInput], spec: TriggerSpec, namespace: str, no_replica: str
) -> tuple[Evaluation, tuple[str, ...]]:
    """The requests the pool's EPP replicas hold, and notes for /explain; NoData when it cannot be known.

    Every replica read: their sum. Some cannot be read (failing, stale, a queue without a usable value,
    flow control off): the sum over the others is a lower bound, returned only when it already says
    active (> activationThreshold); else UNAVAILABLE, since the unread replicas may hold the requests —
    an outage never turns into 0 or false. `no_replica`: why there is no replica at all (the message).
    """
    assert spec.inference_pool is not None
    if not replicas:
        raise NoData(no_replica)
    rows: list[PodRow] = []
    unread: dict[str, str] = {}
    notes: list[str] = []
    total = 0.0
    for replica in replicas:
        if replica.table is None:
            unread[replica.name] = replica.problem or "no data yet"
            continue
        queue = read_queue(replica.table, spec.inference_pool, namespace, spec.model)
        if not isinstance(queue, PoolQueue):
            unread[replica.name] = queue.reason
            continue
        total += queue.total
        rows.append(_row(replica.name, queue))
        if queue.other_counted:
            notes.append(
                f"replica {replica.name}: requests its EPP reports as model {OTHER!r} (past its cardinality"
                f" cap) are counted for model {spec.model!r}: any model may be among them"
            )
    pool = f"InferencePool {namespace}/{spec.inference_pool}"
    if unread:
        reasons = "; ".join(f"{name}: {why}" for name, why in sorted(unread.items())[:5])
        if not rows:
            raise NoData(f"no endpoint-picker replica of {pool} can be read: {reasons}")
        if total <= spec.activation_threshold:
            raise NoData(
                f"{len(rows)} of {len(replicas)} endpoint-picker replicas of {pool} hold {total:g} requests,"
                f" not above activationThreshold {spec.activation_threshold:g}, and the others cannot be read"
                f" (they may hold requests): {reasons}"
            )
        notes.insert(
            0,
            f"value is a lower bound: {len(unread)} of {len(replicas)} endpoint-picker replicas of {pool}"
            f" cannot be read ({reasons})",
        )
    # A replica's queue beyond what KEDA can carry (or a sum of them) is UNAVAILABLE naming it.
    check_rows(rows)
    check_total(total, rows)
    return _evaluation(total, spec, tuple(sorted(rows)), tuple(sorted(unread))), tuple(notes)


def _row(name: str, queue: PoolQueue) -> PodRow:
    by_model = [(model or "(no model label)", count) for model, count in queue.by_model]
    return pod_row(name, REPLICA_FAMILY, queue.total, (), by_model)


def _evaluation(
    value: float, spec: TriggerSpec, rows: tuple[PodRow, ...], unread: tuple[str, ...]
) -> Evaluation:
    # The workload's replica count is not known here (it is usually 0): the what-if reads the value
    # alone, as the HPA does with metricType AverageValue.
    desired = hpa_desired_replicas(value, spec.threshold, 0, average_value=True)
    return Evaluation(
        value=value,
        active=value > spec.activation_threshold,
        aggregation=Aggregation.SUM,
        pod_rows=rows,
        missing_pods=unread,
        missing_pod_value=0.0,
        what_if=WhatIf(current_replicas=0, average_value=desired, value=desired),
    )
