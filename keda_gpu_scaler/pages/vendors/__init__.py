"""Vendor layer: one page's samples turned into per-pod, per-GPU readings (pure: no I/O, no clock).

Each exporter's page format is a row of data in formats.py; this reads a page with every row.
"""

from __future__ import annotations

from collections.abc import Iterable

from keda_gpu_scaler.pages.exposition import Sample
from keda_gpu_scaler.pages.vendors._common import POD_LABELS, Family, GpuReading, NvidiaField, PodResolver
from keda_gpu_scaler.pages.vendors.formats import VENDORS, Vendor

__all__ = [
    "POD_LABELS",
    "SAMPLE_NAMES",
    "VENDORS",
    "Family",
    "GpuReading",
    "NvidiaField",
    "PodResolver",
    "Vendor",
    "readings_from_samples",
    "utilization_for",
]


SAMPLE_NAMES: frozenset[str] = frozenset(name for vendor in VENDORS for name in vendor.sample_names)

_FAMILY_ORDER = {family: index for index, family in enumerate(Family)}


def readings_from_samples(samples: Iterable[Sample], *, through_prometheus: bool = False) -> list[GpuReading]:
    """Every vendor's readings for one page; only GPUs attributed to a pod, sorted for stable output.

    A page may hold several families (an ACK exporter prints DCGM_FI_* too): all are returned, each
    labelled with its family; choosing one family per pod is the scaling code's job. `through_prometheus`:
    the series as Prometheus stores them, with the exporter's own pod as target labels (PodResolver).
    """
    # Page order is kept: where one series is printed twice, the last one wins (see _common.remember).
    page = [sample for sample in samples if sample.name in SAMPLE_NAMES]
    resolver = PodResolver(page, through_prometheus=through_prometheus)
    result: list[GpuReading] = []
    for vendor in VENDORS:
        mine = [sample for sample in page if sample.name in vendor.sample_names]
        if mine:
            result.extend(vendor.readings(mine, resolver))
    result.sort(key=lambda r: (_FAMILY_ORDER[r.family], r.namespace, r.pod, r.host, r.gpu))
    return result


def utilization_for(reading: GpuReading, field: NvidiaField) -> float | None:
    """The utilisation a trigger's `nvidiaField` selects (SPEC §3); other families ignore the field."""
    if reading.family is not Family.NVIDIA or field is NvidiaField.GPU_UTIL:
        return reading.utilization
    if field is NvidiaField.GR_ENGINE_ACTIVE:
        return reading.engine_active
    # AUTO: a MIG instance's GPU_UTIL is absent or reads 0 whatever the load (dcgm-exporter #216, #105).
    if reading.mig and not reading.utilization:
        return reading.engine_active
    if reading.utilization is not None:
        return reading.utilization
    return reading.engine_active
