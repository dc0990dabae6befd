"""The parsers of `serve` flag values: each turns a flag's raw text into its typed value, or raises
SettingsError naming the flag, the value and what is allowed."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from keda_gpu_scaler.core.names import is_namespace, is_object_name
from keda_gpu_scaler.core.selectors import (
    DEFAULT_EXPORTER_SELECTORS,
    ExporterSelector,
    SelectorError,
    parse_exporter_selector,
)

ENV_PREFIX = "KEDA_GPU_SCALER_"
# A secret that has no flag (a flag's value shows in `ps`): read from the environment only.
PROMETHEUS_PASSWORD_ENV = ENV_PREFIX + "PROMETHEUS_PASSWORD"


class SettingsError(ValueError):
    """A flag or environment value that cannot be used; the message names it and what is allowed."""


Raw = str | list[str] | None
Parser = Callable[[str, Raw], Any]


def _text(name: str, raw: Raw) -> str | None:
    return raw if isinstance(raw, str) and raw else None


def _positive(kind: type[float] | type[int]) -> Parser:
    def parse(name: str, raw: Raw) -> float | None:
        if not isinstance(raw, str) or not raw:
            return None
        try:
            value = kind(raw)
        except ValueError:
            raise SettingsError(
                f"{name}={raw[:100]!r} is not a{'n integer' if kind is int else ' number'}"
            ) from None
        if not value > 0 or value != value or value == float("inf"):
            raise SettingsError(f"{name}={raw[:100]!r} must be a finite number > 0")
        return value

    return parse


def _choice(*allowed: str) -> Parser:
    # The same check for a flag and its environment variable: a value outside the list is an error, never
    # silently something else (KEDA_GPU_SCALER_KUBERNETES=yes must not mean "off").
    def parse(name: str, raw: Raw) -> str:
        if not isinstance(raw, str) or raw not in allowed:
            raise SettingsError(f"{name}={str(raw)[:100]!r} is not allowed; use one of: {', '.join(allowed)}")
        return raw

    return parse


def _switch(name: str, raw: Raw) -> bool:
    return bool(_choice("on", "off")(name, raw) == "on")


def _address(name: str, raw: Raw) -> str:
    text = raw if isinstance(raw, str) else ""
    _, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise SettingsError(f"{name}={text[:100]!r} is not an address; allowed: HOST:PORT, e.g. 0.0.0.0:6000")
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
        raise SettingsError(
            f"{name}={raw[:100]!r} is not NAMESPACE/NAME, e.g. keda/keda-gpu-scaler-epp-metrics"
        )
    return _namespaced(name, raw, raw, "a ServiceAccount")


def _items(raw: Raw, separator: str) -> list[str]:
    texts = [raw] if isinstance(raw, str) else raw or []
    return [part.strip() for text in texts for part in text.split(separator) if part.strip()]


def _urls(name: str, raw: Raw) -> tuple[str, ...]:
    urls = _items(raw, ",")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise SettingsError(f"{name}={url[:100]!r} is not an http(s) URL")
    return tuple(dict.fromkeys(urls))


def _pages(name: str, raw: Raw, what: str, form: str) -> list[tuple[str, str, str]]:
    """(namespace, object, url) of each NAMESPACE/NAME=URL item; `form` is the shape with an example."""
    found: list[tuple[str, str, str]] = []
    for part in _items(raw, ","):
        ref, sep, url = part.partition("=")
        if not sep or "/" not in ref:
            raise SettingsError(f"{name}={part[:100]!r} is not {form}")
        namespace, object_name = _namespaced(name, part, ref, what)
        if not url.startswith(("http://", "https://")):
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


def _exporter_selectors(name: str, raw: Raw) -> tuple[ExporterSelector, ...]:
    try:
        return tuple(parse_exporter_selector(p) for p in _items(raw, ";") or DEFAULT_EXPORTER_SELECTORS)
    except SelectorError as error:
        raise SettingsError(f"{name}: {error}") from None


def _prometheus_url(name: str, raw: Raw) -> str | None:
    url = _text(name, raw)
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(f"{name}={url[:100]!r} is not an http(s) URL")
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
            # The value is not echoed: it may be a secret.
            raise SettingsError(f"{name} {header[:40]!r}…: not `Name: value`")
        headers.append((header, value))
    return tuple(headers)
