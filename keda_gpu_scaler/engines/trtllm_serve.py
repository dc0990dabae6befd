"""trtllm-serve, TensorRT-LLM's own OpenAI server: requests waiting and running and KV-cache use."""

from __future__ import annotations

from collections.abc import Sequence

from keda_gpu_scaler.engines._common import (
    Engine,
    InferenceMetric,
    InferenceReading,
    engine_count,
    fraction_percent,
    gauge,
    models_on,
)
from keda_gpu_scaler.exposition import Sample

# The same engine as the Triton backend's page (trtllm.py), served without Triton: `engine: trtllm` reads
# whichever of the two pages a pod prints.
ENGINE = Engine.TRTLLM

# Iteration-stats gauges of TensorRT-LLM 1.3.0rc12 and later (PR 12545), on /prometheus/metrics when the
# server runs with return_perf_metrics and enable_iter_perf_stats; labelled model_name (and engine_type).
WAITING = "trtllm_num_requests_waiting"
RUNNING = "trtllm_num_requests_running"
KV_CACHE = "trtllm_kv_cache_utilization"  # fraction 0–1 of the KV-cache blocks in use

SAMPLE_NAMES = frozenset({WAITING, RUNNING, KV_CACHE})
METRICS = frozenset(InferenceMetric)
# One executor per server; series differing in anything else (engine_type) are copies of its value.
ENGINE_LABELS: tuple[str, ...] = ()


def read(samples: Sequence[Sample], model: str | None) -> InferenceReading:
    waiting = gauge(samples, WAITING, model=model, engine_labels=ENGINE_LABELS)
    running = gauge(samples, RUNNING, model=model, engine_labels=ENGINE_LABELS)
    kv = gauge(samples, KV_CACHE, model=model, engine_labels=ENGINE_LABELS)
    return InferenceReading(
        ENGINE,
        waiting=waiting.total(),
        running=running.total(),
        kv_cache=fraction_percent(kv.mean()),
        engines=engine_count(waiting, running, kv),
        models=models_on(samples, SAMPLE_NAMES),
    )
