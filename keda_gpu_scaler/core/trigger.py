"""What a trigger is (SPEC §3): the immutable TriggerSpec, the choices its keys take, and the one table of keys
(trigger_parse reads metadata into a TriggerSpec by it)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from keda_gpu_scaler.core.demand import (
    DEFAULT_PREFILL_WEIGHT,
    DEFAULT_WINDOW_SECONDS,
    MAX_WINDOW_SECONDS,
    MIN_WINDOW_SECONDS,
    DemandUnit,
)
from keda_gpu_scaler.core.slo import SLO_KEYS, SloTarget
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
)
from keda_gpu_scaler.pages.engines import ENGINE_CHOICES
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
# The pod metrics that may also read an `inferencePool`: `demand` adds its pending requests (SPEC §6), the
# `requests` guard acts while it holds any. (`pending` reads nothing else.)
POOL_OPTIONAL = frozenset({Metric.DEMAND, Metric.REQUESTS})


def states_slo(metric: Metric | None, with_pool: bool) -> bool:
    """Whether a trigger may state a latency target: `demand` sizes for it, and the `requests` guard with
    an `inferencePool` also acts while it is missed."""
    return metric is Metric.DEMAND or (metric is Metric.REQUESTS and with_pool)


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
        " (gr_engine_active for MIG instances, else gpu_util where present); only for metric utilization with"
        " vendor auto or nvidia",
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
        " whose `target_model_name` (where empty `model_name`) equals this (`other`, and a queue without model labels, count for every model)",
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
        "pending (and demand or requests, optionally): the InferencePool whose endpoint picker's queue is"
        " read, in the ScaledObject's namespace (with requests: the guard acts only while it holds requests)",
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
KEYS_BY_NAME = {k.key: k for k in KEYS}
DEFAULT_METRIC_NAMES = {
    Metric.UTILIZATION: "gpu-utilization",
    Metric.MEMORY: "gpu-memory",
    Metric.REQUESTS: "inference-requests",
    Metric.QUEUE: "inference-queue",
    Metric.KV_CACHE: "kv-cache",
    Metric.DEMAND: "inference-demand",
    Metric.PENDING: "gateway-pending",
}
