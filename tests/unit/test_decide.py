"""decide(): a trigger's value from a snapshot alone, with no store, clock or log behind it."""

from __future__ import annotations

import logging

from keda_gpu_scaler.core.decide import decide
from keda_gpu_scaler.core.errors import NoData
from keda_gpu_scaler.core.snapshot import NamespaceView, Snapshot, SourceKind, Targets
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.pages.vendors import Family, GpuReading

SPEC = parse_trigger({"threshold": "70", "podNamePrefix": "vllm-"})


def gpu(pod: str, value: float) -> GpuReading:
    return GpuReading(Family.NVIDIA, "llm", pod, "GPU-0", "node", value, None, False, None)


def test_a_snapshot_of_fresh_pods_decides_their_sum() -> None:
    readings = (gpu("vllm-0", 40.0), gpu("vllm-1", 30.0))
    view = NamespaceView(readings, ("http://node/metrics",), 1)
    snapshot = Snapshot(
        "llm", 0.0, SourceKind.SCRAPE, None, view, readings, (), frozenset({"vllm-0", "vllm-1"})
    )
    decision = decide(SPEC, snapshot)
    assert decision.error is None and decision.evaluation is not None
    assert decision.evaluation.value == 70.0 and decision.evaluation.active


def test_a_prefix_matching_no_pod_is_zero_with_a_note_to_log_once() -> None:
    readings = (gpu("other-0", 40.0),)
    view = NamespaceView(readings, ("http://node/metrics",), 1)
    decision = decide(SPEC, Snapshot("llm", 0.0, SourceKind.SCRAPE, None, view))
    assert decision.evaluation is not None and decision.evaluation.value == 0.0
    assert decision.to_log == [(decision.notes[0], logging.INFO)] and "other-0" in decision.notes[0]


def test_a_target_with_only_starting_pods_is_unavailable_never_zero() -> None:
    targets = Targets(frozenset(), starting=frozenset({"vllm-0"}))
    decision = decide(SPEC, Snapshot("llm", 0.0, SourceKind.SCRAPE, targets))
    assert isinstance(decision.error, NoData) and decision.evaluation is None
