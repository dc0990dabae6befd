"""SGLang: requests running and queued and KV-pool use from the server's own /metrics."""

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
    counter_series,
    gauge_of_spellings,
    latency_names,
    latency_series,
    queue_reading,
)

ENGINE = Engine.SGLANG

# python/sglang/srt/metrics/collector.py (scheduler gauges), labelled model_name; recent releases add
# tp_rank, pp_rank and dp_rank (and moe_ep_rank, engine_type).
RUNNING = "sglang:num_running_reqs"
WAITING = "sglang:num_queue_reqs"
KV_CACHE = "sglang:token_usage"  # fraction 0–1 of the KV pool's tokens in use
# The same gauges as sgl-router's /engine_metrics prints them, and as a Prometheus 3 that escapes metric
# names with underscores stores them. Read where the `sglang:` spelling is absent; a page with both
# counts once (gauge_of_spellings), the `sglang:` value standing where they differ.
RUNNING_UNDERSCORE = "sglang_num_running_reqs"
WAITING_UNDERSCORE = "sglang_num_queue_reqs"
KV_CACHE_UNDERSCORE = "sglang_token_usage"

SAMPLE_NAMES = frozenset(
    {RUNNING, WAITING, KV_CACHE, RUNNING_UNDERSCORE, WAITING_UNDERSCORE, KV_CACHE_UNDERSCORE}
)
METRICS = frozenset(InferenceMetric)
# dp_rank: data-parallel ranks are separate schedulers, each with its own queue. tp_rank, pp_rank (and
# moe_ep_rank) are ranks of one scheduler repeating its value: they are not engine labels, so they count once.
ENGINE_LABELS = ("dp_rank",)

# Counters for `metric: demand` (python/sglang/srt/metrics/collector.py, TokenizerMetricsCollector,
# v0.4 and later): observe_one_finished_request() adds 1 to num_requests_total for every request that
# finishes, whatever its finish reason (an aborted one that the scheduler ends included), and its prompt
# and generated tokens. num_aborted_requests_total is not added: it counts abort calls, and an aborted
# request that ran also finishes through that path (it would count twice). The client library prints a
# labelled counter only once it moved: a server that has not finished a request yet has no such series.
_LAZY = "SGLang prints it, with --enable-metrics, once a request has finished"
FINISHED = CounterFamily(
    ("sglang:num_requests_total", "sglang_num_requests_total"), ENGINE_LABELS, absent_hint=_LAZY
)
PROMPT_TOKENS = CounterFamily(
    ("sglang:prompt_tokens_total", "sglang_prompt_tokens_total"), ENGINE_LABELS, absent_hint=_LAZY
)
GENERATION_TOKENS = CounterFamily(
    ("sglang:generation_tokens_total", "sglang_generation_tokens_total"), ENGINE_LABELS, absent_hint=_LAZY
)
# Latency histograms (collector.py, observed per request): time to first token, and the time between
# output tokens (inter_token_latency; time_per_output_token, a request's mean, where a release lacks it).
# Both spellings, as for the gauges.
LATENCY = {
    TTFT: ("sglang:time_to_first_token_seconds", "sglang_time_to_first_token_seconds"),
    TPOT: (
        "sglang:inter_token_latency_seconds",
        "sglang_inter_token_latency_seconds",
        "sglang:time_per_output_token_seconds",
        "sglang_time_per_output_token_seconds",
    ),
}
COUNTER_NAMES = frozenset(
    n for f in (FINISHED, PROMPT_TOKENS, GENERATION_TOKENS) for n in f.spellings
) | latency_names(LATENCY)


def read(page: Families, model: str | None) -> InferenceReading:
    waiting = gauge_of_spellings(
        page, (WAITING, WAITING_UNDERSCORE), model=model, engine_labels=ENGINE_LABELS
    )
    running = gauge_of_spellings(
        page, (RUNNING, RUNNING_UNDERSCORE), model=model, engine_labels=ENGINE_LABELS
    )
    kv = gauge_of_spellings(page, (KV_CACHE, KV_CACHE_UNDERSCORE), model=model, engine_labels=ENGINE_LABELS)
    return queue_reading(ENGINE, page, SAMPLE_NAMES, waiting, running, kv)


def read_counters(page: Families, model: str | None) -> DemandCounters:
    return DemandCounters(
        finished=counter_series(page, (FINISHED,), model=model),
        prompt_tokens=counter_series(page, (PROMPT_TOKENS,), model=model),
        generation_tokens=counter_series(page, (GENERATION_TOKENS,), model=model),
        latency=latency_series(page, LATENCY, ENGINE_LABELS, model),
    )
