"""Without Kubernetes, pods last seen on a failing exporter count as missing target pods (SPEC §4), but
only for a trigger that read them: a `vendor: amd` trigger never read the pods of an NVIDIA exporter, and
when that exporter failed it counted them missing at its threshold (30 became 100, and an idle AMD pool's
activity unknown)."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.collect.snapshot import Snapshots
from keda_gpu_scaler.collect.store import Page, Store
from keda_gpu_scaler.core.decide import Decision, decide
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.pages.vendors import Family, GpuReading

AMD = parse_trigger({"threshold": "70", "podNamePrefix": "vllm-", "vendor": "amd"})


def reading(family: Family, pod: str, value: float) -> GpuReading:
    return GpuReading(family, "llm", pod, "GPU-0", pod + "-node", value, None, False, None)


def after_the_nvidia_exporter_failed(amd_value: float, spec=AMD) -> Decision:  # type: ignore[no-untyped-def]
    store = Store()
    store.record_page(
        Page.from_readings("http://amd/metrics", 0, [reading(Family.AMD, "vllm-amd-0", amd_value)])
    )
    store.record_page(Page.from_readings("http://nv/metrics", 0, [reading(Family.NVIDIA, "vllm-nv-0", 90)]))
    store.record_page(
        Page.from_readings("http://amd/metrics", 20, [reading(Family.AMD, "vllm-amd-0", amd_value)])
    )
    store.record_failure("http://nv/metrics", "HTTP 500")
    return decide(spec, Snapshots(store=store, max_staleness=15, clock=lambda: 21.0).take("llm", "so", spec))


def test_a_failing_exporter_of_another_vendor_changes_nothing() -> None:
    decision = after_the_nvidia_exporter_failed(30)
    assert decision.evaluation is not None and decision.evaluation.value == pytest.approx(30)
    idle = after_the_nvidia_exporter_failed(0).evaluation
    assert idle is not None and idle.activity_unknown is None and idle.active is False


def test_a_pod_of_the_triggers_own_vendor_on_a_failing_exporter_still_counts_missing() -> None:
    every_vendor = parse_trigger({"threshold": "70", "podNamePrefix": "vllm-"})
    decision = after_the_nvidia_exporter_failed(30, every_vendor)
    assert decision.evaluation is not None and decision.evaluation.value == pytest.approx(30 + 70)
    assert decision.evaluation.missing_pods == ("vllm-nv-0",)
