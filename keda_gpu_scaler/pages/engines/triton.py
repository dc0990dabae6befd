"""NVIDIA Triton Inference Server: requests pending per model from the server's own /metrics."""

from __future__ import annotations

from keda_gpu_scaler.pages.engines._common import (
    CounterFamily,
    DemandCounters,
    Engine,
    Families,
    InferenceMetric,
    InferenceReading,
    counter_series,
    engine_count,
    gauge,
    models_on,
    not_exported,
)

ENGINE = Engine.TRITON

# docs/user_guide/metrics.md: a gauge per loaded model version (labels model, version). Triton's
# counters (nv_inference_count, nv_inference_queue_duration_us) are rates, not levels, so they do not
# give a running count.
WAITING = "nv_inference_pending_request_count"

SAMPLE_NAMES = frozenset({WAITING})
METRICS = frozenset({InferenceMetric.QUEUE, InferenceMetric.DEMAND})
# Two loaded versions of one model are two sets of instances, each with its own queue.
ENGINE_LABELS = ("version",)

# Counters for `metric: demand` (docs/user_guide/metrics.md, "Count" metrics): requests that finished
# with success and with failure per model and version, printed from the moment a model is loaded;
# releases from 24.x label failures by `reason` (REJECTED, CANCELED, BACKEND, OTHER), older ones print no
# failure counter at all. Triton has no running count, so for Triton the change in flight is the change
# in pending requests alone (the requests executing at either end of the window are at most the model
# instances' batch slots: a bounded error, against a rate summed over the whole window). No token
# counters. An ensemble counts each request once per step model: give `model` to read the one that
# holds the queue.
FINISHED = CounterFamily(("nv_inference_request_success",), ENGINE_LABELS)
FAILED = CounterFamily(("nv_inference_request_failure",), (*ENGINE_LABELS, "reason"), optional=True)
COUNTER_NAMES = frozenset(n for f in (FINISHED, FAILED) for n in f.spellings)


def read(page: Families, model: str | None) -> InferenceReading:
    waiting = gauge(page, WAITING, model=model, engine_labels=ENGINE_LABELS)
    return InferenceReading(
        ENGINE,
        waiting=waiting.total(),
        running=not_exported(ENGINE, "running-request count (only nv_inference_pending_request_count)"),
        kv_cache=not_exported(ENGINE, "KV-cache usage"),
        engines=engine_count(waiting),
        models=models_on(page, SAMPLE_NAMES),
    )


def read_counters(page: Families, model: str | None) -> DemandCounters:
    return DemandCounters(
        finished=counter_series(page, (FINISHED, FAILED), model=model),
        prompt_tokens=not_exported(ENGINE, "token counters"),
        generation_tokens=not_exported(ENGINE, "token counters"),
    )
