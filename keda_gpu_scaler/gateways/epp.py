"""The inference gateway's endpoint picker (EPP) of llm-d's router and the Gateway API Inference
Extension: requests its flow-control queue holds for an InferencePool (SPEC §7)."""

from __future__ import annotations

from collections.abc import Sequence

from keda_gpu_scaler.exposition import Sample
from keda_gpu_scaler.gateways._common import (
    OTHER,
    GatewayProblem,
    PoolQueue,
    QueueMissing,
    QueueReading,
    usable,
)

NAME = "epp"

# llm-d-router docs/metrics.md (v0.10.0): a gauge labelled fairness_id, priority, inference_pool,
# model_name, target_model_name. Older EPPs (the Inference Extension's, before the move to llm-d) print
# the same gauge under their own prefix; a page with both counts once, the current name preferred.
QUEUE = "llm_d_epp_flow_control_queue_size"
QUEUE_OLD = "inference_extension_flow_control_queue_size"
QUEUE_FAMILIES = (QUEUE, QUEUE_OLD)

# A flow-control family that is printed while flow control runs, queue or no queue. The queue gauge's
# series appear only once a request was queued for their labels, so a freshly started EPP with flow
# control on prints no queue series yet: these tell it from one with flow control off.
SATURATION = "llm_d_epp_flow_control_pool_saturation"
REQUESTS_TOTAL = "llm_d_epp_flow_control_requests_total"
FLOW_CONTROL_SIGNS = frozenset({SATURATION, REQUESTS_TOTAL})

# Families every EPP prints whatever its feature gates: a page with none of them (nor any of the above)
# is not an EPP's page.
READY_ENDPOINTS = "llm_d_epp_ready_endpoints"
READY_PODS_OLD = "inference_pool_ready_pods"
REQUEST_RUNNING = "llm_d_epp_request_running"
IDENTITY = frozenset({READY_ENDPOINTS, READY_PODS_OLD, REQUEST_RUNNING})

SAMPLE_NAMES = frozenset({*QUEUE_FAMILIES, *FLOW_CONTROL_SIGNS, *IDENTITY})
LEVEL_FAMILIES = QUEUE_FAMILIES  # the families read as levels: a page declaring another type is refused

POOL_LABEL = "inference_pool"
MODEL_LABEL = "model_name"
TARGET_MODEL_LABEL = "target_model_name"

FLOW_CONTROL_OFF = (
    "the endpoint picker holds no requests: its flow control is off (none of its flow-control families"
    f" such as {QUEUE} is on its page). Enable the EPP's `flowControl` feature gate"
    " (featureGates: [flowControl]) so it queues requests while the pool has no endpoint"
)


def model_of(labels: dict[str, str]) -> str:
    """The model a queued request is for: the target model, or where that label is empty the model."""
    return labels.get(TARGET_MODEL_LABEL) or labels.get(MODEL_LABEL) or ""


def read(samples: Sequence[Sample], pool: str, namespace: str, model: str | None) -> QueueReading:
    """The requests this EPP replica holds for `pool` (of `namespace`), for `model` or all models.

    `samples`: the replica's page parsed with SAMPLE_NAMES. Series of the queue labelled with another
    pool are not this pool's; series without the label are (one EPP serves one pool).
    """
    present = {s.name for s in samples}
    family = QUEUE if QUEUE in present else QUEUE_OLD if QUEUE_OLD in present else None
    if family is None:
        if present & FLOW_CONTROL_SIGNS:
            return PoolQueue(0.0, (), None)  # flow control runs and has never queued anything
        return QueueMissing(GatewayProblem.FLOW_CONTROL_OFF, FLOW_CONTROL_OFF)
    pool_names = (pool, f"{namespace}/{pool}")
    series = [s for s in samples if s.name == family]
    mine = [s for s in series if s.labels.get(POOL_LABEL, "") in ("", *pool_names)]
    if not mine:
        others = ", ".join(sorted({s.labels.get(POOL_LABEL, "") for s in series}))
        return QueueMissing(
            GatewayProblem.OTHER_POOL,
            f"{family} names InferencePool {others}, not {pool}: this is another pool's endpoint picker",
        )
    by_model: dict[str, float] = {}
    other_counted = False
    for sample in mine:
        name = model_of(sample.labels)
        folded = name == OTHER
        if model is not None and name != model and not folded:
            continue
        if not usable(sample.value):
            where = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            return QueueMissing(
                GatewayProblem.NO_VALUE,
                f"{family}{{{where}}} is {sample.value!r}: a queue size must be a finite count >= 0",
            )
        if folded and model is not None and model != OTHER and sample.value > 0:
            other_counted = True
        by_model[name] = by_model.get(name, 0.0) + sample.value
    total = sum(by_model.values())
    return PoolQueue(total, tuple(sorted(by_model.items())), family, other_counted)
