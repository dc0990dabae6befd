"""NVIDIA dcgm-exporter pages (and the DCGM_FI_* families of ACK's exporter) turned into per-pod readings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from keda_gpu_scaler.pages.exposition import Sample
from keda_gpu_scaler.pages.vendors._common import (
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
    with_uid: set[str] = field(default_factory=set)  # families whose series for this pod carried pod_uid


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


def readings(samples: Sequence[Sample], resolver: PodResolver) -> list[GpuReading]:
    """One reading per pod on each GPU of a page's NVIDIA samples, GPUs and pods in the page's order."""
    facts = _facts_by_label_set(samples)
    resolver = resolver.with_targets(exporter_pods(samples, facts))
    gpus: dict[GpuKey, _Gpu] = {}
    pods: dict[int, PodKey | None] = {}  # label dict id → its pod: a label set repeats in every family
    for sample in samples:
        labels = sample.labels
        fact = facts[id(labels)]
        gpu = gpus.get(fact.gpu)
        if gpu is None:
            host, identity, instance = fact.gpu
            gpu = gpus[fact.gpu] = _Gpu(identity, host, bool(instance))
        if id(labels) in pods:
            pod = pods[id(labels)]
        else:
            pod = pods[id(labels)] = resolver.pod_of(labels)
        if pod is None:
            remember(gpu.device, sample.name, sample.value)
            continue
        series = gpu.pods.get(pod)
        if series is None:
            series = gpu.pods[pod] = _PodSeries()
        remember(series.values, sample.name, sample.value)
        if fact.pod_uid:
            series.with_uid.add(sample.name)
    return [_reading(gpu, pod) for gpu in gpus.values() for pod in gpu.pods]


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
