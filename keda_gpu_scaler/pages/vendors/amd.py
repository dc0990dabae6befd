"""AMD device-metrics-exporter pages (`amd_` prefix or not) turned into per-pod readings."""

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
    first_label,
    percent_of,
    remember,
)

GFX_ACTIVITY = "gpu_gfx_activity"  # %, graphics engine busy
USED_VRAM = "gpu_used_vram"  # MB
TOTAL_VRAM = "gpu_total_vram"  # MB
FREE_VRAM = "gpu_free_vram"  # MB; the total when gpu_total_vram is missing

PREFIX = "amd_"  # added by the AMD GPU Operator Helm chart's default config
_NAMES = (GFX_ACTIVITY, USED_VRAM, TOTAL_VRAM, FREE_VRAM)
SAMPLE_NAMES = frozenset(_NAMES) | frozenset(PREFIX + name for name in _NAMES)


@dataclass(slots=True)
class _Gpu:
    gpu: str
    host: str
    pods: dict[PodKey, dict[str, float | None]] = field(default_factory=dict)


def readings(samples: Sequence[Sample], resolver: PodResolver) -> list[GpuReading]:
    gpus: dict[tuple[str, str], _Gpu] = {}
    for sample in samples:
        labels = sample.labels
        # Mandatory labels are always printed, empty when unknown: `pod=""` is a GPU with no pod.
        pod = resolver.pod_of(labels)
        if pod is None:
            continue
        host = labels.get("hostname", "")
        # gpu_id is unique on its exporter (one per partition on partitioned GPUs); serial and UUID are
        # fallbacks for pages that lost it.
        identity = first_label(labels, ("gpu_id", "gpu_uuid", "serial_number"))
        gpu = gpus.get((host, identity))
        if gpu is None:
            gpu = gpus[(host, identity)] = _Gpu(gpu=identity, host=host)
        name = sample.name.removeprefix(PREFIX)
        remember(gpu.pods.setdefault(pod, {}), name, sample.value)

    result: list[GpuReading] = []
    for gpu in gpus.values():
        # The exporter gives a GPU to one pod at most; two pods on one GPU (a pod gone and its successor
        # in one Prometheus window) would each carry the whole device, so neither value is attributed.
        shared = len(gpu.pods) > 1
        for pod, values in gpu.pods.items():
            used = values.get(USED_VRAM)
            total = values.get(TOTAL_VRAM)
            free = values.get(FREE_VRAM)
            if total is None and used is not None and free is not None:
                total = used + free
            result.append(
                GpuReading(
                    family=Family.AMD,
                    namespace=pod[0],
                    pod=pod[1],
                    gpu=gpu.gpu,
                    host=gpu.host,
                    utilization=None if shared else clamp_percent(values.get(GFX_ACTIVITY)),
                    engine_active=None,
                    mig=False,
                    memory=None if shared else percent_of(used, total),
                )
            )
    return result
