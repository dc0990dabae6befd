"""llama.cpp server (`llama-server --metrics`): requests processing and deferred from its own /metrics."""

from __future__ import annotations

from keda_gpu_scaler.pages.engines._common import (
    DemandCounters,
    Engine,
    Families,
    InferenceMetric,
    InferenceReading,
    Missing,
    MissingKind,
    engine_count,
    fraction_percent,
    gauge,
    not_exported,
)

ENGINE = Engine.LLAMACPP

# tools/server/server.cpp (examples/server before): unlabelled gauges, one model per server. A request
# is "processing" while it holds a slot (--parallel slots), "deferred" while it waits for one.
RUNNING = "llamacpp:requests_processing"
WAITING = "llamacpp:requests_deferred"
# Printed by older builds only (a fraction of the context's cells in use); later builds dropped it and
# print no other KV-cache gauge. So `engine: llamacpp` cannot promise kv_cache (not in METRICS), while a
# page recognised by `auto` is read where the gauge is there and named as missing where it is not.
KV_CACHE = "llamacpp:kv_cache_usage_ratio"

SAMPLE_NAMES = frozenset({RUNNING, WAITING, KV_CACHE})
METRICS = frozenset({InferenceMetric.REQUESTS, InferenceMetric.QUEUE})
ENGINE_LABELS: tuple[str, ...] = ()

# `metric: demand` is not served: the server's /metrics has no counter of finished requests (its
# counters are tokens and decode calls: prompt_tokens_total, tokens_predicted_total, n_decode_total).
COUNTER_NAMES: frozenset[str] = frozenset()


def read(page: Families, model: str | None) -> InferenceReading:
    # No model label on the page: with a `model` filter nothing matches (gauge says so).
    waiting = gauge(page, WAITING, model=model, engine_labels=ENGINE_LABELS)
    running = gauge(page, RUNNING, model=model, engine_labels=ENGINE_LABELS)
    if KV_CACHE in page:
        kv = gauge(page, KV_CACHE, model=model, engine_labels=ENGINE_LABELS)
        kv_cache = fraction_percent(kv.mean())
        engines = engine_count(waiting, running, kv)
    else:
        kv_cache = Missing(
            MissingKind.NOT_EXPORTED,
            f"{ENGINE.value} exports no KV-cache usage: {KV_CACHE} is not on the page (only older "
            "llama.cpp builds print it)",
            KV_CACHE,
        )
        engines = engine_count(waiting, running)
    return InferenceReading(
        ENGINE, waiting=waiting.total(), running=running.total(), kv_cache=kv_cache, engines=engines
    )


def read_counters(page: Families, model: str | None) -> DemandCounters:
    missing = not_exported(
        ENGINE, "counter of finished requests (its /metrics counts tokens and decode calls, not requests)"
    )
    return DemandCounters(finished=missing, prompt_tokens=missing, generation_tokens=missing)
