"""trtllm-serve, TensorRT-LLM's own OpenAI server: requests waiting and running and KV-cache use."""

from __future__ import annotations

from keda_gpu_scaler.pages.engines._common import (
    CounterFamily,
    DemandCounters,
    Engine,
    Families,
    InferenceMetric,
    InferenceReading,
    counter_series,
    gauge,
    queue_reading,
)

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

# Counters for `metric: demand` (tensorrt_llm/metrics/collector.py, MetricsCollector): request_success_total
# counts every finished request by `finished_reason` (whatever the reason, cancelled ones included),
# with its prompt and generation tokens; they are printed with return_perf_metrics, and a labelled series
# only once a request has finished.
_LAZY = "trtllm-serve prints it with return_perf_metrics, once a request has finished"
FINISHED = CounterFamily(("trtllm_request_success_total",), ("finished_reason",), absent_hint=_LAZY)
PROMPT_TOKENS = CounterFamily(("trtllm_prompt_tokens_total",), absent_hint=_LAZY)
GENERATION_TOKENS = CounterFamily(("trtllm_generation_tokens_total",), absent_hint=_LAZY)
COUNTER_NAMES = frozenset(n for f in (FINISHED, PROMPT_TOKENS, GENERATION_TOKENS) for n in f.spellings)


def read(page: Families, model: str | None) -> InferenceReading:
    waiting = gauge(page, WAITING, model=model, engine_labels=ENGINE_LABELS)
    running = gauge(page, RUNNING, model=model, engine_labels=ENGINE_LABELS)
    kv = gauge(page, KV_CACHE, model=model, engine_labels=ENGINE_LABELS)
    return queue_reading(ENGINE, page, SAMPLE_NAMES, waiting, running, kv)


def read_counters(page: Families, model: str | None) -> DemandCounters:
    return DemandCounters(
        finished=counter_series(page, (FINISHED,), model=model),
        prompt_tokens=counter_series(page, (PROMPT_TOKENS,), model=model),
        generation_tokens=counter_series(page, (GENERATION_TOKENS,), model=model),
    )
