"""Trigger metadata → a typed, validated, immutable TriggerSpec (SPEC §3), parsed once per distinct map."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from keda_gpu_scaler.core.demand import (
    DEFAULT_PREFILL_WEIGHT,
    DEFAULT_WINDOW_SECONDS,
    MAX_WINDOW_SECONDS,
    MIN_WINDOW_SECONDS,
    DemandUnit,
)
from keda_gpu_scaler.core.errors import ConfigError, quoted
from keda_gpu_scaler.core.slo import SLO_KEYS, SloTarget, take_slo
from keda_gpu_scaler.core.value_parsers import (
    REQUIRED,
    MetadataKey,
    enum_parser,
    parse_activation_threshold,
    parse_engine,
    parse_inference_pool,
    parse_metric_name,
    parse_metrics_path,
    parse_metrics_port,
    parse_model,
    parse_pod_name_prefix,
    parse_pod_selector,
    parse_port_number,
    parse_prefill_weight,
    parse_threshold_or_auto,
    parse_threshold_start,
    parse_window,
    settle_auto_threshold,
)
from keda_gpu_scaler.pages.engines import (
    ENGINE_CHOICES,
    accepts_model,
    engine_supports,
    supports_tokens,
    unsupported_message,
)
from keda_gpu_scaler.pages.gateways import DEFAULT_GATEWAY_METRICS_PORT
from keda_gpu_scaler.pages.vendors import Family, NvidiaField


class Metric(StrEnum):
    UTILIZATION = "utilization"
    MEMORY = "memory"
    # Read from the inference servers' own pages (SPEC §6), not from GPU exporters.
    REQUESTS = "requests"
    QUEUE = "queue"
    KV_CACHE = "kv_cache"
    # Work arriving per second, from each pod's counter of finished requests and its in-flight count
    # (SPEC §6): the sizing signal for LLM serving.
    DEMAND = "demand"
    # Requests the inference gateway holds for an InferencePool (SPEC §7): no pod of the target is read.
    PENDING = "pending"

    @property
    def inference(self) -> bool:
        return self in _INFERENCE_METRICS

    @property
    def gateway(self) -> bool:
        return self is Metric.PENDING

    @property
    def percent(self) -> bool:
        """The value is a percentage per pod, so the threshold is one too (at most 100)."""
        return self in (Metric.UTILIZATION, Metric.MEMORY, Metric.KV_CACHE)


_INFERENCE_METRICS = frozenset({Metric.REQUESTS, Metric.QUEUE, Metric.KV_CACHE, Metric.DEMAND})


class GpuAggregation(StrEnum):
    MEAN = "mean"
    MAX = "max"


class Aggregation(StrEnum):
    SUM = "sum"
    MEAN = "mean"
    MAX = "max"


class Vendor(StrEnum):
    AUTO = "auto"
    NVIDIA = "nvidia"
    AMD = "amd"
    ACK = "ack"

    @property
    def families(self) -> frozenset[Family]:
        # Asked on every evaluation: one set per vendor, made once (iterating an enum class is slow).
        return _VENDOR_FAMILIES[self]


_VENDOR_FAMILIES: dict[Vendor, frozenset[Family]] = {
    vendor: frozenset(Family) if vendor is Vendor.AUTO else frozenset({Family(vendor.value)})
    for vendor in Vendor
}


class Source(StrEnum):
    SCRAPE = "scrape"
    PROMETHEUS = "prometheus"


# KEDA forwards these with every call; they configure KEDA's side of the connection, not ours.
KEDA_OWN_KEYS = frozenset({"scalerAddress", "enableTLS", "unsafeSsl"})
FROM_ENV = "FromEnv"

MAX_METADATA_KEYS = 64
MAX_METADATA_VALUE_CHARS = 1024
MAX_METADATA_KEY_CHARS = 128


@dataclass(frozen=True, slots=True)
class TriggerSpec:
    metric: Metric
    threshold: float
    activation_threshold: float
    pod_selector: str | None
    pod_name_prefix: str | None
    gpu_aggregation: GpuAggregation
    aggregation: Aggregation | None  # None: not given, chosen from the trigger's metricType (sum by default)
    vendor: Vendor
    nvidia_field: NvidiaField
    source: Source | None  # None: the server's default source
    metric_name: str
    # Inference metrics only (SPEC §6).
    engine: str = "auto"
    model: str | None = None
    metrics_port: str | None = (
        None  # a number or a container port name; None: metrics, else http, else the first
    )
    metrics_path: str = "/metrics"
    # metric=pending only (SPEC §7): the InferencePool in the ScaledObject's namespace, and the port of its
    # endpoint picker's metrics page.
    inference_pool: str | None = None
    gateway_metrics_port: int = DEFAULT_GATEWAY_METRICS_PORT
    # metric=demand only (SPEC §6): the seconds its rates are taken over, what one unit of demand is, and
    # what a prompt token weighs against a generated one when requests are weighed by their tokens.
    window: float = DEFAULT_WINDOW_SECONDS
    demand_unit: DemandUnit = DemandUnit.REQUESTS
    prefill_weight: float = DEFAULT_PREFILL_WEIGHT
    # metric=demand only (SPEC §6): the latency target its pods must meet, if the user states one.
    slo: SloTarget | None = None
    # `threshold: auto` only: where the learned target starts (threshold holds it until it moves).
    threshold_start: float | None = None

    @property
    def learned(self) -> bool:
        """The target is learned at run time from the pods' latency (`threshold: auto`)."""
        return self.threshold_start is not None


# The one table of keys: it drives parsing, the defaults, and docs/reference.md's metadata table.
KEYS: tuple[MetadataKey, ...] = (
    MetadataKey(
        "metric",
        "metric",
        enum_parser(Metric),
        Metric.UTILIZATION,
        "`utilization`",
        "`utilization` (GPU busy %, 0–100 per GPU), `memory` (GPU memory used %, 0–100 per GPU), or from the"
        " inference server's own page: `requests` (running + waiting per pod), `queue` (waiting per pod),"
        " `kv_cache` (KV-cache in use, %), `demand` (work arriving per second, from the counter of finished"
        " requests: the one to size LLM servers with); or from the inference gateway: `pending` (requests"
        " its endpoint picker holds for `inferencePool`, which wakes a workload from zero)",
    ),
    MetadataKey(
        "threshold",
        "threshold",
        parse_threshold_or_auto,
        REQUIRED,
        "required",
        "target per pod: in % for utilization, memory and kv_cache (1 <= threshold <= 100); requests or"
        " waiting requests per pod for requests and queue, requests (or weighted tokens) per second one"
        " replica serves for demand, pending requests per pod for pending (0.001 <="
        " threshold <= 1e15: KEDA carries it as an int64 of milli-units); demand also takes `auto`: learned"
        " from the pods' latency, starting at `thresholdStart`",
    ),
    MetadataKey(
        "thresholdStart",
        "threshold_start",
        parse_threshold_start,
        None,
        "required with `threshold: auto`",
        "demand with threshold auto: the first target, from which the learned one moves within 0.5x-2x"
        " (0.002 <= thresholdStart <= 5e14)",
    ),
    MetadataKey(
        "activationThreshold",
        "activation_threshold",
        parse_activation_threshold,
        0.0,
        "`0`",
        "active when the returned value is greater than this (a finite number >= 0)",
    ),
    MetadataKey(
        "podSelector",
        "pod_selector",
        parse_pod_selector,
        None,
        "the scale target's selector",
        "Kubernetes label selector for the target pods (Kubernetes on only)",
    ),
    MetadataKey(
        "podNamePrefix",
        "pod_name_prefix",
        parse_pod_name_prefix,
        None,
        "none",
        "without Kubernetes (required there): the target pods are the namespace's pods whose name starts with this",
    ),
    MetadataKey(
        "gpuAggregation",
        "gpu_aggregation",
        enum_parser(GpuAggregation),
        GpuAggregation.MEAN,
        "`mean`",
        "how one pod's GPUs combine: `mean` or `max`",
    ),
    MetadataKey(
        "aggregation",
        "aggregation",
        enum_parser(Aggregation),
        None,
        "from `metricType`, else `sum`",
        "how pods combine into the returned value: `sum` (for AverageValue), `mean` (for Value), `max`",
    ),
    MetadataKey(
        "vendor",
        "vendor",
        enum_parser(Vendor),
        Vendor.AUTO,
        "`auto`",
        "`auto`, `nvidia`, `amd`, `ack`: which exporters' series may count",
    ),
    MetadataKey(
        "nvidiaField",
        "nvidia_field",
        enum_parser(NvidiaField),
        NvidiaField.AUTO,
        "`auto`",
        "`gpu_util` (DCGM_FI_DEV_GPU_UTIL), `gr_engine_active` (DCGM_FI_PROF_GR_ENGINE_ACTIVE × 100), or `auto`"
        " (gr_engine_active for MIG instances, else gpu_util where present)",
    ),
    MetadataKey(
        "source",
        "source",
        enum_parser(Source),
        None,
        "the server's default (pending: `scrape`)",
        "`scrape` (exporters directly) or `prometheus`; pending reads the endpoint pickers' own pages unless"
        " it says `prometheus`, whatever the server's default (through Prometheus the wake waits for its"
        " scrapes)",
    ),
    MetadataKey(
        "engine",
        "engine",
        parse_engine,
        "auto",
        "`auto`",
        "inference metrics: `auto` (recognised from the page), "
        + ", ".join(f"`{choice}`" for choice in ENGINE_CHOICES[1:]),
    ),
    MetadataKey(
        "model",
        "model",
        parse_model,
        None,
        "all models",
        "inference metrics: only series whose `model_name`/`model` label equals this; pending: only requests"
        " whose `target_model_name` (where empty `model_name`) equals this (`other` counts for every model)",
    ),
    MetadataKey(
        "metricsPort",
        "metrics_port",
        parse_metrics_port,
        None,
        "port `metrics`, else `http`, else the first",
        "inference metrics with Kubernetes: the target pods' metrics port, a number or a container port name",
    ),
    MetadataKey(
        "metricsPath",
        "metrics_path",
        parse_metrics_path,
        "/metrics",
        "`/metrics`",
        "inference metrics with Kubernetes: the path of the target pods' metrics page",
    ),
    MetadataKey(
        "inferencePool",
        "inference_pool",
        parse_inference_pool,
        None,
        "required for pending",
        "pending (and demand, optionally): the InferencePool whose endpoint picker's queue is read, in the"
        " ScaledObject's namespace",
    ),
    MetadataKey(
        "gatewayMetricsPort",
        "gateway_metrics_port",
        parse_port_number,
        DEFAULT_GATEWAY_METRICS_PORT,
        f"`{DEFAULT_GATEWAY_METRICS_PORT}`",
        "pending with Kubernetes: the metrics port of the pool's endpoint-picker pods",
    ),
    MetadataKey(
        "window",
        "window",
        parse_window,
        DEFAULT_WINDOW_SECONDS,
        f"`{DEFAULT_WINDOW_SECONDS:g}`",
        f"demand: the seconds each pod's rate is taken over ({MIN_WINDOW_SECONDS:g}-{MAX_WINDOW_SECONDS:g})",
    ),
    MetadataKey(
        "demandUnit",
        "demand_unit",
        enum_parser(DemandUnit),
        DemandUnit.REQUESTS,
        "`requests`",
        "demand: `requests` (requests per second) or `tokens` (each request weighed by its prompt and"
        " generated tokens, so one threshold holds when the request mix changes)",
    ),
    MetadataKey(
        "prefillWeight",
        "prefill_weight",
        parse_prefill_weight,
        DEFAULT_PREFILL_WEIGHT,
        f"`{DEFAULT_PREFILL_WEIGHT:g}`",
        "demand with demandUnit tokens: what one prompt token weighs against one generated token (0-4)",
    ),
    MetadataKey(
        "metricName",
        "metric_name",
        parse_metric_name,
        None,
        "`gpu-utilization` / `gpu-memory` (see the metric tables)",
        "the name GetMetricSpec returns (KEDA prefixes it with `sN-`)",
    ),
    *SLO_KEYS,
)
_KEYS = {k.key: k for k in KEYS}
METADATA_KEYS: tuple[str, ...] = tuple(_KEYS)
DEFAULT_METRIC_NAMES = {
    Metric.UTILIZATION: "gpu-utilization",
    Metric.MEMORY: "gpu-memory",
    Metric.REQUESTS: "inference-requests",
    Metric.QUEUE: "inference-queue",
    Metric.KV_CACHE: "kv-cache",
    Metric.DEMAND: "inference-demand",
    Metric.PENDING: "gateway-pending",
}
_GPU_ONLY_KEYS = ("vendor", "nvidia_field", "gpu_aggregation")
_INFERENCE_ONLY_KEYS = ("engine", "model", "metrics_port", "metrics_path")
_GATEWAY_ONLY_KEYS = ("inference_pool", "gateway_metrics_port")
_DEMAND_ONLY_KEYS = ("window", "demand_unit", "prefill_weight")
# Keys about the target's pods: `pending` reads no pod of the target (there is none at zero replicas),
# so giving one would silently do nothing.
_POD_KEYS = ("pod_selector", "pod_name_prefix", "aggregation")
# What `pending` refuses: every key about GPUs, inference pages or target pods, except `model`, which
# selects the queue's model there too.
_NOT_FOR_PENDING = tuple(
    k for k in (*_GPU_ONLY_KEYS, *_INFERENCE_ONLY_KEYS, *_POD_KEYS, *_DEMAND_ONLY_KEYS) if k != "model"
)


def parse_trigger(metadata: Mapping[str, str]) -> TriggerSpec:
    """Validate trigger metadata; raises ConfigError naming the key, the value and what is allowed."""
    if len(metadata) > MAX_METADATA_KEYS:
        raise ConfigError(f"metadata has {len(metadata)} keys; at most {MAX_METADATA_KEYS} are allowed")
    ours: list[tuple[str, str]] = []
    for key, raw in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise ConfigError(
                f"metadata key {quoted(key)} is longer than {MAX_METADATA_KEY_CHARS} characters"
            )
        if len(raw) > MAX_METADATA_VALUE_CHARS:
            raise ConfigError(
                f"metadata {quoted(key)} is {len(raw)} characters long; at most {MAX_METADATA_VALUE_CHARS}"
            )
        # KEDA's own keys configure KEDA's side only: they are not parsed.
        if key not in KEDA_OWN_KEYS:
            ours.append((key, raw))
    return _parse(ours)


def _parse(items: list[tuple[str, str]]) -> TriggerSpec:
    # Parsed on every call: a few µs, against a KEDA poll of each ScaledObject every 30 s (docs/BENCHMARKS.md,
    # "Caches": a cache of parsed maps saved about 1 % of the scaler's CPU there).
    fields: dict[str, Any] = {}
    for key, raw in sorted(items):
        # KEDA resolves `<key>FromEnv` from the target container's environment and forwards the value
        # under that same name: it means `<key>`.
        base = key.removesuffix(FROM_ENV) if key.endswith(FROM_ENV) else key
        if base not in _KEYS:
            raise ConfigError(_unknown_key_message(key))
        spec_key = _KEYS[base]
        if spec_key.field in fields:
            raise ConfigError(f"metadata {base} and {base}{FROM_ENV} are both given; give one of them")
        fields[spec_key.field] = spec_key.parse(key, raw)
    given = {name: key for name, key in ((_KEYS[k.removesuffix(FROM_ENV)].field, k) for k, _ in items)}
    for spec_key in KEYS:
        if spec_key.field in fields:
            continue
        if spec_key.required:
            raise ConfigError(f"metadata {spec_key.key} is required; allowed: {spec_key.help}")
        fields[spec_key.field] = spec_key.default
    settle_auto_threshold(fields, given)
    fields["slo"] = take_slo(fields, given, demand=fields["metric"] is Metric.DEMAND)
    _check_metric_fit(fields, given)
    if fields["metric_name"] is None:
        fields["metric_name"] = DEFAULT_METRIC_NAMES[fields["metric"]]
    if fields["pod_selector"] is not None and fields["pod_name_prefix"] is not None:
        raise ConfigError("metadata podSelector and podNamePrefix exclude each other; give one of them")
    return TriggerSpec(**fields)


# A percent threshold below 1 is almost always a fraction typed for a percent (vLLM's page prints the
# KV-cache as 0-1): threshold 0.8 would ask for 100 times the replicas meant.
MIN_PERCENT_THRESHOLD = 1.0


def _check_percent_threshold(metric: Metric, threshold: float) -> None:
    allowed = f"allowed: a percentage with {MIN_PERCENT_THRESHOLD:g} <= threshold <= 100"
    if threshold > 100:
        raise ConfigError(
            f"metadata threshold={threshold:g} is out of range for metric={metric.value}; {allowed}"
        )
    if threshold < MIN_PERCENT_THRESHOLD:
        as_percent = threshold * 100
        hint = (
            f'; {threshold:g} looks like a fraction: as a percent it is threshold: "{as_percent:g}"'
            if as_percent >= MIN_PERCENT_THRESHOLD
            else ""
        )
        raise ConfigError(
            f"metadata threshold={threshold:g} is out of range for metric={metric.value}; {allowed}{hint}"
        )


def _check_metric_fit(fields: dict[str, Any], given: dict[str, str]) -> None:
    """Keys that only make sense for one kind of metric, and what the chosen engine can serve."""
    metric: Metric = fields["metric"]
    if metric.percent:
        _check_percent_threshold(metric, fields["threshold"])
    if metric.gateway:
        _check_gateway_fit(given)
        return
    if metric is Metric.DEMAND:
        _check_demand_fit(fields, given)
    else:
        for name in _DEMAND_ONLY_KEYS:
            if name in given:
                raise ConfigError(
                    f"metadata {given[name]}={quoted(_given_value(fields, name))} applies only to"
                    f" metric=demand, not to metric={metric.value}; remove it"
                )
        for name in _GATEWAY_ONLY_KEYS:
            if name in given:
                raise ConfigError(
                    f"metadata {given[name]} applies only to metric=pending and metric=demand (the inference"
                    f" gateway's queue), not to metric={metric.value}"
                )
    wrong = _GPU_ONLY_KEYS if metric.inference else _INFERENCE_ONLY_KEYS
    for name in wrong:
        if name in given:
            kind = (
                "GPU metrics (utilization, memory)"
                if metric.inference
                else "inference metrics (requests, queue, kv_cache, demand)"
            )
            raise ConfigError(f"metadata {given[name]} applies only to {kind}, not to metric={metric.value}")
    if metric.inference:
        if not engine_supports(fields["engine"], metric.value):
            raise ConfigError(f"metadata {unsupported_message(fields['engine'], metric.value)}")
        if fields["model"] is not None and not accepts_model(fields["engine"]):
            raise ConfigError(
                f"metadata model={quoted(fields['model'])}: engine {fields['engine']} series carry no model label"
            )


def _given_value(fields: dict[str, Any], name: str) -> str:
    value = fields[name]
    return (
        value.value
        if isinstance(value, StrEnum)
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )


def _check_demand_fit(fields: dict[str, Any], given: dict[str, str]) -> None:
    """metric=demand: what the unit and the pool need."""
    if fields["demand_unit"] is DemandUnit.TOKENS and not supports_tokens(fields["engine"]):
        raise ConfigError(
            f"metadata demandUnit=tokens: engine {fields['engine']} prints no token counters; use"
            " demandUnit requests"
        )
    if "prefill_weight" in given and fields["demand_unit"] is not DemandUnit.TOKENS:
        raise ConfigError(
            f"metadata {given['prefill_weight']} applies only to demandUnit=tokens (requests are counted,"
            " not weighed); remove it or set demandUnit: tokens"
        )
    if fields["source"] is Source.PROMETHEUS:
        raise ConfigError(
            "metadata source='prometheus' is not available for metric=demand: its rates are taken over the"
            " pods' own pages as they are read; allowed: scrape"
        )
    if "gateway_metrics_port" in given and "inference_pool" not in given:
        raise ConfigError(
            f"metadata {given['gateway_metrics_port']} applies only with inferencePool (the pool whose"
            " endpoint picker's queue adds to demand)"
        )


def _check_gateway_fit(given: dict[str, str]) -> None:
    """metric=pending: inferencePool is required; keys about GPUs, inference pages or target pods are not."""
    if "inference_pool" not in given:
        raise ConfigError(
            "metadata inferencePool is required for metric=pending; allowed: the name of the InferencePool"
            " (in the ScaledObject's namespace) whose endpoint picker holds the requests"
        )
    for name in _NOT_FOR_PENDING:
        if name in given:
            raise ConfigError(
                f"metadata {given[name]} does not apply to metric=pending: it reads the queue of the"
                " InferencePool's endpoint picker (summed over its replicas), not the target's pods;"
                " remove it"
            )


def _unknown_key_message(key: str) -> str:
    allowed = sorted(set(_KEYS) | KEDA_OWN_KEYS)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"metadata key {quoted(key)} is unknown{hint}; allowed keys: {', '.join(allowed)}"
