"""metric=pending metadata (SPEC §7): what it takes, its defaults, and a clear error for each misuse."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.core.errors import ConfigError
from keda_gpu_scaler.core.trigger import Metric
from keda_gpu_scaler.core.trigger_parse import parse_trigger

PENDING = {"metric": "pending", "threshold": "1", "inferencePool": "chat-pool"}


def test_defaults() -> None:
    spec = parse_trigger(PENDING)
    assert spec.metric is Metric.PENDING
    assert (spec.metric_name, spec.inference_pool, spec.gateway_metrics_port) == (
        "gateway-pending",
        "chat-pool",
        9090,
    )
    assert (spec.model, spec.activation_threshold) == (None, 0)


def test_model_port_and_any_positive_threshold() -> None:
    spec = parse_trigger(
        {
            **PENDING,
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "gatewayMetricsPort": "9443",
            "threshold": "250.5",
        }
    )
    assert (spec.model, spec.gateway_metrics_port, spec.threshold) == (
        "meta-llama/Llama-3.1-8B-Instruct",
        9443,
        250.5,
    )


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ({"metric": "pending", "threshold": "1"}, ["inferencePool is required", "metric=pending"]),
        ({**PENDING, "threshold": "0"}, ["threshold", "0.001"]),
        ({**PENDING, "threshold": "-3"}, ["threshold"]),
        ({**PENDING, "threshold": "nan"}, ["threshold"]),
        ({**PENDING, "inferencePool": "llm/chat-pool"}, ["inferencePool='llm/chat-pool'", "own namespace"]),
        ({**PENDING, "inferencePool": "Chat_Pool"}, ["inferencePool='Chat_Pool'", "InferencePool name"]),
        ({**PENDING, "gatewayMetricsPort": "metrics"}, ["gatewayMetricsPort='metrics'", "1-65535"]),
        ({**PENDING, "gatewayMetricsPort": "70000"}, ["gatewayMetricsPort='70000'"]),
        ({**PENDING, "podNamePrefix": "vllm-"}, ["podNamePrefix", "does not apply to metric=pending"]),
        ({**PENDING, "podSelector": "app=vllm"}, ["podSelector", "does not apply to metric=pending"]),
        ({**PENDING, "aggregation": "mean"}, ["aggregation", "does not apply to metric=pending"]),
        ({**PENDING, "engine": "vllm"}, ["engine", "does not apply to metric=pending"]),
        ({**PENDING, "metricsPort": "8000"}, ["metricsPort", "does not apply to metric=pending"]),
        ({**PENDING, "vendor": "nvidia"}, ["vendor", "does not apply to metric=pending"]),
        (
            {"metric": "queue", "threshold": "8", "inferencePool": "chat-pool"},
            ["inferencePool", "only to metric=pending", "queue"],
        ),
        (
            {"metric": "utilization", "threshold": "70", "gatewayMetricsPort": "9090"},
            ["gatewayMetricsPort", "only to metric=pending"],
        ),
        ({**PENDING, "inferencepool": "chat-pool"}, ["inferencepool", "unknown", "inferencePool"]),
    ],
)
def test_misuse_is_a_clear_error(metadata: dict[str, str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_trigger(metadata)
    for word in words:
        assert word in str(caught.value), str(caught.value)
