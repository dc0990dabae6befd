"""Alibaba ACK GPU exporter's per-process families (shared GPUs) turned into per-pod readings."""

from __future__ import annotations

from collections.abc import Sequence
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
)

PROCESS_SM_UTIL = "DCGM_CUSTOM_PROCESS_SM_UTIL"  # %, one container process on one GPU
PROCESS_MEM_USED = "DCGM_CUSTOM_PROCESS_MEM_USED"  # MiB, one container process on one GPU
CONTAINER_MEM_ALLOCATED = "DCGM_CUSTOM_CONTAINER_MEM_ALLOCATED"  # MiB granted to one container on one GPU

# The DCGM_FI_* families an ACK exporter also prints are read by the nvidia module; the scaling code
# prefers these ACK readings for a pod that has them (Family order) and never adds the two.
SAMPLE_NAMES = frozenset({PROCESS_SM_UTIL, PROCESS_MEM_USED, CONTAINER_MEM_ALLOCATED})

_HOST_LABELS = ("NodeName", "Hostname", "hostname")


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


def readings(samples: Sequence[Sample], resolver: PodResolver) -> list[GpuReading]:
    entries: dict[tuple[PodKey, str, str, str], _PodOnGpu] = {}
    for sample in samples:
        labels = sample.labels
        pod = resolver.pod_of(labels)
        if pod is None:
            continue
        host = first_label(labels, _HOST_LABELS)
        identity, instance = dcgm_gpu(labels)
        key = (pod, host, identity, instance)
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = _PodOnGpu(gpu=identity, host=host, mig=bool(instance))
        if sample.name == CONTAINER_MEM_ALLOCATED:
            remember(entry.allocated, labels.get("ContainerName", ""), sample.value)
        else:
            remember(entry.processes.setdefault(_process_key(labels), {}), sample.name, sample.value)

    result: list[GpuReading] = []
    for (pod, _, _, _), entry in entries.items():
        result.append(
            GpuReading(
                family=Family.ACK,
                namespace=pod[0],
                pod=pod[1],
                gpu=entry.gpu,
                host=entry.host,
                # Summed, not averaged as ACK's own adapter rule does: the pod's processes share the GPU,
                # so their SM utilisations add up to the pod's, and an average undercounts a pod that
                # runs several processes.
                utilization=clamp_percent(_sum(entry, PROCESS_SM_UTIL)),
                engine_active=None,
                mig=entry.mig,
                memory=percent_of(_sum(entry, PROCESS_MEM_USED), _allocated(entry)),
            )
        )
    return result


def _sum(entry: _PodOnGpu, name: str) -> float | None:
    """Σ over the pod's processes on the GPU; 0 for a pod that holds GPU memory but runs no process."""
    if not entry.processes:
        return 0.0
    values = [process[name] for process in entry.processes.values() if name in process]
    finite = [value for value in values if value is not None]
    return sum(finite) if finite else None


def _allocated(entry: _PodOnGpu) -> float | None:
    finite = [value for value in entry.allocated.values() if value is not None]
    return sum(finite) if finite else None
