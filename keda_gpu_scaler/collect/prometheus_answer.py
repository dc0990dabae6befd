"""Answers of the Prometheus query API decoded into elements and stamped samples (pure: no I/O)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from keda_gpu_scaler.collect.inference import PodSamples
from keda_gpu_scaler.collect.promql import TIMESTAMP_LABEL, Target
from keda_gpu_scaler.engines import ENGINE_SAMPLE_NAMES, pod_of
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


@dataclass(frozen=True, slots=True)
class InferencePods:
    """A namespace's inference-server series from one answer, grouped by pod and checked for age."""

    pods: tuple[PodSamples, ...]  # pods with fresh series, by pod name; each pod's series in a fixed order
    oldest: float | None  # the time (s) of the oldest sample kept; None when no pod is kept
    stale: tuple[str, ...]  # pods left out: every series of theirs older than the window


def inference_pods(samples: Iterable[Sample], namespace: str, at: float, window: float) -> InferencePods:
    """The stamped samples of an inference query, as one PodSamples per pod of `namespace`.

    The pod comes from engines.pod_of (`exported_namespace`/`exported_pod` first, then `namespace`/`pod`);
    series naming no pod, or a pod of another namespace, are left out. A series whose sample is more than
    `window` seconds older than the query time `at` is left out too, and a pod with no series left is
    not in the answer at all: stale values are never used, and the pod is one without data (a missing
    pod, for the evaluator) rather than one reading old numbers.
    """
    by_pod: dict[str, list[Sample]] = {}
    stale: set[str] = set()
    for sample in samples:
        if sample.name not in ENGINE_SAMPLE_NAMES:
            continue
        key = pod_of(sample.labels)
        if key is None or key[0] != namespace:
            continue
        if at - seconds(sample) > window:
            stale.add(key[1])
            continue
        by_pod.setdefault(key[1], []).append(sample)
    pods = []
    oldest: float | None = None
    for pod in sorted(by_pod):
        # Prometheus answers in no fixed order: sorted, one set of series always makes one equal page.
        series = sorted(by_pod[pod], key=lambda s: (s.name, sorted(s.labels.items())))
        pods.append(PodSamples(namespace, pod, tuple(series)))
        first = min(seconds(s) for s in series)
        oldest = first if oldest is None else min(oldest, first)
    return InferencePods(tuple(pods), oldest, tuple(sorted(stale - by_pod.keys())))
