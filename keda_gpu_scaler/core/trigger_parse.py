"""Trigger metadata → a validated TriggerSpec (SPEC §3): the limits on a map, each key read by its row of the
table, and each key checked against the metric it applies to."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from keda_gpu_scaler.core.demand import DemandUnit
from keda_gpu_scaler.core.errors import ConfigError, quoted
from keda_gpu_scaler.core.slo import check_learnable, check_measured, take_slo
from keda_gpu_scaler.core.trigger import (
    DEFAULT_METRIC_NAMES,
    FROM_ENV,
    KEDA_OWN_KEYS,
    KEYS,
    KEYS_BY_NAME,
    POOL_OPTIONAL,
    Metric,
    Source,
    TriggerSpec,
    Vendor,
    states_slo,
)
from keda_gpu_scaler.core.value_parsers import (
    AUTO_THRESHOLD,
    MAX_THRESHOLD_START,
    MIN_THRESHOLD_START,
)
from keda_gpu_scaler.pages.engines import accepts_model, engine_supports, supports_tokens, unsupported_message
from keda_gpu_scaler.pages.vendors import Family

MAX_METADATA_KEYS = 64
MAX_METADATA_VALUE_CHARS = 1024
MAX_METADATA_KEY_CHARS = 128

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
    # Each field given: the key it came under, and that key with the value as written (for the errors).
    given: dict[str, str] = {}
    stated: dict[str, str] = {}
    for key, raw in sorted(items):
        # KEDA resolves `<key>FromEnv` from the target container's environment and forwards the value
        # under that same name: it means `<key>`.
        base = key.removesuffix(FROM_ENV) if key.endswith(FROM_ENV) else key
        if base not in KEYS_BY_NAME:
            raise ConfigError(_unknown_key_message(key))
        spec_key = KEYS_BY_NAME[base]
        if spec_key.field in fields:
            raise ConfigError(
                f"metadata {stated[spec_key.field]} and {key}={quoted(raw)} are both given; give one of them"
            )
        fields[spec_key.field] = spec_key.parse(key, raw)
        given[spec_key.field] = key
        stated[spec_key.field] = f"{key}={quoted(raw)}"
    for spec_key in KEYS:
        if spec_key.field in fields:
            continue
        if spec_key.required:
            raise ConfigError(f"metadata {spec_key.key} is required; allowed: {spec_key.help}")
        fields[spec_key.field] = spec_key.default
    settle_auto_threshold(fields, given, stated)
    fields["slo"] = take_slo(fields, stated, allowed=states_slo(fields["metric"], "inference_pool" in given))
    check_measured(fields["slo"], fields["engine"], stated)
    _check_metric_fit(fields, stated)
    if fields["metric_name"] is None:
        fields["metric_name"] = DEFAULT_METRIC_NAMES[fields["metric"]]
    if fields["pod_selector"] is not None and fields["pod_name_prefix"] is not None:
        raise ConfigError(
            f"metadata {stated['pod_selector']} and {stated['pod_name_prefix']} exclude each other; give one"
            " of them"
        )
    return TriggerSpec(**fields)


# A percent threshold below 1 is almost always a fraction typed for a percent (vLLM's page prints the
# KV-cache as 0-1): threshold 0.8 would ask for 100 times the replicas meant.
MIN_PERCENT_THRESHOLD = 1.0


def _check_percent_threshold(metric: Metric, threshold: float, stated: str) -> None:
    """`stated`: the key with the value as written (never the float reformatted: 100.00001 is not 100)."""
    allowed = f"allowed: a percentage with {MIN_PERCENT_THRESHOLD:g} <= threshold <= 100"
    if threshold > 100:
        raise ConfigError(f"metadata {stated} is out of range for metric={metric.value}; {allowed}")
    if threshold < MIN_PERCENT_THRESHOLD:
        as_percent = threshold * 100
        hint = (
            f'; {threshold:g} looks like a fraction: as a percent it is threshold: "{as_percent:g}"'
            if as_percent >= MIN_PERCENT_THRESHOLD
            else ""
        )
        raise ConfigError(f"metadata {stated} is out of range for metric={metric.value}; {allowed}{hint}")


def _check_metric_fit(fields: dict[str, Any], given: dict[str, str]) -> None:
    """Keys that only make sense for one kind of metric, and what the chosen engine can serve. `given`:
    each field given, as its key with the value written (`vendor='amd'`), for the errors."""
    metric: Metric = fields["metric"]
    if metric.percent:
        _check_percent_threshold(metric, fields["threshold"], given.get("threshold", "threshold"))
    if metric.gateway:
        _check_gateway_fit(given)
        return
    if "gateway_metrics_port" in given and "inference_pool" not in given and metric in POOL_OPTIONAL:
        raise ConfigError(
            f"metadata {given['gateway_metrics_port']} applies only with inferencePool (the pool whose"
            f" endpoint picker's queue metric={metric.value} reads)"
        )
    if metric is Metric.DEMAND:
        _check_demand_fit(fields, given)
    else:
        _only_for(fields, given, _DEMAND_ONLY_KEYS, "metric=demand")
        if metric is Metric.REQUESTS:
            _check_gated_guard(fields, given)
        else:
            queue = "metric=pending, metric=demand and metric=requests (the inference gateway's queue)"
            _only_for(fields, given, _GATEWAY_ONLY_KEYS, queue)
    wrong = _GPU_ONLY_KEYS if metric.inference else _INFERENCE_ONLY_KEYS
    for name in wrong:
        if name in given:
            kind = (
                "GPU metrics (utilization, memory)"
                if metric.inference
                else "inference metrics (requests, queue, kv_cache, demand)"
            )
            raise ConfigError(f"metadata {given[name]} applies only to {kind}, not to metric={metric.value}")
    if "nvidia_field" in given and not metric.inference:
        _check_nvidia_field(fields, given)
    if metric.inference:
        if not engine_supports(fields["engine"], metric.value):
            raise ConfigError(f"metadata {unsupported_message(fields['engine'], metric.value)}")
        if fields["model"] is not None and not accepts_model(fields["engine"]):
            raise ConfigError(
                f"metadata model={quoted(fields['model'])}: engine {fields['engine']} series carry no model label"
            )


def _check_nvidia_field(fields: dict[str, Any], given: dict[str, str]) -> None:
    """nvidiaField chooses NVIDIA's utilisation series: on memory, or where no NVIDIA series may count, it
    would be read by nothing."""
    if fields["metric"] is not Metric.UTILIZATION:
        raise ConfigError(
            f"metadata {given['nvidia_field']} applies only to metric=utilization (it chooses NVIDIA's"
            f" utilisation series), not to metric={fields['metric'].value}; remove it"
        )
    vendor: Vendor = fields["vendor"]
    if Family.NVIDIA not in vendor.families:
        raise ConfigError(
            f"metadata {given['nvidia_field']} applies only to NVIDIA's series, and {given['vendor']} admits"
            " none; remove it or use vendor auto or nvidia"
        )


def _only_for(fields: dict[str, Any], given: dict[str, str], names: tuple[str, ...], what: str) -> None:
    """ConfigError naming the first of `names` given: it applies only to `what`."""
    for name in names:
        if name in given:
            raise ConfigError(
                f"metadata {given[name]} applies only to {what}, not"
                f" to metric={fields['metric'].value}; remove it"
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


def _check_gated_guard(fields: dict[str, Any], given: dict[str, str]) -> None:
    """metric=requests with inferencePool (the guard acts while the pool holds requests): its pages read."""
    if "inference_pool" in given and fields["source"] is Source.PROMETHEUS:
        raise ConfigError(
            f"metadata {given['inference_pool']} with metric=requests is read from the pool's endpoint"
            " pickers' own pages: source='prometheus' is not available with it; allowed: scrape"
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
    allowed = sorted(set(KEYS_BY_NAME) | KEDA_OWN_KEYS)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"metadata key {quoted(key)} is unknown{hint}; allowed keys: {', '.join(allowed)}"


def settle_auto_threshold(
    fields: dict[str, Any], given: Mapping[str, str], stated: Mapping[str, str]
) -> None:
    """`threshold: auto` targets thresholdStart until the learner moves it: only demand's can be learned.
    `given`: the key each field came under; `stated`: that key with the value written, for the errors."""
    if fields["threshold"] != AUTO_THRESHOLD:
        if "threshold_start" in stated:
            raise ConfigError(
                f"metadata {stated['threshold_start']} applies only with threshold: auto, not beside"
                f" {stated['threshold']} (a number is the target itself, never learned); remove it or set"
                " threshold: auto"
            )
        return
    if fields["metric"] != "demand":
        raise ConfigError(
            f"metadata {given['threshold']}=auto is not allowed for metric={fields['metric']}: only"
            " demand's target is the work one replica serves, which its latency can be learned against"
            " (percentages and request counts are limits you choose); allowed: a number"
        )
    if "threshold_start" not in given:
        raise ConfigError(
            f"metadata thresholdStart is required with {given['threshold']}=auto; allowed: the first"
            f" target ({MIN_THRESHOLD_START:g} <= thresholdStart <= {MAX_THRESHOLD_START:g}), from which"
            " the learned one moves"
        )
    check_learnable(fields["engine"], f"{given['threshold']}=auto")
    fields["threshold"] = fields["threshold_start"]
