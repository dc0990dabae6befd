"""Parsers of single trigger metadata values: each takes (key, raw) and returns the value or raises a
ConfigError naming the key, the value and what is allowed. The table of keys (trigger.KEYS) uses them, and
settle_auto_threshold joins `threshold: auto` to its thresholdStart once all keys are read."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from keda_gpu_scaler.core.demand import MAX_PREFILL_WEIGHT, MAX_WINDOW_SECONDS, MIN_WINDOW_SECONDS
from keda_gpu_scaler.core.errors import ConfigError, quoted
from keda_gpu_scaler.core.learned_target import HIGHEST_FACTOR, LOWEST_FACTOR
from keda_gpu_scaler.core.names import OBJECT_NAME_RULE, is_object_name
from keda_gpu_scaler.core.wire import MAX_WIRE_NUMBER
from keda_gpu_scaler.pages.engines import ENGINE_CHOICES

# A metric name becomes a path segment of the HPA's external metric (`s0-<name>`).
_METRIC_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,198}[A-Za-z0-9])?")
_POD_NAME_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251})?")

# The default of a key that must be given.
REQUIRED = object()


@dataclass(frozen=True, slots=True)
class MetadataKey:
    """One row of the table of trigger keys (trigger.KEYS): parsing, default and docs/reference.md's text."""

    key: str
    field: str
    parse: Callable[[str, str], Any]
    default: Any
    default_text: str
    help: str

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


def enum_parser(enum: type[StrEnum]) -> Callable[[str, str], Any]:
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


_BLANKS = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", " ": "a blank"}


def _around_a_number(raw: str) -> str:
    """Why a number with white space around it is refused, naming the character: a YAML `|` block keeps
    its last newline, which the repr alone (`'16\\n'`) leaves for the reader to spot."""
    end = next((f"it ends in {_BLANKS[c]}" for c in raw[-1:] if c in _BLANKS), None)
    start = next((f"it starts with {_BLANKS[c]}" for c in raw[:1] if c in _BLANKS), None)
    what = " and ".join(filter(None, (start, end)))
    hint = (
        " (a YAML `|` block keeps its last newline: use a quoted value or `|-`)" if raw.endswith("\n") else ""
    )
    return f": {what}{hint}"


def parse_number(key: str, raw: str) -> float:
    if not _DECIMAL.fullmatch(raw):
        # A number with white space around it is refused too (KEDA passes the value as written), but the
        # message says what is there.
        why = _around_a_number(raw) if raw.strip() and _DECIMAL.fullmatch(raw.strip()) else ""
        raise ConfigError(
            f"metadata {key}={quoted(raw)} is not a number{why}; allowed: a finite decimal number like 70"
            " or 0.5"
        )
    value = float(raw)
    if not math.isfinite(value):
        raise ConfigError(f"metadata {key}={quoted(raw)} must be a finite number")
    return value


def number_between(key: str, raw: str, low: float, high: float, allowed: str) -> float:
    """A finite number from `low` to `high`; out of range, an error saying `allowed` (which names both)."""
    value = parse_number(key, raw)
    if not low <= value <= high:
        raise ConfigError(f"metadata {key}={quoted(raw)} is out of range; allowed: {allowed}")
    return value


def parse_threshold(key: str, raw: str) -> float:
    # The upper bound for percentages (100) depends on the metric: checked once all keys are read. Any
    # threshold beyond MAX_WIRE_NUMBER cannot be carried to KEDA (targetSize is an int64, milli-units).
    return number_between(
        key,
        raw,
        MIN_THRESHOLD,
        MAX_WIRE_NUMBER,
        f"{MIN_THRESHOLD:g} <= {key} <= {MAX_WIRE_NUMBER:g} (and <= 100 for the percentage metrics"
        " utilization, memory and kv_cache)",
    )


# `threshold: auto`: the target is learned, starting from thresholdStart (SPEC §6, learned targets).
AUTO_THRESHOLD = "auto"


def parse_threshold_or_auto(key: str, raw: str) -> float | str:
    return AUTO_THRESHOLD if raw == AUTO_THRESHOLD else parse_threshold(key, raw)


# The learned target moves within [LOWEST_FACTOR, HIGHEST_FACTOR] × thresholdStart: each must stay a
# threshold KEDA can carry.
MIN_THRESHOLD_START = MIN_THRESHOLD / LOWEST_FACTOR
MAX_THRESHOLD_START = MAX_WIRE_NUMBER / HIGHEST_FACTOR


def parse_threshold_start(key: str, raw: str) -> float:
    return number_between(
        key,
        raw,
        MIN_THRESHOLD_START,
        MAX_THRESHOLD_START,
        f"{MIN_THRESHOLD_START:g} <= {key} <= {MAX_THRESHOLD_START:g}, so that the learned target, from"
        f" {LOWEST_FACTOR:g}x to {HIGHEST_FACTOR:g}x of it, stays within threshold's range",
    )


def settle_auto_threshold(fields: dict[str, Any], given: Mapping[str, str]) -> None:
    """`threshold: auto` targets thresholdStart until the learner moves it: only demand's can be learned."""
    start_key = given.get("threshold_start")
    if fields["threshold"] != AUTO_THRESHOLD:
        if start_key is not None:
            raise ConfigError(
                f"metadata {start_key} applies only with threshold: auto (a number is the target itself,"
                " never learned); remove it or set threshold: auto"
            )
        return
    if fields["metric"] != "demand":
        raise ConfigError(
            f"metadata {given['threshold']}=auto is not allowed for metric={fields['metric']}: only"
            " demand's target is the work one replica serves, which its latency can be learned against"
            " (percentages and request counts are limits you choose); allowed: a number"
        )
    if start_key is None:
        raise ConfigError(
            f"metadata thresholdStart is required with {given['threshold']}=auto; allowed: the first"
            f" target ({MIN_THRESHOLD_START:g} <= thresholdStart <= {MAX_THRESHOLD_START:g}), from which"
            " the learned one moves"
        )
    fields["threshold"] = fields["threshold_start"]


def parse_engine(key: str, raw: str) -> str:
    if raw not in ENGINE_CHOICES:
        raise ConfigError(
            f"metadata {key}={quoted(raw)} is not allowed; use one of: {', '.join(ENGINE_CHOICES)}"
        )
    return raw


def parse_model(key: str, raw: str) -> str:
    # Blanks at either end are a quoting slip in the YAML, never part of a served model's name.
    if not raw or len(raw) > 253 or not raw.isprintable() or raw != raw.strip():
        raise ConfigError(
            f"metadata {key}={quoted(raw)} is not a model name; allowed: 1-253 printable characters,"
            " not starting or ending with a blank"
        )
    return raw


_PORT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?")


def parse_metrics_port(key: str, raw: str) -> str:
    if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= 65535:
        return str(int(raw))
    if _PORT_NAME.fullmatch(raw) and any(c.isalpha() for c in raw):
        return raw
    raise ConfigError(
        f"metadata {key}={quoted(raw)} is not a port; allowed: a number 1-65535 or a container port name"
        " (at most 15 lower-case letters, digits and '-')"
    )


_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*")


def parse_metrics_path(key: str, raw: str) -> str:
    if not _PATH.fullmatch(raw) or len(raw) > 256:
        raise ConfigError(
            f"metadata {key}={quoted(raw)} is not a URL path; allowed: a path starting with '/', without"
            " query or fragment, e.g. /metrics"
        )
    return raw


def parse_inference_pool(key: str, raw: str) -> str:
    if not is_object_name(raw):
        raise ConfigError(
            f"metadata {key}={quoted(raw)} is not an InferencePool name; allowed: {OBJECT_NAME_RULE}"
            " (the pool is always in the ScaledObject's own namespace)"
        )
    return raw


def parse_window(key: str, raw: str) -> float:
    return number_between(
        key,
        raw,
        MIN_WINDOW_SECONDS,
        MAX_WINDOW_SECONDS,
        f"seconds, {MIN_WINDOW_SECONDS:g} <= {key} <= {MAX_WINDOW_SECONDS:g}",
    )


def parse_prefill_weight(key: str, raw: str) -> float:
    return number_between(
        key,
        raw,
        0.0,
        MAX_PREFILL_WEIGHT,
        f"0 <= {key} <= {MAX_PREFILL_WEIGHT:g} (what one prompt token weighs against one generated token)",
    )


def parse_port_number(key: str, raw: str) -> int:
    if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= 65535:
        return int(raw)
    raise ConfigError(f"metadata {key}={quoted(raw)} is not a port number; allowed: a number 1-65535")


def parse_activation_threshold(key: str, raw: str) -> float:
    value = parse_number(key, raw)
    if value < 0:
        raise ConfigError(f"metadata {key}={quoted(raw)} is out of range; allowed: a finite number >= 0")
    return value


def _matching(key: str, raw: str, pattern: re.Pattern[str], what: str, allowed: str) -> str:
    if not pattern.fullmatch(raw):
        raise ConfigError(f"metadata {key}={quoted(raw)} is not {what}; allowed: {allowed}")
    return raw


def parse_metric_name(key: str, raw: str) -> str:
    allowed = "1-200 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    return _matching(key, raw, _METRIC_NAME, "a valid metric name", allowed)


def parse_pod_name_prefix(key: str, raw: str) -> str:
    allowed = "lower-case letters, digits, '-' and '.', starting with a letter or digit"
    return _matching(key, raw, _POD_NAME_PREFIX, "a pod name prefix", allowed)


def parse_pod_selector(key: str, raw: str) -> str:
    if not raw.strip():
        raise ConfigError(f"metadata {key}={quoted(raw)} is empty; allowed: a Kubernetes label selector")
    return raw.strip()
