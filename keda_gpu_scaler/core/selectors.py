"""Kubernetes label selectors (the string form of `kubectl -l` and `/scale` status.selector) and exporter selectors."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from keda_gpu_scaler.core.errors import ConfigError

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}")
_VALUE = re.compile(rf"({_NAME})?")
_PORT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?")
_MAX_PREFIX = 253


class SelectorError(ValueError):
    """A label selector that Kubernetes would reject; the message says which part and why."""


class Op(StrEnum):
    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    NOT_EXISTS = "!"
    GREATER = ">"
    LESS = "<"


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: Op
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op is Op.EXISTS:
            return value is not None
        if self.op is Op.NOT_EXISTS:
            return value is None
        if self.op in (Op.NOT_EQUALS, Op.NOT_IN):
            # As in Kubernetes: a pod without the label satisfies "!=" and "notin".
            return value is None or value not in self.values
        if value is None:
            return False
        if self.op in (Op.GREATER, Op.LESS):
            try:
                number, bound = int(value), int(next(iter(self.values)))
            except ValueError:
                return False
            return number > bound if self.op is Op.GREATER else number < bound
        return value in self.values


@dataclass(frozen=True, slots=True)
class Selector:
    """A parsed label selector: every requirement must hold (an empty selector matches everything)."""

    text: str
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    def __str__(self) -> str:
        return self.text


def _check_key(key: str, text: str) -> str:
    prefix, _, name = key.rpartition("/")
    if not _KEY.fullmatch(key) or len(prefix) > _MAX_PREFIX or not name:
        raise SelectorError(f"label selector {text!r}: {key!r} is not a valid label key")
    return key


def _check_value(value: str, text: str) -> str:
    if not _VALUE.fullmatch(value):
        raise SelectorError(f"label selector {text!r}: {value!r} is not a valid label value")
    return value


def _split_requirements(text: str) -> list[str]:
    # Commas separate requirements, except inside the parentheses of "in (a, b)".
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"label selector {text!r}: unbalanced ')'")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise SelectorError(f"label selector {text!r}: unbalanced '('")
    parts.append("".join(current))
    return [p.strip() for p in parts]


_SET = re.compile(r"(?P<key>\S+?)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)")
_BINARY = re.compile(r"(?P<key>[^\s=!<>]+)\s*(?P<op>==|=|!=|>|<)\s*(?P<value>[^\s=!<>,]*)")


def _requirement(part: str, text: str) -> Requirement:
    if match := _SET.fullmatch(part):
        values = [v.strip() for v in match["values"].split(",")]
        if not any(values):
            raise SelectorError(f"label selector {text!r}: {part!r} needs at least one value")
        op = Op.IN if match["op"] == "in" else Op.NOT_IN
        return Requirement(
            _check_key(match["key"], text), op, frozenset(_check_value(v, text) for v in values)
        )
    if match := _BINARY.fullmatch(part):
        key, raw_op, value = _check_key(match["key"], text), match["op"], match["value"]
        if raw_op in (">", "<"):
            if not value.lstrip("-").isdigit():
                raise SelectorError(f"label selector {text!r}: {part!r} compares with a non-integer")
            return Requirement(key, Op.GREATER if raw_op == ">" else Op.LESS, frozenset({value}))
        op = Op.NOT_EQUALS if raw_op == "!=" else Op.EQUALS
        return Requirement(key, op, frozenset({_check_value(value, text)}))
    if part.startswith("!"):
        return Requirement(_check_key(part[1:].strip(), text), Op.NOT_EXISTS)
    if part and not any(c in part for c in " =!<>()"):
        return Requirement(_check_key(part, text), Op.EXISTS)
    raise SelectorError(
        f"label selector {text!r}: cannot read {part!r}; allowed: key, !key, key=value, key!=value,"
        " key in (a,b), key notin (a,b)"
    )


def parse_selector(text: str) -> Selector:
    """Parse a label selector string; raises SelectorError naming the part Kubernetes would reject."""
    stripped = text.strip()
    if not stripped:
        return Selector("", ())
    parts = _split_requirements(stripped)
    if any(not p for p in parts):
        raise SelectorError(f"label selector {text!r} has an empty requirement (stray ',')")
    return Selector(stripped, tuple(_requirement(p, text) for p in parts))


@dataclass(frozen=True, slots=True)
class ExporterSelector:
    """Which pods are GPU exporters and on which port they serve /metrics.

    `port` is a number, the name of a container port, or None for the first container port the pod declares.
    """

    selector: Selector
    port: int | str | None

    def __str__(self) -> str:
        return f"{self.selector}:{self.port}" if self.port is not None else str(self.selector)


def parse_exporter_selector(text: str) -> ExporterSelector:
    """`SELECTOR[:PORT]`; label selectors never contain ':', so the last one separates the port."""
    raw_selector, sep, raw_port = text.strip().rpartition(":")
    if not sep:
        raw_selector, raw_port = text.strip(), ""
    port: int | str | None = None
    if sep:
        if raw_port.isdigit():
            port = int(raw_port)
            if not 0 < port < 65536:
                raise SelectorError(f"exporter selector {text!r}: port {raw_port} is out of range 1-65535")
        elif _PORT_NAME.fullmatch(raw_port) and any(c.isalpha() for c in raw_port):
            port = raw_port
        else:
            raise SelectorError(
                f"exporter selector {text!r}: {raw_port!r} is neither a port number nor a container port name"
            )
    selector = parse_selector(raw_selector)
    if selector.empty:
        raise SelectorError(f"exporter selector {text!r} has no label selector: it would match every pod")
    return ExporterSelector(selector, port)


# The exporters of the three reference setups, as their installers label them:
# - NVIDIA GPU Operator: DaemonSet nvidia-dcgm-exporter, pod label app=nvidia-dcgm-exporter, port 9400.
# - NVIDIA's dcgm-exporter Helm chart: app.kubernetes.io/name=dcgm-exporter, port 9400.
# - AMD GPU Operator (ROCm/gpu-operator): the metrics-exporter DaemonSet's pods carry
#   app.kubernetes.io/name=metrics-exporter plus daemonset-name=<DeviceConfig name>, port 5000. The name
#   alone is too generic ("metrics-exporter" is a common chart name), so the daemonset-name key, which
#   the AMD operator always sets, is required too.
# Where those installers put them: the NVIDIA GPU Operator's documented namespace (and OpenShift's
# OperatorHub one), the AMD GPU Operator's, and ACK's managed exporter's.
DEFAULT_EXPORTER_NAMESPACES = ("gpu-operator", "nvidia-gpu-operator", "kube-amd-gpu", "arms-prom")
DEFAULT_EXPORTER_SELECTORS = (
    "app=nvidia-dcgm-exporter:9400",
    "app.kubernetes.io/name=dcgm-exporter:9400",
    "app.kubernetes.io/name=metrics-exporter,daemonset-name:5000",
)


def pod_selector_metadata(text: str) -> Selector:
    """The trigger's `podSelector` metadata; ConfigError (INVALID_ARGUMENT) naming it and what is allowed."""
    # Parsed per call: a few µs, less than a cache keyed by the text would save (docs/BENCHMARKS.md, "Caches").
    try:
        selector = parse_selector(text)
    except SelectorError as error:
        raise ConfigError(f"metadata podSelector={text!r} is not a label selector: {error}") from None
    if selector.empty:
        raise ConfigError(f"metadata podSelector={text!r} selects every pod; allowed: a label selector")
    return selector
