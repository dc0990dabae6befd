"""Text Generation Inference: requests queued and in the running batch from the router's own /metrics."""

from __future__ import annotations

from collections.abc import Sequence

from keda_gpu_scaler.engines._common import (
    Engine,
    InferenceMetric,
    InferenceReading,
    engine_count,
    gauge,
    not_exported,
)
from keda_gpu_scaler.exposition import Sample

ENGINE = Engine.TGI

# docs/source/reference/metrics.md: unlabelled gauges; one router per pod.
WAITING = "tgi_queue_size"
RUNNING = "tgi_batch_current_size"

SAMPLE_NAMES = frozenset({WAITING, RUNNING})
# No KV-cache percentage: TGI exports token counts of the batch, not of the cache.
METRICS = frozenset({InferenceMetric.REQUESTS, InferenceMetric.QUEUE})
ENGINE_LABELS: tuple[str, ...] = ()


def read(samples: Sequence[Sample], model: str | None) -> InferenceReading:
    # TGI's series carry no model label: with a `model` filter nothing matches (gauge says so).
    waiting = gauge(samples, WAITING, model=model, engine_labels=ENGINE_LABELS)
    running = gauge(samples, RUNNING, model=model, engine_labels=ENGINE_LABELS)
    return InferenceReading(
        ENGINE,
        waiting=waiting.total(),
        running=running.total(),
        kv_cache=not_exported(ENGINE, "KV-cache usage"),
        engines=engine_count(waiting, running),
    )
