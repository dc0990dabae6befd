"""Answers of the Prometheus query API decoded into elements and stamped samples (pure: no I/O)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from keda_gpu_scaler.collect.promql import TIMESTAMP_LABEL, Target
from keda_gpu_scaler.exposition import Sample

# Text from the other side (an error message, a header, a malformed element) is quoted at most this long:
# enough to say what went wrong, never a whole page in a log line or an RPC status.
REMOTE_TEXT_LIMIT = 100


class PrometheusError(Exception):
    """A query that gave no usable answer; the message says why, for the store and the RPC's status."""


def remote_text(value: object, limit: int = REMOTE_TEXT_LIMIT) -> str:
    """`value` as one line of at most about `limit` characters, marked with … when cut."""
    text = value if isinstance(value, str) else repr(value)
    cut = text[:limit]
    shown = "".join(char if char.isprintable() else repr(char)[1:-1] for char in cut)
    return shown + "…" if len(text) > limit else shown


@dataclass(frozen=True, slots=True)
class Element:
    """One element of an instant vector."""

    labels: dict[str, str]
    value: float


def parse_vector(body: bytes) -> tuple[list[Element], list[str]]:
    """The elements and warnings of a /api/v1/query answer; PrometheusError for anything else."""
    try:
        document = json.loads(body)
    # UnicodeDecodeError is a ValueError too; RecursionError: nested deeper than the decoder goes.
    except (ValueError, RecursionError) as error:
        raise PrometheusError(f"the answer is not JSON ({remote_text(str(error))})") from None
    if not isinstance(document, dict):
        raise PrometheusError("the answer is not a Prometheus API response")
    if document.get("status") != "success":
        raise PrometheusError(api_error(document) or f"status {remote_text(repr(document.get('status')))}")
    data = document.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise PrometheusError("the answer has no data.result")
    if data.get("resultType") != "vector":
        raise PrometheusError(
            f"the answer is a {remote_text(repr(data.get('resultType')))}, not an instant vector"
        )
    elements = []
    for item in data["result"]:
        metric = item.get("metric") if isinstance(item, dict) else None
        pair = item.get("value") if isinstance(item, dict) else None
        if (
            not isinstance(metric, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items())
            or not isinstance(pair, list)
            or len(pair) != 2
            or not isinstance(pair[1], str)
        ):
            raise PrometheusError(f"malformed vector element: {remote_text(str(item))}")
        try:
            value = float(pair[1])  # also "NaN", "+Inf", "-Inf"
        except ValueError:
            raise PrometheusError(f"malformed sample value {remote_text(repr(pair[1]))}") from None
        elements.append(Element(metric, value))
    warnings = document.get("warnings")
    return elements, [remote_text(str(w)) for w in warnings] if isinstance(warnings, list) else []


def api_error(document: Any) -> str | None:
    """`errorType: error` of an API error answer, quoted short; None when it has none."""
    if isinstance(document, dict) and document.get("error"):
        kind = document.get("errorType")
        error = remote_text(str(document["error"]))
        return f"{remote_text(str(kind))}: {error}" if kind else error
    return None


def samples_with_times(elements: Iterable[Element]) -> list[Sample]:
    """The value elements as Samples stamped with their own sample time.

    A value without a time is left out: the two halves of the query read the series one after the
    other, so a series that appeared in between has only one of them; the next collection has both.
    """
    times: dict[frozenset[tuple[str, str]], float] = {}
    values: list[Element] = []
    for element in elements:
        if "__name__" in element.labels:
            values.append(element)
        elif element.labels.get(TIMESTAMP_LABEL) == "1":
            labels = {k: v for k, v in element.labels.items() if k != TIMESTAMP_LABEL}
            times[frozenset(labels.items())] = element.value
    samples = []
    for element in values:
        labels = dict(element.labels)
        name = labels.pop("__name__")
        at = times.get(frozenset(labels.items()))
        if at is not None:
            samples.append(Sample(name, labels, element.value, round(at * 1000)))
    return samples


def merged(*parts: Iterable[Sample]) -> list[Sample]:
    """One sample per series: the GPU queries return the namespace's own series again."""
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    result = []
    for part in parts:
        for sample in part:
            key = (sample.name, frozenset(sample.labels.items()))
            if key not in seen:
                seen.add(key)
                result.append(sample)
    return result


def target_of(labels: dict[str, str]) -> Target:
    return labels.get("job", ""), labels.get("instance", "")


def seconds(sample: Sample) -> float:
    """A stamped sample's time in seconds."""
    return (sample.timestamp_ms or 0) / 1000
