"""The GPU exporters' page formats as data (one Vendor row each) and their readers.

A row names the families an exporter prints (utilisation, engine activity, memory) and how its pages are
spelt. Each exporter keeps its own reader, because each attributes a GPU to pods in its own way: ACK
prints one series per container process (summed per pod), AMD gives a GPU to one pod at most, and
dcgm-exporter copies device values onto the pods sharing a GPU except for the fields it measures per
process (see _Gpu).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
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

Reader = Callable[["Vendor", Sequence[Sample], PodResolver], list[GpuReading]]


@dataclass(frozen=True, slots=True, eq=False)
class Vendor:
    """One exporter's page format: the families it prints (units in the rows' comments) and its reader."""

    family: Family
    read: Reader
    utilization: str  # %
    memory_used: str
    memory_total: str = ""
    memory_free: str = ""
    memory_reserved: str = ""
    engine_active: str = ""  # ratio 0–1
    host_labels: tuple[str, ...] = ()  # most trusted first
    prefix: str = ""  # an optional prefix of every family name
    # Labels naming one GPU across a whole fleet, for vendors whose reading of a pod also needs the GPU's
    # other series (device-level ones, other pods sharing it). A source that fetches one namespace's
    # series (Prometheus) fetches the rest of those GPUs' series by these labels; () = not needed.
    gpu_id_labels: tuple[str, ...] = ()
    sample_names: frozenset[str] = field(init=False)  # every name it reads, in every spelling

    def __post_init__(self) -> None:
        names = {self.utilization, self.memory_used, self.memory_total, self.memory_free}
        names |= {self.memory_reserved, self.engine_active}
        names.discard("")
        spelt = names | {self.prefix + name for name in names}
        object.__setattr__(self, "sample_names", frozenset(spelt))

    def readings(self, samples: Sequence[Sample], resolver: PodResolver) -> list[GpuReading]:
        """One reading per (pod, GPU) of a page's samples of this vendor."""
        return self.read(self, samples, resolver)


# --- Alibaba ACK's exporter: per-process families of shared GPUs --------------------------------------


@dataclass(slots=True)
class _PodOnGpu:
    gpu: str
    host: str
    mig: bool
    processes: dict[tuple[str, ...], dict[str, float | None]] = field(default_factory=dict)
    allocated: dict[str, float | None] = field(default_factory=dict)  # by container


def _process_key(labels: dict[str, str]) -> tuple[str, ...]:
    # One process printed twice (two scrape jobs behind one Prometheus) must not count twice, so a
    # process is its id in its container; without an id, the whole label set is all there is.
    pid = labels.get("ProcessId")
    if pid:
        return (labels.get("ContainerName", ""), pid)
    return tuple(sorted(f"{k}={v}" for k, v in labels.items()))


def _on_pods(
    vendor: Vendor, samples: Sequence[Sample], resolver: PodResolver
) -> Iterator[tuple[Sample, PodKey, str]]:
    """Each sample that names a pod, with that pod and the host it was printed on."""
    for sample in samples:
        pod = resolver.pod_of(sample.labels)
        if pod is not None:
            yield sample, pod, first_label(sample.labels, vendor.host_labels)


def _ack_readings(vendor: Vendor, samples: Sequence[Sample], resolver: PodResolver) -> list[GpuReading]:
    entries: dict[tuple[PodKey, str, str, str], _PodOnGpu] = {}
    for sample, pod, host in _on_pods(vendor, samples, resolver):
        labels = sample.labels
        identity, instance = dcgm_gpu(labels)
        key = (pod, host, identity, instance)
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = _PodOnGpu(gpu=identity, host=host, mig=bool(instance))
        if sample.name == vendor.memory_total:
            remember(entry.allocated, labels.get("ContainerName", ""), sample.value)
        else:
            remember(entry.processes.setdefault(_process_key(labels), {}), sample.name, sample.value)

    result: list[GpuReading] = []
    for (pod, _, _, _), entry in entries.items():
        result.append(
            GpuReading(
                family=vendor.family,
                namespace=pod[0],
                pod=pod[1],
                gpu=entry.gpu,
                host=entry.host,
                # Summed, not averaged as ACK's own adapter rule does: the pod's processes share the GPU,
                # so their SM utilisations add up to the pod's, and an average undercounts a pod that
                # runs several processes.
                utilization=clamp_percent(_process_sum(entry, vendor.utilization)),
                engine_active=None,
                mig=entry.mig,
                memory=percent_of(_process_sum(entry, vendor.memory_used), _ack_allocated(entry)),
            )
        )
    return result


def _process_sum(entry: _PodOnGpu, name: str) -> float | None:
    """Σ over the pod's processes on the GPU; 0 for a pod that holds GPU memory but runs no process."""
    if not entry.processes:
        return 0.0
    values = [process[name] for process in entry.processes.values() if name in process]
    finite = [value for value in values if value is not None]
    return sum(finite) if finite else None


def _ack_allocated(entry: _PodOnGpu) -> float | None:
    finite = [value for value in entry.allocated.values() if value is not None]
    return sum(finite) if finite else None


# The DCGM_FI_* families an ACK exporter also prints are read by the NVIDIA row; the scaling code prefers
# these readings for a pod that has them (Family order) and never adds the two.
ACK = Vendor(
    Family.ACK,
    _ack_readings,
    utilization="DCGM_CUSTOM_PROCESS_SM_UTIL",  # %, one container process on one GPU
    memory_used="DCGM_CUSTOM_PROCESS_MEM_USED",  # MiB, one container process on one GPU
    memory_total="DCGM_CUSTOM_CONTAINER_MEM_ALLOCATED",  # MiB granted to one container on one GPU
    host_labels=("NodeName", "Hostname", "hostname"),
)


# --- NVIDIA dcgm-exporter (and the DCGM_FI_* families of ACK's exporter) -------------------------------


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
# carrying `pod_uid`. That is the test below (_NvidiaGpu.per_pod), made per family so the GR_ENGINE_ACTIVE
# revision works too.
# The per-pod value is keyed by pod UID but printed once per container (and per vgpu replica) of the
# pod, so a pod's several series for one GPU are one value, never added.
@dataclass(slots=True)
class _NvidiaPodSeries:
    values: dict[str, float | None] = field(default_factory=dict)
    with_uid: set[str] = field(default_factory=set)  # families whose series for this pod carried pod_uid


@dataclass(slots=True)
class _NvidiaGpu:
    gpu: str
    host: str
    mig: bool
    device: dict[str, float | None] = field(default_factory=dict)  # series without a pod
    pods: dict[PodKey, _NvidiaPodSeries] = field(default_factory=dict)

    def per_pod(self, name: str) -> bool:
        """Whether the pods' series of `name` (one of NVIDIA.per_process) are their own values."""
        if name not in self.device:
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


GpuKey = tuple[str, str, str]
"""(host, GPU, MIG instance): UUIDs are global; the host only keeps the index fallbacks of nodes apart."""


def _gpu_key(labels: Mapping[str, str], host_labels: tuple[str, ...]) -> GpuKey:
    identity, instance = dcgm_gpu(labels)
    return first_label(labels, host_labels), identity, instance


@dataclass(frozen=True, slots=True)
class _LabelFacts:
    """What the readings need from one label set, worked out once per page (a GPU's label set repeats in
    every family it prints)."""

    gpu: GpuKey
    pod_uid: bool
    vgpu: bool
    target: PodKey | None  # target_pair(labels)


def _facts_by_label_set(vendor: Vendor, samples: Sequence[Sample]) -> dict[int, _LabelFacts]:
    """Keyed by the label dict's id: the parser hands one dict to every sample of a page printing that
    label set (a page from Prometheus has one per sample: correct, just not shared). The samples keep
    their dicts alive while the result is used, so no id is reused meanwhile."""
    facts: dict[int, _LabelFacts] = {}
    for sample in samples:
        labels = sample.labels
        if id(labels) not in facts:
            facts[id(labels)] = _LabelFacts(
                _gpu_key(labels, vendor.host_labels),
                bool(labels.get("pod_uid")),
                bool(labels.get("vgpu")),
                target_pair(labels),
            )
    return facts


def _exporter_pods(vendor: Vendor, samples: Sequence[Sample], facts: dict[int, _LabelFacts]) -> set[PodKey]:
    """The exporter's own pod, where it shows as the pod of a device-level series.

    Scraped through Prometheus with honorLabels true, the device-level series of a time-shared GPU gets
    the exporter pod's `namespace`/`pod` target labels, while the sharing pods' series keep their own.
    dcgm-exporter labels every per-pod series of such a family `pod_uid` and never labels the device's
    series `pod_uid` or `vgpu`: a series without either, whose GPU has `pod_uid`-labelled series of the
    same family, is the device's, and the pod it names is the scrape target's. (Copies of a device value
    never sit beside `pod_uid` series of their family, so a workload pod is never taken for it.)
    """
    per_process = (vendor.utilization, vendor.engine_active, vendor.memory_used)
    with_uid: set[tuple[GpuKey, str]] = set()
    device_like: dict[tuple[GpuKey, str], set[PodKey]] = {}
    for sample in samples:
        if sample.name not in per_process:
            continue
        fact = facts[id(sample.labels)]
        key = (fact.gpu, sample.name)
        if fact.pod_uid:
            with_uid.add(key)
        elif not fact.vgpu and fact.target is not None:
            device_like.setdefault(key, set()).add(fact.target)
    return {pair for key, pairs in device_like.items() if key in with_uid for pair in pairs}


def _nvidia_readings(vendor: Vendor, samples: Sequence[Sample], resolver: PodResolver) -> list[GpuReading]:
    """One reading per pod on each GPU of a page's NVIDIA samples, GPUs and pods in the page's order."""
    facts = _facts_by_label_set(vendor, samples)
    resolver = resolver.with_targets(_exporter_pods(vendor, samples, facts))
    gpus: dict[GpuKey, _NvidiaGpu] = {}
    pods: dict[int, PodKey | None] = {}  # label dict id → its pod: a label set repeats in every family
    for sample in samples:
        labels = sample.labels
        fact = facts[id(labels)]
        gpu = gpus.get(fact.gpu)
        if gpu is None:
            host, identity, instance = fact.gpu
            gpu = gpus[fact.gpu] = _NvidiaGpu(identity, host, bool(instance))
        if id(labels) in pods:
            pod = pods[id(labels)]
        else:
            pod = pods[id(labels)] = resolver.pod_of(labels)
        if pod is None:
            remember(gpu.device, sample.name, sample.value)
            continue
        series = gpu.pods.get(pod)
        if series is None:
            series = gpu.pods[pod] = _NvidiaPodSeries()
        remember(series.values, sample.name, sample.value)
        if fact.pod_uid:
            series.with_uid.add(sample.name)
    return [_nvidia_reading(vendor, gpu, pod) for gpu in gpus.values() for pod in gpu.pods]


def _nvidia_reading(vendor: Vendor, gpu: _NvidiaGpu, pod: PodKey) -> GpuReading:
    engine = gpu.pod_value(vendor.engine_active, pod)
    used = gpu.pod_value(vendor.memory_used, pod)
    total = gpu.device_value(vendor.memory_total, pod)
    if total is None:
        # The whole GPU's memory, also for a time-sliced pod whose `used` is only its own share.
        device_used = gpu.device_value(vendor.memory_used, pod) if gpu.per_pod(vendor.memory_used) else used
        free = gpu.device_value(vendor.memory_free, pod)
        reserved = gpu.device_value(vendor.memory_reserved, pod) or 0.0
        if device_used is not None and free is not None:
            total = device_used + free + reserved
    return GpuReading(
        family=Family.NVIDIA,
        namespace=pod[0],
        pod=pod[1],
        gpu=gpu.gpu,
        host=gpu.host,
        utilization=clamp_percent(gpu.pod_value(vendor.utilization, pod)),
        engine_active=clamp_percent(None if engine is None else engine * 100.0),
        mig=gpu.mig,
        memory=percent_of(used, total),
    )


NVIDIA = Vendor(
    Family.NVIDIA,
    _nvidia_readings,
    utilization="DCGM_FI_DEV_GPU_UTIL",  # %, integer duty cycle
    engine_active="DCGM_FI_PROF_GR_ENGINE_ACTIVE",  # ratio 0-1
    memory_used="DCGM_FI_DEV_FB_USED",  # MiB
    memory_free="DCGM_FI_DEV_FB_FREE",  # MiB
    memory_reserved="DCGM_FI_DEV_FB_RESERVED",  # MiB, since 4.3.1-4.4.0
    memory_total="DCGM_FI_DEV_FB_TOTAL",  # MiB, not exported by default; ACK prints it
    host_labels=("Hostname", "hostname", "NodeName"),  # `hostname` after dcgm-exporter #655; ACK NodeName
    # GPU UUIDs are unique across a fleet (a MIG instance shares its parent's): a GPU's device-level
    # series and the series of every pod on it carry the same one (`uuid` with --use-old-namespace).
    gpu_id_labels=("UUID", "uuid"),
)


# --- AMD device-metrics-exporter ------------------------------------------------------------------------


@dataclass(slots=True)
class _AmdGpu:
    gpu: str
    host: str
    pods: dict[PodKey, dict[str, float | None]] = field(default_factory=dict)


def _amd_readings(vendor: Vendor, samples: Sequence[Sample], resolver: PodResolver) -> list[GpuReading]:
    gpus: dict[tuple[str, str], _AmdGpu] = {}
    # Mandatory labels are always printed, empty when unknown: `pod=""` is a GPU with no pod.
    for sample, pod, host in _on_pods(vendor, samples, resolver):
        labels = sample.labels
        # gpu_id is unique on its exporter (one per partition on partitioned GPUs); serial and UUID are
        # fallbacks for pages that lost it.
        identity = first_label(labels, ("gpu_id", "gpu_uuid", "serial_number"))
        gpu = gpus.get((host, identity))
        if gpu is None:
            gpu = gpus[(host, identity)] = _AmdGpu(gpu=identity, host=host)
        name = sample.name.removeprefix(vendor.prefix)
        remember(gpu.pods.setdefault(pod, {}), name, sample.value)

    result: list[GpuReading] = []
    for gpu in gpus.values():
        # The exporter gives a GPU to one pod at most; two pods on one GPU (a pod gone and its successor
        # in one Prometheus window) would each carry the whole device, so neither value is attributed.
        shared = len(gpu.pods) > 1
        for pod, values in gpu.pods.items():
            used = values.get(vendor.memory_used)
            total = values.get(vendor.memory_total)
            free = values.get(vendor.memory_free)
            if total is None and used is not None and free is not None:
                total = used + free
            utilization = None if shared else clamp_percent(values.get(vendor.utilization))
            memory = None if shared else percent_of(used, total)
            result.append(
                GpuReading(vendor.family, *pod, gpu.gpu, gpu.host, utilization, None, False, memory)
            )
    return result


AMD = Vendor(
    Family.AMD,
    _amd_readings,
    utilization="gpu_gfx_activity",  # %, graphics engine busy
    memory_used="gpu_used_vram",  # MB
    memory_total="gpu_total_vram",  # MB
    memory_free="gpu_free_vram",  # MB; the total when gpu_total_vram is missing
    host_labels=("hostname",),
    prefix="amd_",  # added by the AMD GPU Operator Helm chart's default config
)

# Adding a vendor: a row above and its place here, in Family order (docs/ADDING_A_VENDOR.md).
VENDORS: tuple[Vendor, ...] = (ACK, NVIDIA, AMD)
