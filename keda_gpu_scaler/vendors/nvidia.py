"""NVIDIA dcgm-exporter pages (and the DCGM_FI_* families of ACK's exporter) turned into per-pod readings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from keda_gpu_scaler.exposition import Sample
from keda_gpu_scaler.vendors._common import (
    Family,
    GpuReading,
    PodKey,
    PodResolver,
    clamp_percent,
    dcgm_gpu,
    first_label,
    percent_of,
    remember,
    target_pair,
)

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # %, integer duty cycle
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # ratio 0-1
FB_USED = "DCGM_FI_DEV_FB_USED"  # MiB
FB_FREE = "DCGM_FI_DEV_FB_FREE"  # MiB
FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"  # MiB, since 4.3.1-4.4.0
FB_TOTAL = "DCGM_FI_DEV_FB_TOTAL"  # MiB, not exported by default; ACK prints it

SAMPLE_NAMES = frozenset({GPU_UTIL, GR_ENGINE_ACTIVE, FB_USED, FB_FREE, FB_RESERVED, FB_TOTAL})

# Families whose pod-labelled series can be the pod's own value rather than a copy of the device's.
# dcgm-exporter (internal/pkg/transformation/kubernetes.go and process_metrics.go, main 2026) with
# --kubernetes-virtual-gpus: for the fields isPerProcessMetric() names (GPU_UTIL and FB_USED; one
# revision adds GR_ENGINE_ACTIVE) it keeps the original device-level series, without pod labels, and
# adds one series per sharing pod whose value is the sum of that pod's processes (NVML per-PID data,
# "0" for a pod with no process), always labelled `pod_uid`, plus `vgpu` when the device plugin names a
# replica. Every other field, and these fields when no per-process data exist for the device, is
# replaced by one copy of the device value per sharing pod (`vgpu`; `pod_uid` only with
# --kubernetes-enable-pod-uid). So neither `pod_uid` nor `vgpu` alone tells a true value from a copy:
# what does is a device-level series of the same family on the same GPU beside pod-labelled ones
# carrying `pod_uid`. That is the test below, made per family so the GR_ENGINE_ACTIVE revision works too.
# The per-pod value is keyed by pod UID but printed once per container (and per vgpu replica) of the
# pod, so a pod's several series for one GPU are one value, never added.
_MAYBE_PER_POD = (GPU_UTIL, GR_ENGINE_ACTIVE, FB_USED)

_HOST_LABELS = ("Hostname", "hostname", "NodeName")  # `hostname` after dcgm-exporter #655; ACK NodeName


@dataclass(slots=True)
class _PodSeries:
    values: dict[str, float | None] = field(default_factory=dict)
    with_uid: AbstractSet[str] = frozenset()  # families whose series for this pod carried pod_uid


@dataclass(slots=True)
class _Gpu:
    gpu: str
    host: str
    mig: bool
    device: dict[str, float | None] = field(default_factory=dict)  # series without a pod
    pods: dict[PodKey, _PodSeries] = field(default_factory=dict)

    def per_pod(self, name: str) -> bool:
        if name not in _MAYBE_PER_POD or name not in self.device:
            return False
        return any(name in series.with_uid for series in self.pods.values())

    def device_value(self, name: str, pod: PodKey) -> float | None:
        """A device-wide quantity (FB_FREE, the GPU's total FB_USED, ...) for the memory denominator."""
        if name in self.device:
            return self.device[name]
        # Copies of a device value are identical on every sharing pod: the pod's own first, then any.
        own = self.pods[pod].values.get(name)
        if own is not None:
            return own
        return next((s.values[name] for s in self.pods.values() if s.values.get(name) is not None), None)

    def pod_value(self, name: str, pod: PodKey) -> float | None:
        """The pod's share of a utilisation or memory-used family, or None when it cannot be known."""
        series = self.pods[pod]
        if self.per_pod(name):
            return series.values.get(name)
        if len(self.pods) > 1:
            # A device value copied onto several pods belongs to none of them alone: counting it for
            # each would add the GPU up once per sharing pod.
            return None
        if name in series.values:
            return series.values[name]
        return self.device.get(name)


# GPU UUIDs are unique across a fleet (a MIG instance shares its parent's): a GPU's device-level series and
# the series of every pod on it carry the same one, so all of them can be fetched by it.
GPU_ID_LABELS = ("UUID", "uuid")  # `uuid` with --use-old-namespace


GpuKey = tuple[str, str, str]
"""(host, GPU, MIG instance): UUIDs are global; the host only keeps the index fallbacks of nodes apart."""


def _gpu_key(labels: Mapping[str, str]) -> GpuKey:
    identity, instance = dcgm_gpu(labels)
    return first_label(labels, _HOST_LABELS), identity, instance


@dataclass(frozen=True, slots=True)
class _LabelFacts:
    """What the readings need from one label set, worked out once per page (a GPU's label set repeats in
    every family it prints)."""

    gpu: GpuKey
    pod_uid: bool
    vgpu: bool
    target: PodKey | None  # target_pair(labels)


def _facts_by_label_set(samples: Sequence[Sample]) -> dict[int, _LabelFacts]:
    """Keyed by the label dict's id: the parser hands one dict to every sample of a page printing that
    label set (a page from Prometheus has one per sample: correct, just not shared). The samples keep
    their dicts alive while the result is used, so no id is reused meanwhile."""
    facts: dict[int, _LabelFacts] = {}
    for sample in samples:
        labels = sample.labels
        if id(labels) not in facts:
            facts[id(labels)] = _LabelFacts(
                _gpu_key(labels), bool(labels.get("pod_uid")), bool(labels.get("vgpu")), target_pair(labels)
            )
    return facts


def exporter_pods(samples: Sequence[Sample], facts: dict[int, _LabelFacts]) -> set[PodKey]:
    """The exporter's own pod, where it shows as the pod of a device-level series.

    Scraped through Prometheus with honorLabels true, the device-level series of a time-shared GPU gets
    the exporter pod's `namespace`/`pod` target labels, while the sharing pods' series keep their own.
    dcgm-exporter labels every per-pod series of such a family `pod_uid` and never labels the device's
    series `pod_uid` or `vgpu`: a series without either, whose GPU has `pod_uid`-labelled series of the
    same family, is the device's, and the pod it names is the scrape target's. (Copies of a device value
    never sit beside `pod_uid` series of their family, so a workload pod is never taken for it.)
    """
    with_uid: set[tuple[GpuKey, str]] = set()
    device_like: dict[tuple[GpuKey, str], set[PodKey]] = {}
    for sample in samples:
        if sample.name not in _MAYBE_PER_POD:
            continue
        fact = facts[id(sample.labels)]
        key = (fact.gpu, sample.name)
        if fact.pod_uid:
            with_uid.add(key)
        elif not fact.vgpu and fact.target is not None:
            device_like.setdefault(key, set()).add(fact.target)
    return {pair for key, pairs in device_like.items() if key in with_uid for pair in pairs}


_NO_FAMILIES: frozenset[str] = frozenset()  # shared: an empty frozenset is 216 bytes, one per pod adds up


@dataclass(frozen=True, slots=True)
class _GpuShape:
    """One GPU of a page: where its device-level values and each of its pods' values are poured."""

    gpu: str
    host: str
    mig: bool
    device: int  # the value table of its series without a pod
    pods: tuple[tuple[PodKey, int, frozenset[str]], ...]  # pod, its value table, families with pod_uid


@dataclass(frozen=True, slots=True)
class _PagePlan:
    """How a page's samples become readings, worked out from their names and label sets alone: which
    value table each sample is remembered in, and which GPU and pod each table is. Each reading gets
    value tables of its own."""

    slots: tuple[int, ...]  # per sample: the value table it is remembered in
    tables: int
    gpus: tuple[_GpuShape, ...]

    def readings(self, samples: Sequence[Sample]) -> list[GpuReading]:
        """The readings of `samples`, the page this plan was made for."""
        tables: list[dict[str, float | None]] = [{} for _ in range(self.tables)]
        for slot, sample in zip(self.slots, samples, strict=True):
            remember(tables[slot], sample.name, sample.value)
        result: list[GpuReading] = []
        for shape in self.gpus:
            gpu = _Gpu(
                shape.gpu,
                shape.host,
                shape.mig,
                tables[shape.device],
                {pod: _PodSeries(tables[table], with_uid) for pod, table, with_uid in shape.pods},
            )
            result.extend(_reading(gpu, pod) for pod, _, _ in shape.pods)
        return result


def _plan(samples: Sequence[Sample], resolver: PodResolver) -> _PagePlan:
    """The plan of one page's NVIDIA samples (see _PagePlan)."""
    facts = _facts_by_label_set(samples)
    resolver = resolver.with_targets(exporter_pods(samples, facts))
    # GPU → (its device table, pod → (its table, families whose series for it carried pod_uid))
    gpus: dict[GpuKey, tuple[int, dict[PodKey, tuple[int, set[str]]]]] = {}
    pods: dict[int, PodKey | None] = {}  # label dict id → its pod, as facts
    slots: list[int] = []
    tables = 0
    for sample in samples:
        labels = sample.labels
        fact = facts[id(labels)]
        gpu = gpus.get(fact.gpu)
        if gpu is None:
            gpu = gpus[fact.gpu] = (tables, {})
            tables += 1
        if id(labels) in pods:
            pod = pods[id(labels)]
        else:
            pod = pods[id(labels)] = resolver.pod_of(labels)
        if pod is None:
            slots.append(gpu[0])
            continue
        series = gpu[1].get(pod)
        if series is None:
            series = gpu[1][pod] = (tables, set())
            tables += 1
        slots.append(series[0])
        if fact.pod_uid:
            series[1].add(sample.name)
    shapes = []
    for (host, identity, instance), (device, by_pod) in gpus.items():
        pod_tables = tuple(
            (pod, table, frozenset(with_uid) if with_uid else _NO_FAMILIES)
            for pod, (table, with_uid) in by_pod.items()
        )
        shapes.append(_GpuShape(identity, host, bool(instance), device, pod_tables))
    return _PagePlan(tuple(slots), tables, tuple(shapes))


def readings(samples: Sequence[Sample], resolver: PodResolver) -> list[GpuReading]:
    return _plan(samples, resolver).readings(samples)


def _reading(gpu: _Gpu, pod: PodKey) -> GpuReading:
    engine = gpu.pod_value(GR_ENGINE_ACTIVE, pod)
    used = gpu.pod_value(FB_USED, pod)
    total = gpu.device_value(FB_TOTAL, pod)
    if total is None:
        # The whole GPU's memory, also for a time-sliced pod whose `used` is only its own share.
        device_used = gpu.device_value(FB_USED, pod) if gpu.per_pod(FB_USED) else used
        free = gpu.device_value(FB_FREE, pod)
        reserved = gpu.device_value(FB_RESERVED, pod) or 0.0
        if device_used is not None and free is not None:
            total = device_used + free + reserved
    return GpuReading(
        family=Family.NVIDIA,
        namespace=pod[0],
        pod=pod[1],
        gpu=gpu.gpu,
        host=gpu.host,
        utilization=clamp_percent(gpu.pod_value(GPU_UTIL, pod)),
        engine_active=clamp_percent(None if engine is None else engine * 100.0),
        mig=gpu.mig,
        memory=percent_of(used, total),
    )
