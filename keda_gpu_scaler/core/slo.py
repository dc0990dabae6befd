"""A latency target (SLO) on a `metric: demand` trigger (SPEC §6): its metadata keys and what they parse into.

The user states the time to first token (seconds), the time per output token (ms) and the share of
requests that must meet them; latency.py compares the pods' own histograms with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from keda_gpu_scaler.core.errors import ConfigError, quoted
from keda_gpu_scaler.core.value_parsers import MetadataKey, number_between, parse_number
from keda_gpu_scaler.pages.engines import Engine, measured_latencies
from keda_gpu_scaler.pages.engines._common import ITL, TPOT, TTFT

MAX_TTFT_SECONDS = 600.0
MAX_TPOT_MS = 10_000.0
# Below a median the target says nothing about the slow requests it is for; above 0.999 a window of
# requests is too few to measure the quantile (the +Inf bucket would decide it).
MIN_ATTAINMENT, MAX_ATTAINMENT = 0.5, 0.999
DEFAULT_ATTAINMENT = 0.95


@dataclass(frozen=True, slots=True)
class SloTarget:
    """What a trigger's pods must meet: at least `attainment` of requests within each target given."""

    ttft_seconds: float | None
    tpot_ms: float | None
    attainment: float = DEFAULT_ATTAINMENT

    def targets(self) -> dict[str, float]:
        """Each target given, in seconds (the histograms' unit), by latency kind: the per-output-token
        target for a request's mean (TPOT) and for every gap between tokens (ITL) alike."""
        per_token = None if self.tpot_ms is None else self.tpot_ms / 1000
        targets = {TTFT: self.ttft_seconds, TPOT: per_token, ITL: per_token}
        return {kind: seconds for kind, seconds in targets.items() if seconds is not None}


def _positive_up_to(key: str, raw: str, high: float, unit: str) -> float:
    value = parse_number(key, raw)
    if not 0 < value <= high:
        raise ConfigError(
            f"metadata {key}={quoted(raw)} is out of range; allowed: 0 < {key} <= {high:g} ({unit})"
        )
    return value


def parse_ttft(key: str, raw: str) -> float:
    return _positive_up_to(key, raw, MAX_TTFT_SECONDS, "seconds to the first token")


def parse_tpot(key: str, raw: str) -> float:
    return _positive_up_to(key, raw, MAX_TPOT_MS, "milliseconds per output token")


def parse_attainment(key: str, raw: str) -> float:
    return number_between(
        key,
        raw,
        MIN_ATTAINMENT,
        MAX_ATTAINMENT,
        f"{MIN_ATTAINMENT:g} <= {key} <= {MAX_ATTAINMENT:g} (the share of requests within the targets)",
    )


def _engines_without(kind: str) -> str:
    return ", ".join(engine.value for engine in Engine if kind not in (measured_latencies(engine) or ()))


SLO_KEYS: tuple[MetadataKey, ...] = (
    MetadataKey(
        "sloTtftSeconds",
        "slo_ttft_seconds",
        parse_ttft,
        None,
        "none",
        f"demand: the time to the first token (seconds, 0 < value <= {MAX_TTFT_SECONDS:g}) that"
        " `sloAttainment` of requests must meet, read from the pods' own histograms (refused with an"
        f" `engine` that prints none: {_engines_without(TTFT)})",
    ),
    MetadataKey(
        "sloTpotMs",
        "slo_tpot_ms",
        parse_tpot,
        None,
        "none",
        f"demand: the time per output token (milliseconds, 0 < value <= {MAX_TPOT_MS:g}) that"
        " `sloAttainment` of requests must meet, read from the pods' own histograms (refused with an"
        f" `engine` that prints none: {_engines_without(TPOT)})",
    ),
    MetadataKey(
        "sloAttainment",
        "slo_attainment",
        parse_attainment,
        None,
        f"`{DEFAULT_ATTAINMENT:g}`",
        f"demand with sloTtftSeconds or sloTpotMs: the share of requests that must meet them"
        f" ({MIN_ATTAINMENT:g}-{MAX_ATTAINMENT:g})",
    ),
)
SLO_FIELDS = tuple(key.field for key in SLO_KEYS)


def take_slo(fields: dict[str, Any], stated: dict[str, str], allowed: bool) -> SloTarget | None:
    """The SLO the parsed `fields` state (their SLO entries removed), or None; ConfigError naming the key
    and the value as written (`stated`: field → `key='value'`) where one is given where it is not
    `allowed` (a metric other than demand, or requests with inferencePool), or the attainment without a
    target."""
    ttft, tpot, attainment = (fields.pop(name) for name in SLO_FIELDS)
    values = zip(SLO_FIELDS, (ttft, tpot, attainment), strict=True)
    given = [stated[name] for name, value in values if value is not None]
    if not given:
        return None
    if not allowed:
        raise ConfigError(
            f"metadata {given[0]} applies only to metric=demand and to metric=requests with"
            f" inferencePool (the latency of the inference servers' requests), not to"
            f" metric={fields['metric'].value} without them; remove it"
        )
    if ttft is None and tpot is None:
        raise ConfigError(
            f"metadata {stated['slo_attainment']} needs a target to attain; allowed: with sloTtftSeconds or"
            " sloTpotMs"
        )
    return SloTarget(ttft, tpot, DEFAULT_ATTAINMENT if attainment is None else attainment)


# The latency kind each target is read from (the pods' histograms).
_KIND_OF = {"slo_ttft_seconds": TTFT, "slo_tpot_ms": TPOT}


def check_measured(slo: SloTarget | None, engine: str, stated: dict[str, str]) -> None:
    """ConfigError for a latency target the named engine prints no histogram of: it could never be read,
    nor guarded. `stated`: field → `key='value'` as written."""
    measured = measured_latencies(engine)
    if slo is None or measured is None:
        return
    given = {"slo_ttft_seconds": slo.ttft_seconds, "slo_tpot_ms": slo.tpot_ms}
    can = " and ".join(k.key for k in SLO_KEYS if _KIND_OF.get(k.field) in measured) or "no latency target"
    for field, kind in _KIND_OF.items():
        if given[field] is not None and kind not in measured:
            raise ConfigError(
                f"metadata {stated[field]}: engine {engine} prints no histogram of this latency, so it could"
                f" never be read; with {engine} state {can}"
            )


def check_learnable(engine: str, stated_threshold: str) -> None:
    """ConfigError for `threshold: auto` with a named engine that prints no time per output token: the
    learner samples a pod only with it, so the target would stay at thresholdStart for good."""
    measured = measured_latencies(engine)
    if measured is None or measured & {TPOT, ITL}:
        return
    able = ", ".join(e.value for e in Engine if (measured_latencies(e) or frozenset()) & {TPOT, ITL})
    raise ConfigError(
        f"metadata {stated_threshold} with engine={engine}: {engine} prints no histogram of the time per"
        f" output token, which the target is learned from, so it would stay at thresholdStart; give a"
        f" number, or an engine that prints one ({able})"
    )
