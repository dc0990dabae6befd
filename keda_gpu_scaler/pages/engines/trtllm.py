"""TensorRT-LLM backend of Triton: the in-flight batcher's waiting and scheduled requests and KV blocks."""

from __future__ import annotations

from itertools import chain

from keda_gpu_scaler.pages.engines import triton
from keda_gpu_scaler.pages.engines._common import (
    DemandCounters,
    Engine,
    Families,
    Gauge,
    InferenceMetric,
    InferenceReading,
    Missing,
    MissingKind,
    Value,
    by_name,
    counter_series,
    gauge,
    model_of,
    not_exported,
    queue_reading,
    selector_text,
)

ENGINE = Engine.TRTLLM

# tensorrtllm_backend's custom metrics (labels model, version), printed on Triton's metrics port.
REQUESTS = "nv_trt_llm_request_metrics"  # request_type: waiting, scheduled, active, max, context
KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"  # kv_cache_block_type: fraction, used, free, max, tokens_per
WAITING_WHERE = {"request_type": "waiting"}
# "scheduled" is what the batcher runs this iteration; the Gateway API inference extension's model-server
# protocol maps running requests to it too ("active" also counts requests paused or in transfer).
RUNNING_WHERE = {"request_type": "scheduled"}
KV_FRACTION_WHERE = {"kv_cache_block_type": "fraction"}
# Backends older than the "fraction" series print the block counts only: used / max is the same fraction.
KV_USED_WHERE = {"kv_cache_block_type": "used"}
KV_MAX_WHERE = {"kv_cache_block_type": "max"}

SAMPLE_NAMES = frozenset({REQUESTS, KV_BLOCKS})
METRICS = frozenset(InferenceMetric)
ENGINE_LABELS = ("version",)

# Counters for `metric: demand`: the backend prints none of its own; Triton's per-model request counters
# (triton.py) count the requests of the backend's model. Only the models that carry the backend's
# request metrics are read: an ensemble's preprocessing, postprocessing and ensemble models count the
# same requests again. No token counters.
COUNTER_NAMES = triton.COUNTER_NAMES


def read(page: Families, model: str | None) -> InferenceReading:
    waiting = gauge(page, REQUESTS, model=model, engine_labels=ENGINE_LABELS, where=WAITING_WHERE)
    running = gauge(page, REQUESTS, model=model, engine_labels=ENGINE_LABELS, where=RUNNING_WHERE)
    kv = gauge(page, KV_BLOCKS, model=model, engine_labels=ENGINE_LABELS, where=KV_FRACTION_WHERE)
    kv_value = kv.mean()
    if isinstance(kv_value, Missing) and kv_value.kind is MissingKind.FAMILY_ABSENT:
        kv_value = _used_over_max(page, model, kv_value)
    return queue_reading(ENGINE, page, SAMPLE_NAMES, waiting, running, kv, kv_value)


def _used_over_max(page: Families, model: str | None, absent: Missing) -> Value:
    used = gauge(page, KV_BLOCKS, model=model, engine_labels=ENGINE_LABELS, where=KV_USED_WHERE)
    most = gauge(page, KV_BLOCKS, model=model, engine_labels=ENGINE_LABELS, where=KV_MAX_WHERE)
    if used.missing is not None and used.missing.kind is MissingKind.FAMILY_ABSENT:
        return absent
    for part in (used, most):
        if part.missing is not None:
            return part.missing
    fractions = _ratios(used, most)
    if fractions is None:
        family = selector_text(KV_BLOCKS, KV_MAX_WHERE)
        return Missing(
            MissingKind.NO_VALUE, f"{family} is 0 or missing for an engine that reports used blocks", family
        )
    return sum(fractions) / len(fractions)


def _ratios(used: Gauge, most: Gauge) -> list[float] | None:
    fractions = []
    for key, blocks in used.values.items():
        total = most.values.get(key)
        if not total:
            return None
        fractions.append(blocks / total)
    return fractions


def read_counters(page: Families, model: str | None) -> DemandCounters:
    backend_models = {model_of(s.labels) for s in page.get(REQUESTS, ())}
    own = by_name(
        s
        for s in chain.from_iterable(page.values())
        if s.name not in COUNTER_NAMES or model_of(s.labels) in backend_models
    )
    return DemandCounters(
        finished=counter_series(own, (triton.FINISHED, triton.FAILED), model=model),
        prompt_tokens=not_exported(ENGINE, "token counters (the Triton backend)"),
        generation_tokens=not_exported(ENGINE, "token counters (the Triton backend)"),
    )
