"""Reads a ScaledObject: its scale target (with KEDA's defaults) and which trigger, with which metricType, is ours."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from keda_gpu_scaler.core.errors import ConfigError
from keda_gpu_scaler.core.slo import SLO_FIELDS, take_slo
from keda_gpu_scaler.core.trigger import (
    DEFAULT_METRIC_NAMES,
    FROM_ENV,
    KEDA_OWN_KEYS,
    KEYS,
    Metric,
    TriggerSpec,
    states_slo,
)
from keda_gpu_scaler.core.value_parsers import AUTO_THRESHOLD

EXTERNAL_TRIGGER_TYPES = frozenset({"external", "external-push"})
METRIC_TYPES = frozenset({"AverageValue", "Value"})


@dataclass(frozen=True, slots=True)
class ScaleTarget:
    api_version: str
    kind: str
    name: str

    @property
    def group(self) -> str:
        group, _, _ = self.api_version.rpartition("/")
        return group

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} ({self.api_version})"


@dataclass(frozen=True, slots=True)
class ExternalTrigger:
    # The TriggerSpec fields its metadata fixes, as this scaler reads them (defaults included), leaving out
    # those KEDA fills from the target's environment; None: metadata this scaler rejects.
    fields: tuple[tuple[str, Any], ...] | None
    metric_type: str  # as written; "AverageValue" when absent (KEDA's default)

    def matches(self, spec: TriggerSpec) -> bool:
        return self.fields is not None and all(getattr(spec, name) == value for name, value in self.fields)


@dataclass(frozen=True, slots=True)
class ScaledObjectInfo:
    target: ScaleTarget
    triggers: tuple[ExternalTrigger, ...]  # only the external / external-push ones


class ScaledObjectError(ValueError):
    """A ScaledObject this scaler cannot follow; the message says which field."""


def parse_scaled_object(obj: Mapping[str, Any]) -> ScaledObjectInfo:
    spec = obj.get("spec") or {}
    ref = spec.get("scaleTargetRef") or {}
    name = ref.get("name")
    if not name:
        raise ScaledObjectError("its spec.scaleTargetRef.name is empty")
    # KEDA's defaults for a ScaledObject's target.
    target = ScaleTarget(ref.get("apiVersion") or "apps/v1", ref.get("kind") or "Deployment", name)
    triggers = tuple(
        # Parsed here, once per read of the ScaledObject, not on every call that compares with it.
        ExternalTrigger(_fields_of(t.get("metadata") or {}), t.get("metricType") or "AverageValue")
        for t in spec.get("triggers") or ()
        if t.get("type") in EXTERNAL_TRIGGER_TYPES
    )
    return ScaledObjectInfo(target, triggers)


_BY_KEY = {k.key: k for k in KEYS}


def _fields_of(metadata: Mapping[str, Any]) -> tuple[tuple[str, Any], ...] | None:
    """What a trigger's metadata fixes, for comparison with the metadata of a call.

    KEDA sends a call the trigger's metadata as written, except for `<key>FromEnv`: that one carries the
    value read from the target container's environment instead (or is left out when that is empty), and
    a call may give `<key>` itself. So KEDA's own keys, and for every `<key>FromEnv` both it and `<key>`,
    are left out of the comparison; every other key compares as parsed, an absent one as its default.
    """
    raw = {str(k): str(v) for k, v in metadata.items() if str(k) not in KEDA_OWN_KEYS}
    from_env = {k.removesuffix(FROM_ENV) for k in raw if k.endswith(FROM_ENV)}
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        if key in from_env or key.removesuffix(FROM_ENV) in from_env:
            continue
        spec_key = _BY_KEY.get(key)
        if spec_key is None:
            return None
        try:
            fields[spec_key.field] = spec_key.parse(key, value)
        except ConfigError:
            return None
    skipped = {_BY_KEY[b].field for b in from_env if b in _BY_KEY}
    for spec_key in KEYS:
        if spec_key.field in fields or spec_key.field in skipped or spec_key.key == "metricName":
            continue
        if spec_key.required:
            return None  # neither given nor from the environment: KEDA's call fails too
        fields[spec_key.field] = spec_key.default
    if fields.get("threshold") == AUTO_THRESHOLD:
        # As parse_trigger settles it; with thresholdStart from the environment, the target is not known here.
        if "threshold_start" in fields:
            fields["threshold"] = fields["threshold_start"]
        else:
            del fields["threshold"]
    if all(name in fields for name in SLO_FIELDS):
        keys = {spec_key.field: spec_key.key for spec_key in KEYS}
        try:  # folded into one SloTarget, as parse_trigger does (allowed when what decides it is not known)
            unknown = bool(skipped & {"metric", "inference_pool"})
            allowed = unknown or states_slo(fields.get("metric"), fields.get("inference_pool") is not None)
            fields["slo"] = take_slo(fields, keys, allowed=allowed)
        except ConfigError:
            return None
    else:  # some from the environment: left out of the comparison
        for name in SLO_FIELDS:
            fields.pop(name, None)
    if "metric_name" not in fields and "metric_name" not in skipped and "metric" in fields:
        # Unless given, the metric name follows the metric (unknown when the metric comes from the env).
        fields["metric_name"] = DEFAULT_METRIC_NAMES[Metric(fields["metric"])]
    return tuple(sorted(fields.items()))


def metric_type_for(info: ScaledObjectInfo, spec: TriggerSpec) -> tuple[str | None, str | None]:
    """The metricType of the trigger this call is for, and a note when it cannot be told.

    The trigger is the external one whose metadata says what the call's does (KEDA's own keys, and every
    `…FromEnv` key with its resolved twin, aside). With no match and exactly one external trigger, that one.
    """
    matching = [t for t in info.triggers if t.matches(spec)]
    if not matching and len(info.triggers) == 1:
        matching = list(info.triggers)
    types = {t.metric_type for t in matching}
    if not matching:
        return None, "no external trigger of the ScaledObject has this call's metadata"
    if len(types) > 1:
        return None, f"several external triggers have this call's metadata, with metricTypes {sorted(types)}"
    (metric_type,) = types
    if metric_type not in METRIC_TYPES:
        return None, f"metricType {metric_type!r} is not one the HPA allows for external metrics"
    return metric_type, None
