"""Vendor layer: one page's samples turned into per-pod, per-GPU readings (pure: no I/O, no clock)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from keda_gpu_scaler.exposition import Sample
from keda_gpu_scaler.vendors import ack, amd, nvidia
from keda_gpu_scaler.vendors._common import POD_LABELS, Family, GpuReading, NvidiaField, PodResolver

__all__ = [
    "POD_LABELS",
    "SAMPLE_NAMES",
    "VENDORS",
    "Family",
    "GpuReading",
    "NvidiaField",
    "ReadingsMemo",
    "Vendor",
    "readings_from_samples",
    "utilization_for",
]


class Plan(Protocol):
    """How one page's samples of a vendor become readings, worked out from the page's shape alone."""

    def fits(self, samples: Sequence[Sample], resolver: PodResolver) -> bool: ...

    def readings(self, samples: Sequence[Sample]) -> list[GpuReading]: ...


@dataclass(frozen=True, slots=True)
class Vendor:
    """A registry entry: the sample names one module reads and the function that reads them."""

    family: Family
    sample_names: frozenset[str]
    readings: Callable[[Sequence[Sample], PodResolver], list[GpuReading]]
    # Labels naming one GPU across a whole fleet, for vendors whose reading of a pod also needs the GPU's
    # other series (device-level ones, other pods sharing it). A source that fetches one namespace's
    # series (Prometheus) fetches the rest of those GPUs' series by these labels; () = not needed.
    gpu_id_labels: tuple[str, ...] = ()
    # Optional: the vendor's readings as a Plan, which a source keeps for its next page (ReadingsMemo).
    # Worth it where working out the page's structure is most of the reading (NVIDIA's pages).
    plan: Callable[[Sequence[Sample], PodResolver], Plan] | None = None


# Adding a vendor: a module with SAMPLE_NAMES and readings(), one line here (docs/ADDING_A_VENDOR.md).
VENDORS: tuple[Vendor, ...] = (
    Vendor(Family.ACK, ack.SAMPLE_NAMES, ack.readings),
    Vendor(Family.NVIDIA, nvidia.SAMPLE_NAMES, nvidia.readings, nvidia.GPU_ID_LABELS, nvidia.plan),
    Vendor(Family.AMD, amd.SAMPLE_NAMES, amd.readings),
)

SAMPLE_NAMES: frozenset[str] = frozenset(name for vendor in VENDORS for name in vendor.sample_names)

_FAMILY_ORDER = {family: index for index, family in enumerate(Family)}


# A plan is kept for pages of up to this many samples of its vendor (an 8-GPU node prints ~40, a node of
# time-shared GPUs a few hundred): a hostile page's 20,000 series are not kept alive for its next. At
# ~350 bytes per sample at most, a plan stays under 400 kB, as the parser's label memo (MAX_MEMO_SETS).
MAX_PLANNED_SAMPLES = 1024


class ReadingsMemo:
    """One source's plans of its last page, by vendor: its next page, printing the same series with
    new values, is read by pouring the values in (see nvidia.PagePlan). One memo per source."""

    __slots__ = ("plans",)

    def __init__(self) -> None:
        self.plans: dict[Family, Plan] = {}


def readings_from_samples(samples: Iterable[Sample], memo: ReadingsMemo | None = None) -> list[GpuReading]:
    """Every vendor's readings for one page; only GPUs attributed to a pod, sorted for stable output.

    A page may hold several families (an ACK exporter prints DCGM_FI_* too): all are returned, each
    labelled with its family; choosing one family per pod is the scaling code's job. memo: the source's
    plans of its last page, used where they fit and replaced where they do not.
    """
    # Page order is kept: where one series is printed twice, the last one wins (see _common.remember).
    page = [sample for sample in samples if sample.name in SAMPLE_NAMES]
    resolver = PodResolver(page)
    result: list[GpuReading] = []
    for vendor in VENDORS:
        mine = [sample for sample in page if sample.name in vendor.sample_names]
        if mine:
            result.extend(_vendor_readings(vendor, mine, resolver, memo))
        elif memo is not None:
            memo.plans.pop(vendor.family, None)
    result.sort(key=lambda r: (_FAMILY_ORDER[r.family], r.namespace, r.pod, r.host, r.gpu))
    return result


def _vendor_readings(
    vendor: Vendor, mine: list[Sample], resolver: PodResolver, memo: ReadingsMemo | None
) -> list[GpuReading]:
    """The vendor's readings of its samples: through the source's plan of its last page where one fits."""
    if memo is None or vendor.plan is None:
        return vendor.readings(mine, resolver)
    if len(mine) > MAX_PLANNED_SAMPLES:
        memo.plans.pop(vendor.family, None)
        return vendor.readings(mine, resolver)
    plan = memo.plans.get(vendor.family)
    if plan is None or not plan.fits(mine, resolver):
        plan = memo.plans[vendor.family] = vendor.plan(mine, resolver)
    return plan.readings(mine)


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
