"""The parsers of single values, of trigger metadata and of `serve` flags alike: each takes (name, raw) and
returns the value, or raises its caller's error naming the key or flag, the value and what is allowed:
ConfigError for metadata (INVALID_ARGUMENT), SettingsError for flags. The table of keys (trigger.KEYS) and
the table of flags (settings.FLAGS) use them."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from keda_gpu_scaler.core.demand import MAX_PREFILL_WEIGHT, MAX_WINDOW_SECONDS, MIN_WINDOW_SECONDS
from keda_gpu_scaler.core.errors import ConfigError, quoted
from keda_gpu_scaler.core.learned_target import HIGHEST_FACTOR, LOWEST_FACTOR
from keda_gpu_scaler.core.names import (
    NAMESPACE_RULE,
    OBJECT_NAME_RULE,
    is_http_url,
    is_namespace,
    is_object_name,
)
from keda_gpu_scaler.core.selectors import (
    DEFAULT_EXPORTER_SELECTORS,
    ExporterSelector,
    SelectorError,
    parse_exporter_selector,
)
from keda_gpu_scaler.core.wire import MAX_WIRE_NUMBER
from keda_gpu_scaler.pages.engines import ENGINE_CHOICES


class SettingsError(ValueError):
    """A flag or environment value that cannot be used; the message names it and what is allowed."""


# How a caller says a value is refused: (name, raw, why) → the error to raise, whose message starts with
# the key or flag and the value as that caller shows them.
Refuse = Callable[[str, str, str], Exception]


def refuse_metadata(key: str, raw: str, why: str) -> ConfigError:
    return ConfigError(f"metadata {key}={quoted(raw)} {why}")


def refuse_flag(name: str, raw: str, why: str) -> SettingsError:
    return SettingsError(f"{name}={raw[:100]!r} {why}")


def refuse_option(name: str, raw: str, why: str) -> SettingsError:
    """A one-shot command's option (`calibrate --window 0.3`): the value as typed, unquoted when it is
    plain text, as the command line showed it."""
    shown = raw if raw.isascii() and raw.isprintable() and " " not in raw and len(raw) <= 100 else quoted(raw)
    return SettingsError(f"{name}={shown} {why}")


def one_of(name: str, raw: str, allowed: Sequence[str], refuse: Refuse) -> str:
    if raw not in allowed:
        raise refuse(name, raw, f"is not allowed; use one of: {', '.join(allowed)}")
    return raw


def matching(name: str, raw: str, pattern: re.Pattern[str], what: str, refuse: Refuse) -> str:
    """`raw` when `pattern` matches it whole; else refused as not `what` (which may say what is allowed)."""
    if not pattern.fullmatch(raw):
        raise refuse(name, raw, f"is not {what}")
    return raw


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
    allowed = [member.value for member in enum]

    def parse(key: str, raw: str) -> StrEnum:
        return enum(one_of(key, raw, allowed, refuse_metadata))

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


def parse_number(key: str, raw: str, refuse: Refuse = refuse_metadata) -> float:
    if not _DECIMAL.fullmatch(raw):
        # A number with white space around it is refused too (KEDA passes the value as written), but the
        # message says what is there.
        why = _around_a_number(raw) if raw.strip() and _DECIMAL.fullmatch(raw.strip()) else ""
        raise refuse(key, raw, f"is not a number{why}; allowed: a finite decimal number like 70 or 0.5")
    value = float(raw)
    if not math.isfinite(value):
        raise refuse(key, raw, "is not finite; allowed: a finite decimal number like 70 or 0.5")
    return value


def number_between(
    key: str, raw: str, low: float, high: float, allowed: str, refuse: Refuse = refuse_metadata
) -> float:
    """A finite number from `low` to `high`; out of range, an error saying `allowed` (which names both)."""
    value = parse_number(key, raw, refuse)
    if not low <= value <= high:
        raise refuse(key, raw, f"is out of range; allowed: {allowed}")
    return value


def parse_threshold(key: str, raw: str) -> float:
    # The upper bound for percentages (100) depends on the metric: checked once all keys are read. Any
    # threshold beyond MAX_WIRE_NUMBER cannot be carried to KEDA (targetSize is an int64, milli-units).
    low, high = MIN_THRESHOLD, MAX_WIRE_NUMBER
    percent = "(and <= 100 for the percentage metrics utilization, memory and kv_cache)"
    return number_between(key, raw, low, high, f"{low:g} <= {key} <= {high:g} {percent}")


# `threshold: auto`: the target is learned, starting from thresholdStart (SPEC §6, learned targets).
AUTO_THRESHOLD = "auto"


def parse_threshold_or_auto(key: str, raw: str) -> float | str:
    if raw == AUTO_THRESHOLD:
        return AUTO_THRESHOLD
    if raw.strip().lower() == AUTO_THRESHOLD:
        raise ConfigError(
            f"metadata {key}={quoted(raw)}: write it `{AUTO_THRESHOLD}`, in lower case, without blanks"
        )
    try:
        return parse_threshold(key, raw)
    except ConfigError as error:
        raise ConfigError(
            f"{error}; or `{AUTO_THRESHOLD}` (metric: demand) to learn it from thresholdStart"
        ) from None


# The learned target moves within [LOWEST_FACTOR, HIGHEST_FACTOR] × thresholdStart: each must stay a
# threshold KEDA can carry.
MIN_THRESHOLD_START = MIN_THRESHOLD / LOWEST_FACTOR
MAX_THRESHOLD_START = MAX_WIRE_NUMBER / HIGHEST_FACTOR


def parse_threshold_start(key: str, raw: str) -> float:
    low, high = MIN_THRESHOLD_START, MAX_THRESHOLD_START
    why = f"so that the learned target, from {LOWEST_FACTOR:g}x to {HIGHEST_FACTOR:g}x of it, stays within"
    return number_between(key, raw, low, high, f"{low:g} <= {key} <= {high:g}, {why} threshold's range")


def parse_engine(key: str, raw: str) -> str:
    return one_of(key, raw, ENGINE_CHOICES, refuse_metadata)


def parse_model(key: str, raw: str) -> str:
    # Blanks at either end are a quoting slip in the YAML, never part of a served model's name.
    if not raw or len(raw) > 253 or not raw.isprintable() or raw != raw.strip():
        allowed = "1-253 printable characters, not starting or ending with a blank"
        raise refuse_metadata(key, raw, f"is not a model name; allowed: {allowed}")
    return raw


_PORT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?")


def _is_port_number(raw: str) -> bool:
    return raw.isascii() and raw.isdigit() and 1 <= int(raw) <= 65535


def parse_metrics_port(key: str, raw: str) -> str:
    if _is_port_number(raw):
        return str(int(raw))
    if _PORT_NAME.fullmatch(raw) and any(c.isalpha() for c in raw):
        return raw
    raise refuse_metadata(
        key,
        raw,
        "is not a port; allowed: a number 1-65535 or a container port name (at most 15 lower-case letters,"
        " digits and '-')",
    )


# At most 256 characters; no '.'/'..' segment nor '%'-escape: the client sends `/x/../%6detrics` as `/metrics`.
_PATH = re.compile(r"(?!.*/\.\.?(?:/|$))/[A-Za-z0-9._~!$&'()*+,;=:@/-]{0,255}")


def parse_metrics_path(key: str, raw: str) -> str:
    allowed = "a path starting with '/', without '.' or '..' segments, '%'-escapes, query or fragment"
    return matching(key, raw, _PATH, f"a URL path; allowed: {allowed}, e.g. /metrics", refuse_metadata)


def parse_inference_pool(key: str, raw: str) -> str:
    if not is_object_name(raw):
        where = "(the pool is always in the ScaledObject's own namespace)"
        raise refuse_metadata(key, raw, f"is not an InferencePool name; allowed: {OBJECT_NAME_RULE} {where}")
    return raw


def parse_window(key: str, raw: str) -> float:
    low, high = MIN_WINDOW_SECONDS, MAX_WINDOW_SECONDS
    return number_between(key, raw, low, high, f"seconds, {low:g} <= {key} <= {high:g}")


def parse_prefill_weight(key: str, raw: str, refuse: Refuse = refuse_metadata) -> float:
    why = "(what one prompt token weighs against one generated token)"
    allowed = f"0 <= {key} <= {MAX_PREFILL_WEIGHT:g} {why}"
    return number_between(key, raw, 0.0, MAX_PREFILL_WEIGHT, allowed, refuse)


def parse_port_number(key: str, raw: str) -> int:
    if _is_port_number(raw):
        return int(raw)
    raise refuse_metadata(key, raw, "is not a port number; allowed: a number 1-65535")


def parse_activation_threshold(key: str, raw: str) -> float:
    value = parse_number(key, raw)
    if value < 0:
        raise refuse_metadata(key, raw, "is out of range; allowed: a finite number >= 0")
    return value


def parse_metric_name(key: str, raw: str) -> str:
    allowed = "1-200 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    return matching(key, raw, _METRIC_NAME, f"a valid metric name; allowed: {allowed}", refuse_metadata)


def parse_pod_name_prefix(key: str, raw: str) -> str:
    allowed = "lower-case letters, digits, '-' and '.', starting with a letter or digit"
    return matching(key, raw, _POD_NAME_PREFIX, f"a pod name prefix; allowed: {allowed}", refuse_metadata)


def parse_pod_selector(key: str, raw: str) -> str:
    if not raw.strip():
        raise refuse_metadata(key, raw, "is empty; allowed: a Kubernetes label selector")
    return raw.strip()


ENV_PREFIX = "KEDA_GPU_SCALER_"
# A secret that has no flag (a flag's value shows in `ps`): read from the environment only.
PROMETHEUS_PASSWORD_ENV = ENV_PREFIX + "PROMETHEUS_PASSWORD"

Raw = str | list[str] | None
Parser = Callable[[str, Raw], Any]


def _text(name: str, raw: Raw) -> str | None:
    return raw if isinstance(raw, str) and raw else None


@dataclass(frozen=True, slots=True)
class NumberParser:
    """The parser of a number flag: a finite number > 0 of `kind`, within [low, high] when they are given
    (`allowed`, with {name} for the flag, says that range in the error). Its bounds are data, so that the
    chart's values schema (scripts/chart_docs.py) refuses what the scaler would refuse at start."""

    kind: type[float] | type[int]
    low: float | None = None
    high: float | None = None
    allowed: str = ""

    def __call__(self, name: str, raw: Raw) -> float | None:
        if not isinstance(raw, str) or not raw:
            return None
        # ASCII decimals only, as metadata and the one-shot commands take them: int() and float() also
        # take `６`, `6_00` and surrounding whitespace.
        if not _DECIMAL.fullmatch(raw) or (self.kind is int and not raw.lstrip("+-").isdigit()):
            raise refuse_flag(name, raw, f"is not a{'n integer' if self.kind is int else ' number'}")
        value = self.kind(raw)
        if not value > 0 or value != value or value == float("inf"):
            raise refuse_flag(name, raw, "must be a finite number > 0")
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise refuse_flag(name, raw, f"is out of range; allowed: {self.allowed.format(name=name)}")
        return value


# A scrape loop faster than MIN_SCRAPE_INTERVAL spins; slower than MAX_SCRAPE_INTERVAL, no `demand`
# window (at most 600 s) holds two scrapes, so every `demand` trigger would be refused.
MIN_SCRAPE_INTERVAL = 0.1
MAX_SCRAPE_INTERVAL = 300.0

_scrape_interval = NumberParser(float, MIN_SCRAPE_INTERVAL, MAX_SCRAPE_INTERVAL, "seconds, 0.1 to 300")

# gRPC takes its keepalive settings in milliseconds, as a C int: at most 2^31 - 1 ms.
MAX_GRPC_MILLISECONDS_SECONDS = (2**31 - 1) // 1000
MIN_GRPC_MILLISECONDS_SECONDS = 0.001

# Seconds that gRPC takes as a C int of milliseconds: a finite number from 1 ms to 2147483 s (24 days);
# beyond it, serve ended in an OverflowError.
_grpc_seconds = NumberParser(
    float,
    MIN_GRPC_MILLISECONDS_SECONDS,
    MAX_GRPC_MILLISECONDS_SECONDS,
    f"seconds, {MIN_GRPC_MILLISECONDS_SECONDS:g} <= {{name}} <= {MAX_GRPC_MILLISECONDS_SECONDS} (gRPC takes it"
    " in milliseconds, as a 32-bit integer)",
)


def _choice(*allowed: str) -> Parser:
    # The same check for a flag and its environment variable: a value outside the list is an error, never
    # silently something else (KEDA_GPU_SCALER_KUBERNETES=yes must not mean "off").
    def parse(name: str, raw: Raw) -> str:
        return one_of(name, str(raw), allowed, refuse_flag)  # None or a list: never one of them

    return parse


def _switch(name: str, raw: Raw) -> bool:
    return bool(_choice("on", "off")(name, raw) == "on")


def _address(name: str, raw: Raw) -> str:
    text = raw if isinstance(raw, str) else ""
    _, sep, port = text.rpartition(":")
    # ASCII digits only: "٦٠٠٠" passes isdigit() and int(), but no socket takes it.
    if not sep or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise refuse_flag(name, text, "is not an address; allowed: HOST:PORT, e.g. 0.0.0.0:6000")
    return text


def _path(name: str, raw: Raw) -> Path | None:
    """A file that must exist now (it is read at start-up or later, and a typo must stop start-up)."""
    if not isinstance(raw, str) or not raw:
        return None
    if not Path(raw).is_file():
        raise SettingsError(f"{name}={raw[:100]!r}: no such file")
    return Path(raw)


def _token_path(name: str, raw: Raw) -> Path | None:
    """A token file that may appear or change later (a mounted, rotated token): not checked at start-up;
    a scrape that cannot read it fails naming the flag and the file."""
    return Path(raw) if isinstance(raw, str) and raw else None


def _namespaced(name: str, given: str, ref: str, what: str) -> tuple[str, str]:
    """NAMESPACE/NAME within `given` (the flag's value or one item of it), each part checked; `what` names
    the object (a pod, an InferencePool, a ServiceAccount) in the error."""
    namespace, _, object_name = ref.partition("/")
    if not is_namespace(namespace):
        raise SettingsError(f"{name}={given[:100]!r}: {namespace[:100]!r} is not a namespace name")
    if not is_object_name(object_name):
        raise SettingsError(f"{name}={given[:100]!r}: {object_name[:100]!r} is not {what} name")
    return namespace, object_name


def _serviceaccount(name: str, raw: Raw) -> tuple[str, str] | None:
    """NAMESPACE/NAME of a ServiceAccount (the scaler mints its tokens), or None when not given."""
    if not isinstance(raw, str) or not raw:
        return None
    if "/" not in raw:
        raise refuse_flag(name, raw, "is not NAMESPACE/NAME, e.g. keda/keda-gpu-scaler-epp-metrics")
    return _namespaced(name, raw, raw, "a ServiceAccount")


def _items(raw: Raw, separator: str) -> list[str]:
    texts = [raw] if isinstance(raw, str) else raw or []
    return [part.strip() for text in texts for part in text.split(separator) if part.strip()]


def _urls(name: str, raw: Raw) -> tuple[str, ...]:
    urls = _items(raw, ",")
    for url in urls:
        if not is_http_url(url):
            raise refuse_flag(name, url, "is not an http(s) URL")
    return tuple(dict.fromkeys(urls))


def _pages(name: str, raw: Raw, what: str, form: str) -> list[tuple[str, str, str]]:
    """(namespace, object, url) of each NAMESPACE/NAME=URL item; `form` is the shape with an example."""
    found: list[tuple[str, str, str]] = []
    for part in _items(raw, ","):
        ref, sep, url = part.partition("=")
        if not sep or "/" not in ref:
            raise refuse_flag(name, part, f"is not {form}")
        namespace, object_name = _namespaced(name, part, ref, what)
        if not is_http_url(url):
            raise SettingsError(f"{name}={part[:100]!r}: {url[:100]!r} is not an http(s) URL")
        found.append((namespace, object_name, url))
    return found


def _inference_urls(name: str, raw: Raw) -> tuple[tuple[str, str, str], ...]:
    found: dict[tuple[str, str], str] = {}
    for namespace, pod, url in _pages(
        name, raw, "a pod", "NAMESPACE/POD=URL, e.g. llm/vllm-0=http://10.0.0.5:8000/metrics"
    ):
        if found.get((namespace, pod), url) != url:
            raise SettingsError(f"{name}: pod {namespace}/{pod} is given two URLs")
        found[(namespace, pod)] = url
    return tuple((ns, pod, url) for (ns, pod), url in found.items())


def _gateway_urls(name: str, raw: Raw) -> tuple[tuple[str, str, str], ...]:
    """(namespace, pool, url) of each NAMESPACE/POOL=URL: one per endpoint-picker replica, so a pool may
    have several."""
    pages = _pages(
        name, raw, "an InferencePool", "NAMESPACE/POOL=URL, e.g. llm/chat-pool=http://10.0.0.7:9090/metrics"
    )
    found = dict.fromkeys(pages)
    urls = [url for _, _, url in found]
    if len(set(urls)) != len(urls):
        twice = next(url for url in urls if urls.count(url) > 1)
        raise SettingsError(f"{name}: {twice[:100]!r} is given for two pools; one page serves one pool")
    return tuple(found)


def _exporter_namespaces(name: str, raw: Raw) -> frozenset[str] | None:
    """The namespaces GPU exporter pods are read from; None for `*` (any namespace: a tenant's pod labelled
    like an exporter would then be read as its node's exporter)."""
    names = _items(raw, ",")
    if names == ["*"]:
        return None
    if not names:
        raise refuse_flag(name, "", "is empty: give the namespaces the GPU exporters run in, or * for any")
    for namespace in names:
        if not is_namespace(namespace):
            raise refuse_flag(name, namespace, f"is not a namespace name ({NAMESPACE_RULE}), nor * alone")
    return frozenset(names)


def _exporter_selectors(name: str, raw: Raw) -> tuple[ExporterSelector, ...]:
    try:
        return tuple(parse_exporter_selector(p) for p in _items(raw, ";") or DEFAULT_EXPORTER_SELECTORS)
    except SelectorError as error:
        raise SettingsError(f"{name}: {error}") from None


def _prometheus_url(name: str, raw: Raw) -> str | None:
    if (url := _text(name, raw)) is None:
        return None
    if not is_http_url(url):
        raise refuse_flag(name, url, "is not an http(s) URL")
    parts = urlsplit(url)
    if parts.username or parts.password:
        raise SettingsError(
            f"{name}: no credentials in the URL; use --prometheus-username with"
            f" --prometheus-password-file or {PROMETHEUS_PASSWORD_ENV}"
        )
    if parts.query or parts.fragment or "/api/v1" in parts.path:
        raise SettingsError(
            f"{name}={url[:100]!r}: give the base URL (what comes before /api/v1/query), e.g."
            " http://prometheus.monitoring:9090 or http://mimir/prometheus"
        )
    return url.rstrip("/")


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _headers(name: str, raw: Raw) -> tuple[tuple[str, str], ...]:
    headers: list[tuple[str, str]] = []
    for line in _items(raw, "\n"):
        header, sep, value = line.partition(":")
        header, value = header.strip(), value.strip()
        if not sep or not _HEADER_NAME.fullmatch(header):
            # The value is not echoed: it may be a secret (without a ':', all after the first word is).
            raise SettingsError(f"{name} {(header.split() or [''])[0][:40]!r}…: not `Name: value`")
        headers.append((header, value))
    return tuple(headers)
