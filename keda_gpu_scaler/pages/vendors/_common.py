"""Types and helpers shared by the vendor modules: readings, pod identity, value normalisation."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from keda_gpu_scaler.pages.exposition import Sample


class Family(StrEnum):
    """Pod-value source families, in priority order for one pod (see SPEC §4)."""

    ACK = "ack"
    NVIDIA = "nvidia"
    AMD = "amd"


class NvidiaField(StrEnum):
    AUTO = "auto"
    GPU_UTIL = "gpu_util"
    GR_ENGINE_ACTIVE = "gr_engine_active"


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU (or MIG instance, or time-sliced share) as used by one pod, normalised to percentages."""

    family: Family
    namespace: str
    pod: str
    gpu: str
    host: str
    utilization: float | None
    engine_active: float | None
    mig: bool
    memory: float | None


PodKey = tuple[str, str]
"""(namespace, pod)."""

# Label pairs naming a sample's pod. The plain pair last: through Prometheus (honorLabels false) it is the
# scrape target (the exporter's own pod) and the workload's pair is `exported_*`; ACK's CamelCase
# per-process pair and dcgm-exporter's `--use-old-namespace` pair sit beside a target pair the same way.
POD_LABELS: tuple[tuple[str, str], ...] = (
    ("exported_namespace", "exported_pod"),
    ("NamespaceName", "PodName"),
    ("pod_namespace", "pod_name"),
    ("namespace", "pod"),
)
_NAMESPACE_KEYS = tuple(ns_key for ns_key, _ in POD_LABELS[1:-1])
_POD_KEYS = tuple(pod_key for _, pod_key in POD_LABELS[1:-1])


def target_pair(labels: Mapping[str, str]) -> PodKey | None:
    """The plain `namespace`/`pod` pair when nothing more specific names the sample's pod.

    That pair is where Prometheus puts a scrape target's own pod (the exporter's), so only such a pair can
    be the exporter's; one beside `exported_pod` or `pod_name` is the target's while the other names the
    workload.
    """
    if any(labels.get(ns_key) and labels.get(pod_key) for ns_key, pod_key in POD_LABELS[:-1]):
        return None
    namespace, pod = labels.get("namespace", ""), labels.get("pod", "")
    return (namespace, pod) if namespace and pod else None


def _other_names(labels: Mapping[str, str], plain: str, keys: tuple[str, ...]) -> set[str]:
    """What a sample's labels other than `plain` call its namespace (or pod): `keys`, and `plain` renamed
    by Prometheus, `exported_<plain>`, prefixed again while the name is taken (by a label of the page)."""
    names = {value for key in keys if (value := labels.get(key))}
    key = "exported_" + plain
    while key in labels:
        if value := labels[key]:
            names.add(value)
        key = "exported_" + key
    return names


class PodResolver:
    """Finds the pod a sample belongs to; knows the scrape targets' own pods so it never reports them.

    A series whose labels name two different pods (or namespaces) is no pod's: dcgm-exporter with
    --kubernetes-enable-pod-labels copies a pod's own Kubernetes labels onto its series, and whoever runs
    the pod writes them (`exported_namespace`, `PodName`, ...), so such a series may be anyone's. On an
    exporter's own page every pod-label pair counts. Through Prometheus (`through_prometheus`) the plain
    `namespace`/`pod` pair beside another is the scrape target's, not a name of the pod: a series that
    names no workload pod (an idle GPU, dcgm-exporter's device-level series beside per-pod ones) still
    carries the exporter's own pair. With honorLabels false, those pairs are learnt from the samples that
    show both a workload (`exported_pod`) and a target pair. With honorLabels true the workload's own pair
    wins and nothing shows both: a vendor that can tell its exporter's series by their shape adds those
    pairs (with_targets). Either way they are then read as "no pod" everywhere on the page.
    """

    __slots__ = ("_targets", "_through_prometheus")

    def __init__(
        self,
        samples: Iterable[Sample] = (),
        targets: Iterable[PodKey] = (),
        *,
        through_prometheus: bool = False,
    ) -> None:
        learnt: set[PodKey] = set(targets)
        if through_prometheus:
            for sample in samples:
                labels = sample.labels
                if labels.get("exported_pod") and labels.get("pod") and labels.get("namespace"):
                    learnt.add((labels["namespace"], labels["pod"]))
        self._targets = frozenset(learnt)
        self._through_prometheus = through_prometheus

    @property
    def targets(self) -> frozenset[PodKey]:
        """The `namespace`/`pod` pairs read as a scrape target's own pod."""
        return self._targets

    def with_targets(self, targets: Iterable[PodKey]) -> PodResolver:
        """This resolver, also reading these `namespace`/`pod` pairs as a scrape target's own pod."""
        more = frozenset(targets) - self._targets
        if not more:
            return self
        return PodResolver(targets=self._targets | more, through_prometheus=self._through_prometheus)

    def pod_of(self, labels: Mapping[str, str]) -> PodKey | None:
        namespace, pod = labels.get("namespace", ""), labels.get("pod", "")
        namespaces = _other_names(labels, "namespace", _NAMESPACE_KEYS)
        pods = _other_names(labels, "pod", _POD_KEYS)
        if not namespaces and not pods:
            if not namespace or not pod or (namespace, pod) in self._targets:
                return None
            return namespace, pod
        if not self._through_prometheus:
            namespaces.update([namespace] if namespace else [])
            pods.update([pod] if pod else [])
        if len(namespaces) != 1 or len(pods) != 1:
            return None  # two pods named, or a namespace without its pod
        return namespaces.pop(), pods.pop()


def finite_or_none(value: float) -> float | None:
    """NaN and ±Inf samples carry no reading (a dcgm field that failed, a stale gauge)."""
    return value if math.isfinite(value) else None


def clamp_percent(value: float | None) -> float | None:
    if value is None:
        return None
    return min(100.0, max(0.0, value))


def percent_of(used: float | None, total: float | None) -> float | None:
    if used is None or total is None or total <= 0:
        return None
    return clamp_percent(used / total * 100.0)


def remember(values: dict[str, float | None], name: str, value: float) -> None:
    """Keep one value per name: the last finite one; NaN/Inf only marks the series as present.

    A page can print one series twice (two scrape jobs behind one Prometheus, one value per container of
    a pod): they are the same quantity, so the last one wins instead of being added.
    """
    number = finite_or_none(value)
    if number is not None or name not in values:
        values[name] = number


def first_label(labels: Mapping[str, str], keys: Iterable[str]) -> str:
    """The first non-empty value among `keys` (most trusted first), or "" when none is set."""
    for key in keys:
        value = labels.get(key)
        if value:
            return value
    return ""


def dcgm_gpu(labels: Mapping[str, str]) -> tuple[str, str]:
    """(GPU, MIG instance) of a DCGM-style sample (dcgm-exporter, ACK's exporter); instance "" outside MIG.

    The GPU is its UUID (`uuid` with --use-old-namespace), else the device or index an older page carries;
    a MIG instance is "<uuid>/<GPU_I_ID>", since it shares its parent's UUID.
    """
    gpu = first_label(labels, ("UUID", "uuid", "device", "gpu"))
    instance = labels.get("GPU_I_ID", "")
    return (f"{gpu}/{instance}" if instance else gpu), instance
