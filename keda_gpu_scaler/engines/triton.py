"""NVIDIA Triton Inference Server: requests pending per model from the server's own /metrics."""

from __future__ import annotations

from collections.abc import Sequence

from keda_gpu_scaler.engines._common import (
    Engine,
    InferenceMetric,
    InferenceReading,
    engine_count,
    gauge,
    models_on,
    not_exported,
)
from keda_gpu_scaler.exposition import Sample

ENGINE = Engine.TRITON

# docs/user_guide/metrics.md: a gauge per loaded model version (labels model, version). Triton's
# counters (nv_inference_count, nv_inference_queue_duration_us) are rates, not levels, so they do not
# give a running count.
WAITING = "nv_inference_pending_request_count"

SAMPLE_NAMES = frozenset({WAITING})
METRICS = frozenset({InferenceMetric.QUEUE})
# Two loaded versions of one model are two sets of instances, each with its own queue.
ENGINE_LABELS = ("version",)


def read(samples: Sequence[Sample], model: str | None) -> InferenceReading:
    waiting = gauge(samples, WAITING, model=model, engine_labels=ENGINE_LABELS)
    return InferenceReading(
        ENGINE,
        waiting=waiting.total(),
        running=not_exported(ENGINE, "running-request count (only nv_inference_pending_request_count)"),
        kv_cache=not_exported(ENGINE, "KV-cache usage"),
        engines=engine_count(waiting),
        models=models_on(samples, SAMPLE_NAMES),
    )
