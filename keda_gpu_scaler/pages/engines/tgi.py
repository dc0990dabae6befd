"""Text Generation Inference: requests queued and in the running batch from the router's own /metrics."""

from __future__ import annotations

from keda_gpu_scaler.pages.engines._common import (
    TPOT,
    CounterFamily,
    DemandCounters,
    Engine,
    Families,
    InferenceMetric,
    InferenceReading,
    counter_series,
    engine_count,
    gauge,
    histogram_sizes,
    latency_names,
    latency_series,
    not_exported,
)

ENGINE = Engine.TGI

# docs/source/reference/metrics.md: unlabelled gauges; one router per pod.
WAITING = "tgi_queue_size"
RUNNING = "tgi_batch_current_size"

SAMPLE_NAMES = frozenset({WAITING, RUNNING})
# No KV-cache percentage: TGI exports token counts of the batch, not of the cache.
METRICS = frozenset({InferenceMetric.REQUESTS, InferenceMetric.QUEUE, InferenceMetric.DEMAND})
ENGINE_LABELS: tuple[str, ...] = ()

# Counters for `metric: demand` (docs/source/reference/metrics.md; router/src/infer and server.rs):
# tgi_request_success counts requests that finished generating; tgi_request_failure{err} the others
# (validation, overloaded, dropped by the client, incomplete, ...). tgi_request_count counts arrivals at
# the HTTP layer and is not read: finished + the change in running and waiting is the rule for every
# engine. The Rust exporter prints a counter only once it moved, so a failure counter may be absent.
# Tokens: the per-request histograms of prompt length (observed at admission) and generated tokens (at
# the end): their sums count tokens, and each one's sum over its count is a request's true size.
INPUT_LENGTH = "tgi_request_input_length"
GENERATED_TOKENS = "tgi_request_generated_tokens"
FINISHED = CounterFamily(("tgi_request_success",), absent_hint="TGI prints it once a request has succeeded")
FAILED = CounterFamily(("tgi_request_failure",), ("err",), optional=True)
PROMPT_TOKENS = CounterFamily((f"{INPUT_LENGTH}_sum",))
GENERATION_TOKENS = CounterFamily((f"{GENERATED_TOKENS}_sum",))
# Latency: TGI prints no time-to-first-token histogram (its prefill and queue durations are parts of it,
# not it); tgi_request_mean_time_per_token_duration is each request's mean time per output token.
LATENCY = {TPOT: ("tgi_request_mean_time_per_token_duration",)}
COUNTER_NAMES = (
    frozenset(n for f in (FINISHED, FAILED) for n in f.spellings)
    | {f"{name}_{part}" for name in (INPUT_LENGTH, GENERATED_TOKENS) for part in ("sum", "count")}
    | latency_names(LATENCY)
)


def read(page: Families, model: str | None) -> InferenceReading:
    # TGI's series carry no model label: with a `model` filter nothing matches (gauge says so).
    waiting = gauge(page, WAITING, model=model, engine_labels=ENGINE_LABELS)
    running = gauge(page, RUNNING, model=model, engine_labels=ENGINE_LABELS)
    return InferenceReading(
        ENGINE,
        waiting=waiting.total(),
        running=running.total(),
        kv_cache=not_exported(ENGINE, "KV-cache usage"),
        engines=engine_count(waiting, running),
    )


def read_counters(page: Families, model: str | None) -> DemandCounters:
    return DemandCounters(
        finished=counter_series(page, (FINISHED, FAILED), model=model),
        prompt_tokens=counter_series(page, (PROMPT_TOKENS,), model=model),
        generation_tokens=counter_series(page, (GENERATION_TOKENS,), model=model),
        sizes=histogram_sizes(page, INPUT_LENGTH, GENERATED_TOKENS, ENGINE_LABELS, model),
        latency=latency_series(page, LATENCY, ENGINE_LABELS, model),
    )
