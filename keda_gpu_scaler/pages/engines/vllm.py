"""vLLM (V1 engine): requests running and waiting and KV-cache use from the server's own /metrics."""

from __future__ import annotations

from keda_gpu_scaler.pages.engines._common import (
    TPOT,
    TTFT,
    CounterFamily,
    DemandCounters,
    Engine,
    Families,
    InferenceMetric,
    InferenceReading,
    Missing,
    MissingKind,
    counter_series,
    gauge,
    histogram_sizes,
    latency_names,
    latency_series,
    queue_reading,
)

ENGINE = Engine.VLLM

# vllm/v1/metrics/loggers.py: gauges labelled model_name and engine (one series per data-parallel engine).
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE = "vllm:kv_cache_usage_perc"  # fraction 0–1 despite the name
# The older name of the same gauge: deprecated in 0.9 and hidden by default after it. Read only where
# the new one is absent, so a release that prints both does not count the cache twice.
KV_CACHE_OLD = "vllm:gpu_cache_usage_perc"
# Never read: newer releases break vllm:num_requests_waiting down by reason; adding it would count the
# same waiting requests twice. Named here so that the test can say so.
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"

SAMPLE_NAMES = frozenset({RUNNING, WAITING, KV_CACHE, KV_CACHE_OLD})

# Counters for `metric: demand` (vllm/v1/metrics/loggers.py, v0.8 and later): requests finished, one
# series per `finished_reason` (stop, length, abort, error in later releases) and engine, each created at
# start-up; tokens processed, per engine (prompt tokens as each prefill runs, generated ones per step).
FINISHED = CounterFamily(("vllm:request_success_total",), ("engine", "finished_reason"))
PROMPT_TOKENS = CounterFamily(("vllm:prompt_tokens_total",), ("engine",))
GENERATION_TOKENS = CounterFamily(("vllm:generation_tokens_total",), ("engine",))
# Per-request token histograms, observed as each request finishes (vllm/v1/metrics/loggers.py): their
# sums over their counts are the true size of the requests that finished, where the token counters count
# prompts at admission, before those requests finish.
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"
COUNTER_NAMES = frozenset(n for f in (FINISHED, PROMPT_TOKENS, GENERATION_TOKENS) for n in f.spellings) | {
    f"{name}_{part}"
    for name in (REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS)
    for part in ("sum", "count")
}
# Latency histograms (vllm/v1/metrics/loggers.py), per engine: time to first token, and the time between
# output tokens, named inter_token_latency from 0.10 on (time_per_output_token before, the same intervals).
LATENCY = {
    TTFT: ("vllm:time_to_first_token_seconds",),
    TPOT: ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
}
COUNTER_NAMES |= latency_names(LATENCY)
METRICS = frozenset(InferenceMetric)
ENGINE_LABELS = ("engine",)


def read(page: Families, model: str | None) -> InferenceReading:
    if not page:
        return _not_started()
    waiting = gauge(page, WAITING, model=model, engine_labels=ENGINE_LABELS)
    running = gauge(page, RUNNING, model=model, engine_labels=ENGINE_LABELS)
    kv = gauge(page, KV_CACHE if KV_CACHE in page else KV_CACHE_OLD, model=model, engine_labels=ENGINE_LABELS)
    kv_value = kv.mean()
    if isinstance(kv_value, Missing) and kv_value.kind is MissingKind.FAMILY_ABSENT:
        kv_value = Missing(
            MissingKind.FAMILY_ABSENT,
            f"neither {KV_CACHE} nor {KV_CACHE_OLD} (releases before 0.9) is on the page",
            KV_CACHE,
        )
    return queue_reading(ENGINE, page, SAMPLE_NAMES, waiting, running, kv, kv_value)


def _not_started() -> InferenceReading:
    """A page without any of the families: vLLM prints them only once its engine exists."""

    def absent(family: str) -> Missing:
        return Missing(
            MissingKind.FAMILY_ABSENT,
            f"{family} is not on the page (vLLM prints it once its engine has started)",
            family,
        )

    return InferenceReading(
        ENGINE, waiting=absent(WAITING), running=absent(RUNNING), kv_cache=absent(KV_CACHE)
    )


def read_counters(page: Families, model: str | None) -> DemandCounters:
    return DemandCounters(
        finished=counter_series(page, (FINISHED,), model=model),
        prompt_tokens=counter_series(page, (PROMPT_TOKENS,), model=model),
        generation_tokens=counter_series(page, (GENERATION_TOKENS,), model=model),
        sizes=histogram_sizes(page, REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS, ENGINE_LABELS, model),
        latency=latency_series(page, LATENCY, ENGINE_LABELS, model),
    )
