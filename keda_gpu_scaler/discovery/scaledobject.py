"""Reads a ScaledObject: its scale target (with KEDA's defaults) and which trigger, with which metricType, is ours."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from keda_gpu_scaler.errors import ConfigError
from keda_gpu_scaler.trigger import FROM_ENV, TriggerSpec, parse_trigger

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
    spec: TriggerSpec | None  # its metadata as this scaler reads it; None: metadata this scaler rejects
    metric_type: str  # as written; "AverageValue" when absent (KEDA's default)


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
        ExternalTrigger(_spec_of(t.get("metadata") or {}), t.get("metricType") or "AverageValue")
        for t in spec.get("triggers") or ()
        if t.get("type") in EXTERNAL_TRIGGER_TYPES
    )
    return ScaledObjectInfo(target, triggers)


def _spec_of(metadata: Mapping[str, Any]) -> TriggerSpec | None:
    # KEDA sends `…FromEnv` keys with the value read from the target's environment (or drops them when
    # empty), so they cannot be compared with what the ScaledObject says; the other keys can.
    kept = {str(k): str(v) for k, v in metadata.items() if not str(k).endswith(FROM_ENV)}
    try:
        return parse_trigger(kept)
    except ConfigError:
        return None


def metric_type_for(info: ScaledObjectInfo, spec: TriggerSpec) -> tuple[str | None, str | None]:
    """The metricType of the trigger this call is for, and a note when it cannot be told.

    The trigger is the external one whose metadata parses to the same TriggerSpec as the call's (KEDA's
    own keys and `…FromEnv` keys aside). With no match and exactly one external trigger, that one.
    """
    matching = [t for t in info.triggers if t.spec == spec]
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
