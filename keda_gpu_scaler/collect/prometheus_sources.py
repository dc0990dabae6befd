"""The Prometheus source's names: what each of its queries asks for, the store sources its answers fill, and
how old a sample it may use. Those who want data from it, or read its pages, need these and not the collector."""

from __future__ import annotations

from keda_gpu_scaler.collect.wanted import PrometheusQuery

# What a PrometheusQuery asks for (wanted.PrometheusQuery.what).
GPU_SERIES = "gpu"
INFERENCE_SERIES = "inference"  # a namespace's inference-server series (SPEC §6)
GATEWAY_SERIES = "gateway"  # one InferencePool's endpoint-picker series (SPEC §7)
# What an endpoint picker's page must have series of (a replica whose page lacks them is lost, not gone).
EPP_SERIES = "the endpoint picker's flow-control queue"


def sample_window(max_staleness: float, interval: float) -> float:
    """How old a sample may be when queried to be used.

    A sample is used while it is at most max-staleness old, and a collection's result is reused until
    the next one, so at query time it may be at most max-staleness less one interval old.
    """
    return max_staleness - interval if max_staleness > interval else max_staleness


def gateway_source(namespace: str, pool: str) -> str:
    """The store source of one InferencePool's endpoint-picker series (SourceKind.PROMETHEUS_GATEWAY)."""
    return f"prometheus-gateway:{namespace}/{pool}"


def inference_source(namespace: str) -> str:
    """The store source of one namespace's inference series (SourceKind.PROMETHEUS_INFERENCE)."""
    return f"prometheus-inference:{namespace}"


def pod_inference_source(namespace: str, pod: str) -> str:
    """The store source tied to one pod that left its namespace's page but is not gone (a failing one)."""
    return f"{inference_source(namespace)}/{pod}"


def query_name(query: PrometheusQuery) -> str:
    """A query as the log names it."""
    if query.what == GATEWAY_SERIES:
        return f"InferencePool {query.namespace}/{query.pool}"
    if query.what == INFERENCE_SERIES:
        return f"namespace {query.namespace}, inference series"
    return f"namespace {query.namespace}"


def namespace_source(namespace: str) -> str:
    """The store source that records whether Prometheus answers for one namespace's GPU series."""
    return f"prometheus {namespace}"
