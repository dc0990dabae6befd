"""Trigger metadata → a typed, validated, immutable TriggerSpec (SPEC §3), parsed once per distinct map."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

from keda_gpu_scaler.collect.gateway import DEFAULT_GATEWAY_METRICS_PORT
from keda_gpu_scaler.engines import ENGINE_CHOICES, accepts_model, engine_supports, unsupported_message
from keda_gpu_scaler.errors import ConfigError, quoted
from keda_gpu_scaler.names import OBJECT_NAME_RULE, is_object_name
from keda_gpu_scaler.vendors import Family, NvidiaField
from keda_gpu_scaler.wire import MAX_WIRE_NUMBER


class Metric(StrEnum):
    UTILIZATION = "utilization"
    MEMORY = "memory"
    # Read from the inference servers' own pages (SPEC §6), not from GPU exporters.
    REQUESTS = "requests"
    QUEUE = "queue"
    KV_CACHE = "kv_cache"
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


_INFERENCE_METRICS = frozenset({Metric.REQUESTS, Metric.QUEUE, Metric.KV_CACHE})


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
# A metric name becomes a path segment of the HPA's external metric (`s0-<name>`).
_METRIC_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,198}[A-Za-z0-9])?")
_POD_NAME_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251})?")


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


def _enum_parser(enum: type[StrEnum]) -> Callable[[str, str], Any]:
    allowed = ", ".join(member.value for member in enum)

    def parse(key: str, raw: str) -> StrEnum:
        try:
            return enum(raw)
        except ValueError:
            raise ConfigError(f"metadata {key}={quoted(raw)} is not allowed; use one of: {allowed}") from None

    return parse


# ASCII decimal only: float() also takes "５０", "٣", "5_0", "nan" and "1e-320", none of which a person
# means as a threshold.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
# KEDA treats a target under 0.0005 as none at all (the HPA becomes invalid).
MIN_THRESHOLD = 0.001


def _number(key: str, raw: str) -> float:
    if not _DECIMAL.fullmatch(raw):
        raise ConfigError(
            f"metadata {key}={quoted(raw)} is not a number; allowed: a finite decimal number like 70 or 0.5"
        )
    value = float(raw)
    if not math.isfinite(value):
        raise ConfigError(f"metadata {key}={quoted(raw)} must be a finite number")
    return value


def _threshold(key: str, raw: str) -> float:
    value = _number(key, raw)
    # The upper bound for percentages (100) depends on the metric: checked once all keys are read. Any
    # threshold beyond MAX_WIRE_NUMBER cannot be carried to KEDA (targetSize is an int64, milli-units).
    if not MIN_THRESHOLD <= value <= MAX_WIRE_NUMBER:
        raise ConfigError(
            f"metadata {key}={quoted(raw)} is out of range; allowed: {MIN_THRESHOLD:g} <= {key} <="
            f" {MAX_WIRE_NUMBER:g} (and <= 100 for the percentage metrics utilization, memory and kv_cache)"
        )
    return value


def _engine(key: str, raw: str) -> str:
    if raw not in ENGINE_CHOICES:
        raise ConfigError(
            f"metadata {key}={quoted(raw)} is not allowed; use one of: {', '.join(ENGINE_CHOICES)}"
        )
    return raw


def _model(key: str, raw: str) -> str:
    # Blanks at either end are a quoting slip in the YAML, never part of a served model's name.
    if not raw or len(raw) > 253 or not raw.isprintable() or raw != raw.strip():
        raise ConfigError(
            f"metadata {key}={quoted(raw)} is not a model name; allowed: 1-253 printable characters,"
            " not starting or ending with a blank"
        )
    return raw


_PORT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?")


def _metrics_port(key: str, raw: str) -> str:
    if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= 65535:
        return str(int(raw))
    if _PORT_NAME.fullmatch(raw) and any(c.isalpha() for c in raw):
        return raw
    raise ConfigError(
        f"metadata {key}={quoted(raw)} is not a port; allowed: a number 1-65535 or a container port name"
        " (at most 15 lower-case letters, digits and '-')"
    )


_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*")


def _metrics_path(key: str, raw: str) -> str:
    if not _PATH.fullmatch(raw) or len(raw) > 256:
        raise ConfigError(
            f"metadata {key}={quoted(raw)} is not a URL path; allowed: a path starting with '/', without"
            " query or fragment, e.g. /metrics"
        )
    return raw


def _inference_pool(key: str, raw: str) -> str:
    if not is_object_name(raw):
        raise ConfigError(
            f"metadata {key}={quoted(raw)} is not an InferencePool name; allowed: {OBJECT_NAME_RULE}"
            " (the pool is always in the ScaledObject's own namespace)"
        )
    return raw


def _port_number(key: str, raw: str) -> int:
    if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= 65535:
        return int(raw)
    raise ConfigError(f"metadata {key}={quoted(raw)} is not a port number; allowed: a number 1-65535")


def _activation_threshold(key: str, raw: str) -> float:
    value = _number(key, raw)
    if value < 0:
        raise ConfigError(f"metadata {key}={quoted(raw)} is out of range; allowed: a finite number >= 0")
    return value


def _metric_name(key: str, raw: str) -> str:
    if not _METRIC_NAME.fullmatch(raw):
        raise ConfigError(
            f"metadata {key}={quoted(raw)} is not a valid metric name; allowed: 1-200 letters, digits, '-', '_' or '.',"
            " starting and ending with a letter or digit"
        )
    return raw


def _pod_name_prefix(key: str, raw: str) -> str:
    if not _POD_NAME_PREFIX.fullmatch(raw):
        raise ConfigError(
            f"metadata {key}={quoted(raw)} is not a pod name prefix; allowed: lower-case letters, digits, '-' and '.',"
            " starting with a letter or digit"
        )
    return raw


def _pod_selector(key: str, raw: str) -> str:
    if not raw.strip():
        raise ConfigError(f"metadata {key}={quoted(raw)} is empty; allowed: a Kubernetes label selector")
    return raw.strip()


# The one table of keys: it drives parsing, the defaults, and the README's metadata table.
_REQUIRED = object()


@dataclass(frozen=True, slots=True)
class MetadataKey:
    key: str
    field: str
    parse: Callable[[str, str], Any]
    default: Any
    default_text: str
    help: str

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


KEYS: tuple[MetadataKey, ...] = (
    MetadataKey(
        "metric",
        "metric",
        _enum_parser(Metric),
        Metric.UTILIZATION,
        "`utilization`",
        "`utilization` (GPU busy %, 0–100 per GPU), `memory` (GPU memory used %, 0–100 per GPU), or from the"
        " inference server's own page: `requests` (running + waiting per pod), `queue` (waiting per pod),"
        " `kv_cache` (KV-cache in use, %); or from the inference gateway: `pending` (requests its endpoint"
        " picker holds for `inferencePool`, which wakes a workload from zero)",
    ),
    MetadataKey(
        "threshold",
        "threshold",
        _threshold,
        _REQUIRED,
        "required",
        "target per pod: in % for utilization, memory and kv_cache (1 <= threshold <= 100); requests or"
        " waiting requests per pod for requests and queue, pending requests per pod for pending (0.001 <= threshold"
        " <= 1e15: KEDA carries it as an int64 of milli-units)",
    ),
    MetadataKey(
        "activationThreshold",
        "activation_threshold",
        _activation_threshold,
        0.0,
        "`0`",
        "active when the returned value is greater than this (a finite number >= 0)",
    ),
    MetadataKey(
        "podSelector",
        "pod_selector",
        _pod_selector,
        None,
        "the scale target's selector",
        "Kubernetes label selector for the target pods (Kubernetes on only)",
    ),
    MetadataKey(
        "podNamePrefix",
        "pod_name_prefix",
        _pod_name_prefix,
        None,
        "none",
        "without Kubernetes (required there): the target pods are the namespace's pods whose name starts with this",
    ),
    MetadataKey(
        "gpuAggregation",
        "gpu_aggregation",
        _enum_parser(GpuAggregation),
        GpuAggregation.MEAN,
        "`mean`",
        "how one pod's GPUs combine: `mean` or `max`",
    ),
    MetadataKey(
        "aggregation",
        "aggregation",
        _enum_parser(Aggregation),
        None,
        "from `metricType`, else `sum`",
        "how pods combine into the returned value: `sum` (for AverageValue), `mean` (for Value), `max`",
    ),
    MetadataKey(
        "vendor",
        "vendor",
        _enum_parser(Vendor),
        Vendor.AUTO,
        "`auto`",
        "`auto`, `nvidia`, `amd`, `ack`: which exporters' series may count",
    ),
    MetadataKey(
        "nvidiaField",
        "nvidia_field",
        _enum_parser(NvidiaField),
        NvidiaField.AUTO,
        "`auto`",
        "`gpu_util` (DCGM_FI_DEV_GPU_UTIL), `gr_engine_active` (DCGM_FI_PROF_GR_ENGINE_ACTIVE × 100), or `auto`"
        " (gr_engine_active for MIG instances, else gpu_util where present)",
    ),
    MetadataKey(
        "source",
        "source",
        _enum_parser(Source),
        None,
        "the server's default (pending: `scrape`)",
        "`scrape` (exporters directly) or `prometheus`; pending reads the endpoint pickers' own pages unless"
        " it says `prometheus`, whatever the server's default (through Prometheus the wake waits for its"
        " scrapes)",
    ),
    MetadataKey(
        "engine",
        "engine",
        _engine,
        "auto",
        "`auto`",
        "inference metrics: `auto` (recognised from the page), "
        + ", ".join(f"`{choice}`" for choice in ENGINE_CHOICES[1:]),
    ),
    MetadataKey(
        "model",
        "model",
        _model,
        None,
        "all models",
        "inference metrics: only series whose `model_name`/`model` label equals this; pending: only requests"
        " whose `target_model_name` (where empty `model_name`) equals this (`other` counts for every model)",
    ),
    MetadataKey(
        "metricsPort",
        "metrics_port",
        _metrics_port,
        None,
        "port `metrics`, else `http`, else the first",
        "inference metrics with Kubernetes: the target pods' metrics port, a number or a container port name",
    ),
    MetadataKey(
        "metricsPath",
        "metrics_path",
        _metrics_path,
        "/metrics",
        "`/metrics`",
        "inference metrics with Kubernetes: the path of the target pods' metrics page",
    ),
    MetadataKey(
        "inferencePool",
        "inference_pool",
        _inference_pool,
        None,
        "required for pending",
        "pending: the InferencePool whose endpoint picker's queue is read, in the ScaledObject's namespace",
    ),
    MetadataKey(
        "gatewayMetricsPort",
        "gateway_metrics_port",
        _port_number,
        DEFAULT_GATEWAY_METRICS_PORT,
        f"`{DEFAULT_GATEWAY_METRICS_PORT}`",
        "pending with Kubernetes: the metrics port of the pool's endpoint-picker pods",
    ),
    MetadataKey(
        "metricName",
        "metric_name",
        _metric_name,
        None,
        "`gpu-utilization` / `gpu-memory` (see the metric tables)",
        "the name GetMetricSpec returns (KEDA prefixes it with `sN-`)",
    ),
)
_KEYS = {k.key: k for k in KEYS}
METADATA_KEYS: tuple[str, ...] = tuple(_KEYS)
DEFAULT_METRIC_NAMES = {
    Metric.UTILIZATION: "gpu-utilization",
    Metric.MEMORY: "gpu-memory",
    Metric.REQUESTS: "inference-requests",
    Metric.QUEUE: "inference-queue",
    Metric.KV_CACHE: "kv-cache",
    Metric.PENDING: "gateway-pending",
}
_GPU_ONLY_KEYS = ("vendor", "nvidia_field", "gpu_aggregation")
_INFERENCE_ONLY_KEYS = ("engine", "model", "metrics_port", "metrics_path")
_GATEWAY_ONLY_KEYS = ("inference_pool", "gateway_metrics_port")
# Keys about the target's pods: `pending` reads no pod of the target (there is none at zero replicas),
# so giving one would silently do nothing.
_POD_KEYS = ("pod_selector", "pod_name_prefix", "aggregation")
# What `pending` refuses: every key about GPUs, inference pages or target pods, except `model`, which
# selects the queue's model there too.
_NOT_FOR_PENDING = tuple(k for k in (*_GPU_ONLY_KEYS, *_INFERENCE_ONLY_KEYS, *_POD_KEYS) if k != "model")


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
        # KEDA's own keys configure KEDA's side only: they are neither parsed nor kept in the cache key.
        if key not in KEDA_OWN_KEYS:
            ours.append((key, raw))
    return (_parse_cached if CACHE_PARSES else _parse_cached.__wrapped__)(frozenset(ours))


# The parse cache below (off: every call parses); the caches benchmark turns it off to measure what it
# saves (docs/BENCHMARKS.md, "Caches").
CACHE_PARSES = True


@lru_cache(maxsize=4096)
def _parse_cached(items: frozenset[tuple[str, str]]) -> TriggerSpec:
    # KEDA sends the same map on every poll: parsing once per distinct map keeps validation off the hot path.
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
    for name in _GATEWAY_ONLY_KEYS:
        if name in given:
            raise ConfigError(
                f"metadata {given[name]} applies only to metric=pending (the inference gateway's queue),"
                f" not to metric={metric.value}"
            )
    wrong = _GPU_ONLY_KEYS if metric.inference else _INFERENCE_ONLY_KEYS
    for name in wrong:
        if name in given:
            kind = (
                "GPU metrics (utilization, memory)"
                if metric.inference
                else "inference metrics (requests, queue, kv_cache)"
            )
            raise ConfigError(f"metadata {given[name]} applies only to {kind}, not to metric={metric.value}")
    if metric.inference:
        if not engine_supports(fields["engine"], metric.value):
            raise ConfigError(f"metadata {unsupported_message(fields['engine'], metric.value)}")
        if fields["model"] is not None and not accepts_model(fields["engine"]):
            raise ConfigError(
                f"metadata model={quoted(fields['model'])}: engine {fields['engine']} series carry no model label"
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
