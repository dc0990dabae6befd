"""Trigger metadata parsing: defaults, KEDA's own keys, and a clear error for every bad input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keda_gpu_scaler.core.decide import aggregation_for
from keda_gpu_scaler.core.errors import ConfigError
from keda_gpu_scaler.core.trigger import Aggregation, GpuAggregation, Metric, Source, Vendor
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.pages.vendors import NvidiaField


def test_defaults_and_keda_keys_ignored() -> None:
    spec = parse_trigger(
        {
            "threshold": "70",
            "scalerAddress": "keda-gpu-scaler.keda:6000",
            "enableTLS": "false",
            "unsafeSsl": "true",
        }
    )
    assert spec.metric is Metric.UTILIZATION
    assert spec.threshold == 70.0
    assert spec.activation_threshold == 0.0
    assert spec.gpu_aggregation is GpuAggregation.MEAN
    assert spec.aggregation is None
    assert aggregation_for(spec, None) == (Aggregation.SUM, None)
    assert spec.vendor is Vendor.AUTO
    assert spec.nvidia_field is NvidiaField.AUTO
    assert spec.source is None
    assert spec.metric_name == "gpu-utilization"
    assert spec.pod_name_prefix is None and spec.pod_selector is None


def test_every_key_parsed() -> None:
    spec = parse_trigger(
        {
            "metric": "memory",
            "threshold": "85.5",
            "activationThreshold": "10",
            "podNamePrefix": "vllm-qwen-",
            "gpuAggregation": "max",
            "aggregation": "mean",
            "vendor": "amd",
            "source": "scrape",
            "metricName": "llm.gpu-mem",
        }
    )
    assert spec.metric is Metric.MEMORY
    assert spec.threshold == 85.5
    assert spec.activation_threshold == 10.0
    assert spec.pod_name_prefix == "vllm-qwen-"
    assert spec.gpu_aggregation is GpuAggregation.MAX
    assert spec.aggregation is Aggregation.MEAN
    assert spec.vendor is Vendor.AMD
    assert spec.source is Source.SCRAPE
    assert spec.metric_name == "llm.gpu-mem"
    nvidia = parse_trigger({"threshold": "70", "vendor": "nvidia", "nvidiaField": "gr_engine_active"})
    assert nvidia.nvidia_field is NvidiaField.GR_ENGINE_ACTIVE


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"metric": "memory", "nvidiaField": "gr_engine_active"}, "metric=memory"),
        ({"vendor": "amd", "nvidiaField": "gpu_util"}, "vendor='amd'"),
        ({"vendor": "ack", "nvidiaField": "gr_engine_active"}, "vendor='ack'"),
        ({"metric": "memory", "nvidiaField": "auto"}, "metric=memory"),
    ],
)
def test_nvidia_field_where_no_nvidia_utilisation_is_read_is_refused(extra: dict[str, str], why: str) -> None:
    # Read by nothing there: accepted, it would silently change nothing the user meant it to.
    with pytest.raises(ConfigError) as raised:
        parse_trigger({"threshold": "70", **extra})
    assert f"nvidiaField={extra['nvidiaField']!r}" in str(raised.value)
    assert why in str(raised.value)


# (metadata, the key=value the refusal must show, what else it names)
REFUSED_ACROSS_KEYS = [
    ({"metric": "requests", "vendor": "nvidia"}, "vendor='nvidia'", "GPU metrics"),
    ({"metric": "requests", "gpuAggregation": "max"}, "gpuAggregation='max'", "GPU metrics"),
    ({"engine": "vllm"}, "engine='vllm'", "inference metrics"),
    ({"metricsPort": "8123"}, "metricsPort='8123'", "inference metrics"),
    ({"metric": "demand", "gatewayMetricsPort": "9091"}, "gatewayMetricsPort='9091'", "inferencePool"),
    ({"metric": "demand", "prefillWeight": "2.5"}, "prefillWeight='2.5'", "demandUnit=tokens"),
    ({"metric": "requests", "window": "030"}, "window='030'", "metric=demand"),
    (
        {"metric": "pending", "inferencePool": "pool", "podNamePrefix": "zz-"},
        "podNamePrefix='zz-'",
        "metric=pending",
    ),
    ({"metric": "demand", "thresholdStart": "12"}, "thresholdStart='12'", "threshold='70'"),
    ({"thresholdFromEnv": "85"}, "thresholdFromEnv='85'", "threshold='70'"),
    ({"podSelector": "app=x", "podNamePrefix": "x-"}, "podSelector='app=x'", "podNamePrefix='x-'"),
    (
        {"metric": "requests", "inferencePool": "pool", "source": "prometheus"},
        "inferencePool='pool'",
        "allowed: scrape",
    ),
]


@pytest.mark.parametrize(("extra", "stated", "also"), REFUSED_ACROSS_KEYS)
def test_a_key_refused_beside_another_is_named_with_its_value(
    extra: dict[str, str], stated: str, also: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_trigger({"threshold": "70", "podNamePrefix": "vllm-", **extra})
    assert stated in str(raised.value) and also in str(raised.value), raised.value


def test_memory_metric_default_name() -> None:
    assert parse_trigger({"metric": "memory", "threshold": "80"}).metric_name == "gpu-memory"


BAD = [
    ({"threshold": "70", "thresold": "70"}, ["thresold", "did you mean 'threshold'"]),
    ({}, ["threshold", "required"]),
    ({"threshold": "abc"}, ["threshold", "'abc'", "not a number"]),
    ({"threshold": "0"}, ["threshold", "'0'", "0.001 <= threshold"]),
    ({"threshold": "100.5"}, ["threshold='100.5'", "metric=utilization", "1 <= threshold <= 100"]),
    (
        {"threshold": "0.8", "metric": "kv_cache"},
        ["threshold='0.8'", "metric=kv_cache", "1 <= threshold <= 100", 'as a percent it is threshold: "80"'],
    ),
    (
        {"threshold": "0.7"},
        ["threshold='0.7'", "metric=utilization", "1 <= threshold <= 100", 'threshold: "70"'],
    ),
    ({"threshold": "0.25", "metric": "memory"}, ["threshold='0.25'", "metric=memory", 'threshold: "25"']),
    ({"threshold": "0.005", "metric": "memory"}, ["threshold='0.005'", "1 <= threshold <= 100"]),
    ({"threshold": "150", "metric": "kv_cache"}, ["threshold='150'", "metric=kv_cache", "<= 100"]),
    ({"threshold": "8", "metric": "requests", "vendor": "amd"}, ["vendor", "only to GPU metrics"]),
    ({"threshold": "70", "engine": "vllm"}, ["engine", "only to inference metrics"]),
    ({"threshold": "8", "metric": "requests", "engine": "triton"}, ["triton", "requests", "queue"]),
    ({"threshold": "8", "metric": "queue", "engine": "tgi", "model": "m"}, ["model", "tgi"]),
    ({"threshold": "8", "metric": "requests", "metricsPort": "99999"}, ["metricsPort", "1-65535"]),
    (
        {"threshold": "8", "metric": "requests", "metricsPath": "metrics?x=1"},
        ["metricsPath", "starting with '/'"],
    ),
    (
        {"threshold": "8", "metric": "requests", "metricsPath": "/x/../metrics"},
        ["metricsPath='/x/../metrics'", "'.' or '..' segments"],
    ),
    (
        {"threshold": "8", "metric": "requests", "metricsPath": "/./metrics"},
        ["metricsPath='/./metrics'", "'.' or '..' segments"],
    ),
    (
        {"threshold": "8", "metric": "requests", "metricsPath": "/%6detrics"},
        ["metricsPath='/%6detrics'", "'%'-escapes"],
    ),
    ({"threshold": "8", "metric": "requests", "metricsPath": "/metrics/.."}, ["metricsPath", "'.' or '..'"]),
    ({"threshold": "8", "metric": "requests", "engine": "vlm"}, ["engine", "'vlm'", "vllm"]),
    ({"threshold": "-3"}, ["threshold", "'-3'"]),
    ({"threshold": "nan"}, ["threshold", "'nan'", "finite"]),
    ({"threshold": "inf"}, ["threshold", "'inf'", "finite"]),
    ({"threshold": "70", "activationThreshold": "-1"}, ["activationThreshold", "'-1'", ">= 0"]),
    ({"threshold": "70", "activationThreshold": "x"}, ["activationThreshold", "'x'", "not a number"]),
    ({"threshold": "70", "metric": "power"}, ["metric", "'power'", "utilization, memory"]),
    ({"threshold": "70", "aggregation": "avg"}, ["aggregation", "'avg'", "sum, mean, max"]),
    ({"threshold": "70", "gpuAggregation": "sum"}, ["gpuAggregation", "'sum'", "mean, max"]),
    ({"threshold": "70", "vendor": "intel"}, ["vendor", "'intel'", "auto, nvidia, amd, ack"]),
    ({"threshold": "70", "nvidiaField": "sm"}, ["nvidiaField", "'sm'", "gpu_util"]),
    ({"threshold": "70", "source": "http"}, ["source", "'http'", "scrape, prometheus"]),
    ({"threshold": "70", "metricName": "a/b"}, ["metricName", "'a/b'", "letters"]),
    ({"threshold": "70", "podNamePrefix": "Bad_Prefix"}, ["podNamePrefix", "'Bad_Prefix'", "lower-case"]),
    ({"threshold": "70", "podSelector": " "}, ["podSelector", "label selector"]),
    ({"threshold": "70", "podSelector": "app=x", "podNamePrefix": "x-"}, ["podSelector", "podNamePrefix"]),
    ({"threshold": "70", "url": "http://evil"}, ["'url'", "unknown"]),
    ({"threshold": "70", "namespace": "other"}, ["'namespace'", "unknown"]),
    ({"threshold": "70", "podNamePrefix": "a" * 2000}, ["podNamePrefix", "at most"]),
]


@pytest.mark.parametrize(("metadata", "fragments"), BAD)
def test_bad_metadata_is_a_clear_error(metadata: dict[str, str], fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_trigger(metadata)
    for fragment in fragments:
        assert fragment in str(raised.value)


def test_too_many_keys() -> None:
    metadata = {f"k{i}": "v" for i in range(100)} | {"threshold": "5"}
    with pytest.raises(ConfigError, match="keys"):
        parse_trigger(metadata)


KNOWN_KEYS = [
    "metric",
    "threshold",
    "activationThreshold",
    "podNamePrefix",
    "aggregation",
    "vendor",
    "metricName",
]
VALUES = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        ["70", "0", "100", "1e3", "-1", "nan", "inf", "sum", "mean", "max", "memory", "vllm-", ""]
    ),
)


@settings(deadline=None)
@given(st.dictionaries(st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=20)), VALUES, max_size=12))
def test_any_metadata_is_a_valid_spec_or_a_config_error(metadata: dict[str, str]) -> None:
    try:
        spec = parse_trigger(metadata)
    except ConfigError as error:
        assert str(error)  # always a message
        return
    assert 0 < spec.threshold <= 100
    assert spec.threshold >= 1 or not spec.metric.percent
    assert spec.activation_threshold >= 0


def test_from_env_keys_arrive_resolved_and_mean_the_base_key() -> None:
    spec = parse_trigger({"thresholdFromEnv": "65", "podNamePrefix": "a-", "activationThresholdFromEnv": "3"})
    assert (spec.threshold, spec.activation_threshold) == (65.0, 3.0)
    with pytest.raises(ConfigError, match="thresholdFromEnv='abc' is not a number"):
        parse_trigger({"thresholdFromEnv": "abc"})
    with pytest.raises(ConfigError, match="both given"):
        parse_trigger({"threshold": "70", "thresholdFromEnv": "65"})
    with pytest.raises(ConfigError, match="'urlFromEnv' is unknown"):
        parse_trigger({"threshold": "70", "urlFromEnv": "http://x"})


@pytest.mark.parametrize(
    "raw", ["５０", "٣", "5_0", "1e-320", "0x10", " 50", "50 ", "1e5000", "nan", "Infinity"]
)
def test_only_ascii_decimal_thresholds_are_numbers(raw: str) -> None:
    with pytest.raises(ConfigError, match="threshold"):
        parse_trigger({"threshold": raw, "podNamePrefix": "p-"})


def test_kedas_own_keys_are_limited_and_ignored() -> None:
    with pytest.raises(ConfigError, match="at most 1024"):
        parse_trigger({"threshold": "70", "scalerAddress": "x" * 2000})
    specs = {
        parse_trigger({"threshold": "70", "podNamePrefix": "p-", "scalerAddress": f"scaler-{index}:6000"})
        for index in range(3)
    }
    # Different scalerAddress values are one trigger (one subscription, one set of scrapes).
    assert specs == {parse_trigger({"threshold": "70", "podNamePrefix": "p-"})}


def test_error_messages_quote_at_most_about_a_hundred_characters() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_trigger({"threshold": "9" * 1000})
    assert len(str(raised.value)) < 400
    with pytest.raises(ConfigError) as raised:
        parse_trigger({"threshold": "70", "x" * 120: "1"})
    assert len(str(raised.value)) < 800


def test_inference_metrics_take_any_positive_threshold_and_their_own_names() -> None:
    spec = parse_trigger(
        {"metric": "requests", "threshold": "250", "engine": "sglang", "metricsPort": "metrics"}
    )
    assert (spec.threshold, spec.metric_name, spec.engine, spec.metrics_port) == (
        250,
        "inference-requests",
        "sglang",
        "metrics",
    )
    assert parse_trigger({"metric": "queue", "threshold": "5"}).metric_name == "inference-queue"
    assert parse_trigger({"metric": "kv_cache", "threshold": "80"}).metric_name == "kv-cache"
    assert (
        parse_trigger({"metric": "requests", "threshold": "8", "metricsPort": "08000"}).metrics_port == "8000"
    )


@pytest.mark.parametrize("written", ["Auto", " auto", "AUTO "])
def test_auto_written_otherwise_is_refused_saying_how_to_write_it(written: str) -> None:
    metadata = {"metric": "demand", "threshold": written, "thresholdStart": "10", "podNamePrefix": "chat-"}
    with pytest.raises(ConfigError, match="write it `auto`, in lower case"):
        parse_trigger(metadata)


@pytest.mark.parametrize(
    "path", ["/metrics", "/prometheus/metrics", "/.well-known/metrics", "/m/metrics.txt", "/a..b"]
)
def test_a_metrics_path_with_dots_inside_its_segments_is_a_path_of_its_own(path: str) -> None:
    assert parse_trigger({"metric": "requests", "threshold": "8", "metricsPath": path}).metrics_path == path
