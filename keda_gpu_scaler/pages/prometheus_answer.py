"""Answers of the Prometheus query API decoded into elements and stamped samples (pure: no I/O)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from keda_gpu_scaler.pages.engines import ENGINE_SAMPLE_NAMES, PodKey, pod_of
from keda_gpu_scaler.pages.exposition import Sample
from keda_gpu_scaler.pages.gateways import (
    GATEWAY_SAMPLE_NAMES,
    SCRAPE_TARGET_LABELS,
    NotAGatewayPage,
    QueueTable,
    table_from_samples,
)
from keda_gpu_scaler.pages.jsonpieces import OFF_LOOP_BYTES, TooManyItems, loads_in_pieces
from keda_gpu_scaler.pages.promql import TIMESTAMP_LABEL, Target
from keda_gpu_scaler.pages.vendors import GpuReading, PodResolver, readings_from_samples

# Text from the other side (an error message, a header, a malformed element) is quoted at most this long:
# enough to say what went wrong, never a whole page in a log line or an RPC status.
REMOTE_TEXT_LIMIT = 100
# What one answer may hold: 20,000 series, each with its value and its sample time (the queries ask for
# both), as many as one exporter page may give. A namespace of 1,000 GPU pods answers a few thousand; an
# answer beyond this is refused before the rest of it is decoded, so it costs a bounded time.
MAX_ANSWER_ELEMENTS = 40_000


class PrometheusError(Exception):
    """A query that gave no usable answer; the message says why, for the store and the RPC's status."""


def remote_text(value: object, limit: int = REMOTE_TEXT_LIMIT) -> str:
    """`value` as one line of at most about `limit` characters, marked with … when cut."""
    text = value if isinstance(value, str) else repr(value)
    cut = text[:limit]
    shown = "".join(char if char.isprintable() else repr(char)[1:-1] for char in cut)
    return shown + "…" if len(text) > limit else shown


class Element(NamedTuple):
    """One element of an instant vector. (A tuple of a str-only dict and a float, which the garbage
    collector stops tracking: a 40,000-element answer adds nothing to walk in a full collection.)"""

    labels: dict[str, str]
    value: float


def parse_vector(body: bytes) -> tuple[list[Element], list[str]]:
    """The elements and warnings of a /api/v1/query answer; PrometheusError for anything else.

    A large answer is decoded a vector element at a time (run it in a worker thread: see jsonpieces),
    each element made an Element as it is decoded: the decoder's dict and list of each are freed at once,
    never 40,000 of them alive together for the garbage collector to walk."""
    try:
        if len(body) > OFF_LOOP_BYTES:
            if counted_elements(body) > MAX_ANSWER_ELEMENTS:
                raise too_many_elements()  # told in ms, where decoding to the limit takes 0.3 s
            document = loads_in_pieces(body, ("data", "result"), MAX_ANSWER_ELEMENTS, _element_or_item)
        else:
            document = json.loads(body)
    except TooManyItems:
        raise too_many_elements() from None
    # UnicodeDecodeError is a ValueError too; RecursionError: nested deeper than the decoder goes.
    except (ValueError, RecursionError) as error:
        raise PrometheusError(f"the answer is not JSON ({remote_text(str(error))})") from error
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
    if data.get("isPartial") is True or document.get("isPartial") is True:
        # VictoriaMetrics' cluster answers with what its reachable storage nodes hold: pods would look gone.
        raise PrometheusError("the answer is partial (isPartial: a storage node did not answer)")
    if len(data["result"]) > MAX_ANSWER_ELEMENTS:
        raise too_many_elements()
    elements = [item if isinstance(item, Element) else _element(item) for item in data["result"]]
    warnings = document.get("warnings")
    return elements, [remote_text(str(w)) for w in warnings] if isinstance(warnings, list) else []


# What ends a vector element's labels and starts its value in Prometheus' encoding (and Thanos', Mimir's,
# VictoriaMetrics'): {"metric":{…},"value":[…]}. No string holds it, since quotes in strings are escaped.
_ELEMENT_VALUE = b'},"value":['
_COUNT_STEP = 1 << 20


def counted_elements(body: bytes) -> int:
    """How many vector elements the answer holds as Prometheus encodes them (another key order counts
    fewer), found without decoding it: counted a MiB at a time, so a worker thread doing it leaves the
    GIL to the event loop between steps."""
    overlap = len(_ELEMENT_VALUE) - 1
    return sum(
        body.count(_ELEMENT_VALUE, start, start + _COUNT_STEP + overlap)
        for start in range(0, len(body), _COUNT_STEP)
    )


def _element(item: Any) -> Element:
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
    return Element(metric, value)


def _element_or_item(item: Any) -> Any:
    """The Element an item of the result is, or the item itself: why it is none is said once the
    answer is known to be a vector (a matrix's items are no vector elements either)."""
    try:
        return _element(item)
    except PrometheusError:
        return item


def too_many_elements() -> PrometheusError:
    return PrometheusError(
        f"the answer holds more than {MAX_ANSWER_ELEMENTS:,} vector elements (series values and their"
        f" sample times); the limit is {MAX_ANSWER_ELEMENTS:,}: narrow the trigger's pods, or read the"
        " exporters directly (source: scrape)"
    )


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
            if not math.isfinite(at):  # a timestamp() that is no time: the answer cannot be used
                raise PrometheusError(f"the sample time of {remote_text(name)} is {at!r}, not a time")
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


def target_pages(
    samples: Iterable[Sample], at: float, window: float
) -> dict[Target, tuple[float, list[GpuReading]]]:
    """A GPU answer's series by scrape target, each as a page: (the time it is as of, its readings).

    The page is as old as its oldest series at most `window` old: none of its readings is used once
    stale. A target whose every series is stale keeps a page as old as its newest, so that its pods count
    as missing (and the error says how old the data is) instead of vanishing."""
    by_target: dict[Target, list[Sample]] = {}
    for sample in samples:
        by_target.setdefault(target_of(sample.labels), []).append(sample)
    pages = {}
    for target, series in by_target.items():
        fresh = [s for s in series if at - seconds(s) <= window]
        times = [seconds(s) for s in fresh or series]
        as_of = min(times) if fresh else max(times)
        pages[target] = (as_of, readings_from_samples(fresh or series, through_prometheus=True))
    return pages


def seconds(sample: Sample) -> float:
    """A stamped sample's time in seconds."""
    return (sample.timestamp_ms or 0) / 1000


@dataclass(frozen=True, slots=True)
class FreshSeries:
    """One answer's series grouped by the pod (or endpoint-picker replica) they belong to, checked for age."""

    # Those with fresh series, by name, each with its series in a fixed order (Prometheus answers in
    # none: sorted, one set of series always makes one equal page).
    by_pod: tuple[tuple[str, tuple[Sample, ...]], ...]
    oldest: float | None  # the time (s) of the oldest sample kept; None when none is kept
    stale: tuple[str, ...]  # those left out: every series of theirs older than the window
    targets: dict[str, frozenset[Target]]  # the scrape targets that served each, fresh or not


def fresh_series(
    samples: Iterable[Sample],
    names: frozenset[str],
    pod_of_labels: Callable[[dict[str, str]], str | None],
    at: float,
    window: float,
) -> FreshSeries:
    """The stamped samples of `names` grouped by `pod_of_labels` (None: not one of ours, left out).

    A series whose sample is more than `window` seconds older than the query time `at` is left out, and
    a pod with no series left is not in the answer at all: stale values are never used, and the pod is
    one without data (a missing pod, for the evaluator) rather than one reading old numbers; the caller
    decides what its absence means.
    """
    grouped: dict[str, list[Sample]] = {}
    stale: set[str] = set()
    targets: dict[str, set[Target]] = {}
    for sample in samples:
        if sample.name not in names:
            continue
        pod = pod_of_labels(sample.labels)
        if pod is None:
            continue
        targets.setdefault(pod, set()).add(target_of(sample.labels))
        if at - seconds(sample) > window:
            stale.add(pod)
            continue
        grouped.setdefault(pod, []).append(sample)
    by_pod = []
    oldest: float | None = None
    for pod in sorted(grouped):
        series = tuple(sorted(grouped[pod], key=lambda s: (s.name, sorted(s.labels.items()))))
        by_pod.append((pod, series))
        first = min(seconds(s) for s in series)
        oldest = first if oldest is None else min(oldest, first)
    return FreshSeries(
        tuple(by_pod),
        oldest,
        tuple(sorted(stale - grouped.keys())),
        {pod: frozenset(found) for pod, found in targets.items()},
    )


def inference_pods(
    samples: Iterable[Sample],
    namespace: str,
    at: float,
    window: float,
    exporter_namespaces: Collection[str] | None,
) -> FreshSeries:
    """An inference query's series by pod of `namespace`: the pod comes from engines.pod_of
    (`exported_namespace`/`exported_pod` first, then `namespace`/`pod`); series naming no pod, or a pod
    of another namespace, are left out, and so are `exported_*` pairs scraped from a target outside
    `namespace` and `exporter_namespaces` (None: any), as promql.inference_query asks."""
    speaking = None if exporter_namespaces is None else {namespace, *exporter_namespaces}

    def pod_in_namespace(labels: dict[str, str]) -> str | None:
        key = pod_of(labels)
        if key is None or key[0] != namespace:
            return None
        exported = labels.get("exported_namespace") and labels.get("exported_pod")
        if exported and speaking is not None and labels.get("namespace", "") not in speaking:
            return None
        return key[1]

    return fresh_series(samples, ENGINE_SAMPLE_NAMES, pod_in_namespace, at, window)


def replica_tables(by_pod: Iterable[tuple[str, Sequence[Sample]]]) -> dict[str, QueueTable | NotAGatewayPage]:
    """Each endpoint-picker replica's queue from its series (gateway_replicas' by_pod), or why its series
    are no picker's page."""
    tables: dict[str, QueueTable | NotAGatewayPage] = {}
    for name, series in by_pod:
        try:
            tables[name] = table_from_samples(series)
        except NotAGatewayPage as error:
            tables[name] = error
    return tables


def replica_of(labels: dict[str, str]) -> str:
    """The EPP replica a series came from: its pod (Kubernetes service discovery), else its target."""
    return labels.get("pod") or labels.get("instance") or labels.get("job") or "(unnamed target)"


def gateway_replicas(samples: Iterable[Sample], namespace: str, at: float, window: float) -> FreshSeries:
    """A gateway query's series by endpoint-picker replica of `namespace`.

    One replica's page read by two scrape jobs (a ServiceMonitor and a PodMonitor) is in Prometheus twice,
    its series differing only by scrape-target labels: those copies count once (the largest, as
    engines.gauge takes a pod's copies), or the replica's queue would count twice.
    """

    def replica_in_namespace(labels: dict[str, str]) -> str | None:
        return replica_of(labels) if labels.get("namespace") == namespace else None

    found = fresh_series(samples, GATEWAY_SAMPLE_NAMES, replica_in_namespace, at, window)
    by_pod = tuple((replica, _one_copy_each(series)) for replica, series in found.by_pod)
    if by_pod == found.by_pod:
        return found
    times = [seconds(s) for _, series in by_pod for s in series]
    return dataclasses.replace(found, by_pod=by_pod, oldest=min(times) if times else None)


def _one_copy_each(series: tuple[Sample, ...]) -> tuple[Sample, ...]:
    """One sample per series once the scrape-target labels are set aside: the largest value (then the
    newest), so that the result does not depend on the answer's order. The order of `series` is kept."""
    kept: dict[tuple[str, frozenset[tuple[str, str]]], Sample] = {}
    for sample in series:
        key = (sample.name, frozenset(i for i in sample.labels.items() if i[0] not in SCRAPE_TARGET_LABELS))
        before = kept.get(key)
        if before is None or (_rank(sample) > _rank(before)):
            kept[key] = sample
    chosen = {id(sample) for sample in kept.values()}
    return tuple(sample for sample in series if id(sample) in chosen)


def _rank(sample: Sample) -> tuple[float, int]:
    value = sample.value if not math.isnan(sample.value) else -math.inf
    return value, sample.timestamp_ms or 0


@dataclass(frozen=True, slots=True)
class ReplicaLost:
    """An EPP replica whose series were fresh before and are not now, while Prometheus still has its
    target: it may hold requests nobody can see, so it counts as a replica that cannot be read."""

    namespace: str
    replica: str
    reason: str

    @property
    def pod(self) -> str:
        return self.replica


@dataclass(frozen=True, slots=True)
class Up:
    """One of Prometheus' own `up` series: whether its last scrape of a target worked, and when."""

    target: Target
    value: float  # 1: the scrape worked; 0: it failed (refused, timed out, not a metrics page)
    time: float  # the sample time (s)
    pod: PodKey | None  # the pod the target's own labels name (Kubernetes service discovery), if any


def up_series(samples: Iterable[Sample]) -> list[Up]:
    """The stamped samples of an up_query answer as Up records."""
    return [Up(target_of(s.labels), s.value, seconds(s), pod_of(s.labels)) for s in samples if s.name == "up"]


def lost_pod(
    namespace: str,
    pod: str,
    targets: Iterable[Target],
    stale: bool,
    ups: Iterable[Up],
    at: float,
    window: float,
    serves: str = "a known inference server",
) -> str | None:
    """Why a pod that had fresh series and has none now still counts, or None: it is gone. `serves`:
    what its page must have series of (an inference server's, an endpoint picker's flow control).

    Decided by Prometheus' own `up` series of the scrape targets that served the pod (`targets`) and of
    any target whose labels name the pod. None of them any more means service discovery dropped the
    target: the pod was deleted (scaled down) and stops counting. Otherwise the pod is one without data,
    a missing pod for the evaluator (SPEC §4), and the reason says why, when:
    - a scrape of one of them fails (`up` 0: the server stopped, crashed or hangs);
    - its series are still there but older than the window (`stale`: timestamps frozen);
    - the target naming the pod is scraped but its page has no series of a known engine (SPEC §4: a page
      without a known family is a failure, not an empty page);
    - Prometheus has not scraped any of them within the window.
    Scraped fine by a target that does not name the pod (a metrics proxy, or an address another pod now
    has) while the pod's series are gone: the target no longer serves that pod, which is gone.
    """
    targets = set(targets)
    relevant = [u for u in ups if u.target in targets or u.pod == (namespace, pod)]
    if not relevant:
        return None
    current = [u for u in relevant if at - u.time <= window]
    down = [u for u in current if u.value < 1]
    if down:
        return f"its server does not answer Prometheus' scrapes (up 0 for {_target_text(down[0].target)})"
    if stale:
        return "its series stopped updating in Prometheus (sample times older than the max staleness)"
    if any(u.pod == (namespace, pod) for u in current):
        return f"Prometheus scrapes it, but its page has no series of {serves}"
    if not current:
        newest = max(relevant, key=lambda u: u.time)
        return f"Prometheus has not scraped {_target_text(newest.target)} for {at - newest.time:.0f}s"
    return None


def down_pods(
    namespace: str, seen: Collection[str], found: FreshSeries, ups: Iterable[Up], at: float, window: float
) -> dict[str, str]:
    """The pods of `namespace` never read (neither in `found` nor `seen`) whose scrape target Prometheus
    finds down (`up` 0), each with why it counts as missing.

    Without Kubernetes the target pods are those Prometheus names: a pod whose server was down since the
    scaler started is named by its target only, and counts as a missing pod (SPEC §4: never a made-up 0
    while a source fails), as the GPU path's "exporters down" check does for exporters.
    """
    fresh = {pod for pod, _ in found.by_pod}
    down: dict[str, str] = {}
    for up in ups:
        if up.value >= 1 or at - up.time > window or up.pod is None or up.pod[0] != namespace:
            continue
        if up.pod[1] not in fresh and up.pod[1] not in seen:
            why = f"its server does not answer Prometheus' scrapes (up 0 for {_target_text(up.target)})"
            down.setdefault(up.pod[1], why)
    return down


# Why an exporter still scraped whose GPU series name no pod any more counts as failing (SPEC §4).
ATTRIBUTION_LOST = (
    "its GPU series in Prometheus name no pod any more (dcgm-exporter prints them without pod labels when"
    " the kubelet's pod-resources socket fails): an attribution outage"
)


def unattributed(targets: Iterable[Target], groups: Iterable[Element], ups: Iterable[Up]) -> set[Target]:
    """Of `targets`, the exporters whose fresh GPU series (`groups`: an attribution_query answer) name no
    pod but their own, the pod their `up` series' target labels name: an attribution outage. Their pods
    count as missing for as long as it lasts, as when the page is scraped directly (SPEC §4)."""
    resolver = PodResolver(targets=(up.pod for up in ups if up.pod is not None), through_prometheus=True)
    named = {target_of(group.labels) for group in groups if resolver.pod_of(group.labels) is not None}
    return {target for target in targets if target not in named}


def lost_target(target: Target, ups: Iterable[Up], at: float, window: float) -> str | None:
    """Why a GPU exporter whose series vanished (and that has no fresh GPU series at all) still counts as a
    failing source, its pods missing, or None: Prometheus no longer has the target, which went with its
    node or was removed on purpose, and so did the pods it served.

    Decided by Prometheus' own `up` series for the target, however long the outage lasts: forgetting a
    down exporter's pods after a while would shrink the value (a made-up drop in load).
    """
    mine = [u for u in ups if u.target == target]
    if not mine:
        return None
    current = [u for u in mine if at - u.time <= window]
    if any(u.value < 1 for u in current):
        return f"the exporter does not answer Prometheus' scrapes (up 0 for {_target_text(target)})"
    if current:
        return f"Prometheus scrapes {_target_text(target)}, but its page has no GPU exporter series"
    newest = max(mine, key=lambda u: u.time)
    return f"Prometheus has not scraped {_target_text(target)} for {at - newest.time:.0f}s"


def _target_text(target: Target) -> str:
    job, instance = target
    return f"{job}/{instance}"
