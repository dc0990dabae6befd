"""`metric: demand` metadata (SPEC §6): its keys, their defaults, and every misuse refused naming the key."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.core.demand import DEFAULT_PREFILL_WEIGHT, DEFAULT_WINDOW_SECONDS, DemandUnit
from keda_gpu_scaler.core.errors import ConfigError
from keda_gpu_scaler.core.trigger import Metric
from keda_gpu_scaler.core.trigger_parse import parse_trigger

DEMAND = {"metric": "demand", "threshold": "9", "podNamePrefix": "chat-"}


def test_defaults() -> None:
    spec = parse_trigger(DEMAND)
    assert spec.metric is Metric.DEMAND and spec.metric.inference
    assert spec.metric_name == "inference-demand"
    assert (spec.window, spec.demand_unit, spec.prefill_weight) == (
        DEFAULT_WINDOW_SECONDS,
        DemandUnit.REQUESTS,
        DEFAULT_PREFILL_WEIGHT,
    )
    assert spec.inference_pool is None


def test_every_key_given() -> None:
    spec = parse_trigger(
        {
            **DEMAND,
            "threshold": "4500",
            "window": "30",
            "demandUnit": "tokens",
            "prefillWeight": "0.1",
            "engine": "vllm",
            "model": "llama",
            "inferencePool": "chat-pool",
            "gatewayMetricsPort": "9091",
        }
    )
    assert (spec.window, spec.demand_unit, spec.prefill_weight) == (30, DemandUnit.TOKENS, 0.1)
    assert (spec.inference_pool, spec.gateway_metrics_port) == ("chat-pool", 9091)
    assert parse_trigger({**DEMAND, "threshold": "1e6"}).threshold == 1e6  # no upper bound


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ({**DEMAND, "window": "9.9"}, ["window", "9.9", "10 <= window <= 600"]),
        ({**DEMAND, "window": "600.5"}, ["window", "600.5"]),
        ({**DEMAND, "window": "nan"}, ["window", "not a number"]),
        ({**DEMAND, "window": "inf"}, ["window", "not a number"]),
        ({**DEMAND, "window": "60\n"}, ["window", "not a number"]),
        ({**DEMAND, "window": ""}, ["window", "not a number"]),
        ({**DEMAND, "demandUnit": "Tokens"}, ["demandUnit", "requests, tokens"]),
        ({**DEMAND, "prefillWeight": "0.5"}, ["prefillWeight", "demandUnit=tokens"]),
        (
            {**DEMAND, "demandUnit": "tokens", "prefillWeight": "-0.1"},
            ["prefillWeight", "0 <= prefillWeight <= 4"],
        ),
        ({**DEMAND, "demandUnit": "tokens", "prefillWeight": "NaN"}, ["prefillWeight", "not a number"]),
        (
            {**DEMAND, "demandUnit": "tokens", "engine": "triton"},
            ["demandUnit", "triton", "no token counters"],
        ),
        ({**DEMAND, "engine": "llamacpp"}, ["engine llamacpp", "demand"]),
        ({**DEMAND, "source": "prometheus"}, ["source", "demand", "scrape"]),
        ({**DEMAND, "gatewayMetricsPort": "9091"}, ["gatewayMetricsPort", "inferencePool"]),
        ({**DEMAND, "vendor": "nvidia"}, ["vendor", "GPU metrics"]),
        ({**DEMAND, "threshold": "0"}, ["threshold"]),
        ({**DEMAND, "metric": "requests", "window": "60"}, ["window", "metric=demand", "metric=requests"]),
        ({**DEMAND, "metric": "utilization", "threshold": "50", "demandUnit": "tokens"}, ["demandUnit"]),
        (
            {"metric": "pending", "threshold": "1", "inferencePool": "p", "window": "60"},
            ["window", "pending"],
        ),
        ({**DEMAND, "metric": "queue", "inferencePool": "p"}, ["inferencePool", "metric=pending"]),
    ],
)
def test_misuse_is_a_clear_error(metadata: dict[str, str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_trigger(metadata)
    for word in words:
        assert word in str(raised.value), str(raised.value)


@pytest.mark.parametrize("unit", ["requests", "tokens"])
def test_a_learned_threshold_starts_at_threshold_start(unit: str) -> None:
    spec = parse_trigger({**DEMAND, "threshold": "auto", "thresholdStart": "12", "demandUnit": unit})
    assert (spec.threshold, spec.threshold_start, spec.learned) == (12.0, 12.0, True)
    assert not parse_trigger(DEMAND).learned
    # KEDA may resolve it from the target's environment, like any threshold.
    assert parse_trigger({**DEMAND, "threshold": "auto", "thresholdStartFromEnv": "7"}).threshold == 7.0


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ({**DEMAND, "threshold": "auto"}, ["thresholdStart is required", "threshold=auto", "0.002"]),
        ({**DEMAND, "thresholdStart": "12"}, ["thresholdStart", "only with threshold: auto"]),
        ({**DEMAND, "threshold": "auto", "thresholdStart": "0.001"}, ["thresholdStart='0.001'", "0.002"]),
        ({**DEMAND, "threshold": "auto", "thresholdStart": "1e15"}, ["thresholdStart='1e15'", "5e+14"]),
        (
            {**DEMAND, "threshold": "auto", "thresholdStart": "auto"},
            ["thresholdStart='auto'", "not a number"],
        ),
        ({**DEMAND, "threshold": "Auto", "thresholdStart": "12"}, ["threshold='Auto'", "write it `auto`"]),
        # The learner samples a pod with its time per output token: these engines print none.
        (
            {**DEMAND, "threshold": "auto", "thresholdStart": "5", "engine": "triton"},
            ["threshold=auto with engine=triton", "stay at thresholdStart", "vllm"],
        ),
        (
            {**DEMAND, "threshold": "auto", "thresholdStart": "5", "engine": "trtllm"},
            ["threshold=auto with engine=trtllm", "stay at thresholdStart"],
        ),
        (
            {**DEMAND, "metric": "requests", "threshold": "auto", "thresholdStart": "12"},
            ["threshold=auto", "metric=requests", "only demand"],
        ),
        (
            {"metric": "kv_cache", "threshold": "auto", "thresholdStart": "80", "podNamePrefix": "p-"},
            ["threshold=auto", "metric=kv_cache"],
        ),
        ({"threshold": "auto", "thresholdStart": "80", "podNamePrefix": "p-"}, ["metric=utilization"]),
    ],
)
def test_learned_threshold_misuse_is_a_clear_error(metadata: dict[str, str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_trigger(metadata)
    for word in words:
        assert word in str(raised.value), str(raised.value)
