"""The replica arithmetic: pod values, aggregation, missing pods, quorum, activation, HPA what-if."""

from __future__ import annotations

import gc
import math

import pytest

from keda_gpu_scaler.core.decide import aggregation_for
from keda_gpu_scaler.core.errors import NoData
from keda_gpu_scaler.core.scaling import (
    GpuValue,
    PodValue,
    Rule,
    desired_replicas_average_value,
    desired_replicas_value,
    evaluate,
    pod_row,
    pod_values,
)
from keda_gpu_scaler.core.trigger import Aggregation
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.pages.vendors import Family, GpuReading


def reading(
    pod: str,
    value: float,
    *,
    gpu: str = "GPU-0",
    family: Family = Family.NVIDIA,
    memory: float | None = None,
    engine: float | None = None,
    mig: bool = False,
    util_present: bool = True,
) -> GpuReading:
    return GpuReading(
        family=family,
        namespace="llm",
        pod=pod,
        gpu=gpu,
        host="node-a",
        utilization=value if util_present else None,
        engine_active=engine,
        mig=mig,
        memory=memory,
    )


def spec(**metadata: str):  # type: ignore[no-untyped-def]
    return parse_trigger({"threshold": "70", "podNamePrefix": "p-"} | metadata)


def run(  # type: ignore[no-untyped-def]
    readings: list[GpuReading], missing: tuple[str, ...] = (), starting: tuple[str, ...] = (), **metadata: str
):
    s = spec(**metadata)
    return evaluate(pod_values(readings, s), missing, s, aggregation_for(s, None)[0], starting)


def test_four_pods_at_90_sum_to_360_and_hpa_wants_6() -> None:
    result = run([reading(f"p-{i}", 90) for i in range(4)])
    assert result.value == 360
    assert result.what_if.current_replicas == 4
    assert result.what_if.average_value == 6
    assert result.active


def test_averaging_trap_from_the_tutorials() -> None:
    # The same four pods averaged: AverageValue would scale 4 → 2 (README, "The arithmetic").
    result = run([reading(f"p-{i}", 90) for i in range(4)], aggregation="mean")
    assert result.value == 90
    assert result.what_if.average_value == 2
    assert result.what_if.value == 6  # mean is right only for metricType Value


@pytest.mark.parametrize(("gpu_aggregation", "expected"), [("mean", 75.0), ("max", 90.0)])
def test_one_pod_four_gpus(gpu_aggregation: str, expected: float) -> None:
    gpus = [reading("p-0", v, gpu=f"GPU-{i}") for i, v in enumerate([90, 80, 70, 60])]
    result = run(gpus, gpuAggregation=gpu_aggregation)
    assert result.value == expected
    assert [g.value for g in result.pods[0].gpus] == [90, 80, 70, 60]


def test_pod_gpus_collapse_before_summing() -> None:
    # Summing GPUs instead of pods would count this pod 4 times (360 → 6 replicas); one pod at 90 → 2.
    result = run([reading("p-0", 90, gpu=f"GPU-{i}") for i in range(4)])
    assert result.value == 90
    assert result.what_if.average_value == 2


def test_ack_family_preferred_over_dcgm_series_of_the_same_pod() -> None:
    readings = [reading("p-0", 40, family=Family.ACK), reading("p-0", 95, family=Family.NVIDIA)]
    result = run(readings)
    assert result.value == 40
    assert result.pods[0].family is Family.ACK


def test_a_pod_with_ack_series_without_the_metric_s_value_is_missing_never_read_from_dcgm() -> None:
    # Its ACK series carry no memory (no CONTAINER_MEM_ALLOCATED): the device-level DCGM_FI_* series are
    # the whole shared GPU, every sharing pod's, so the pod has no value rather than another family's.
    readings = [
        reading("p-0", 40, family=Family.ACK),
        reading("p-0", 95, family=Family.NVIDIA, memory=90.0),
        reading("p-1", 20, family=Family.ACK, memory=30.0),
        reading("p-1", 95, family=Family.NVIDIA, memory=90.0),
    ]
    values = pod_values(readings, spec(metric="memory"))
    assert {pod: (row[1], row[2]) for pod, row in values.items()} == {"p-1": ("ack", 30.0)}
    result = run(readings, missing=("p-0",), metric="memory")
    assert result.missing_pods == ("p-0",) and result.value == pytest.approx(30.0 + 70.0)


def test_vendor_filter() -> None:
    readings = [reading("p-0", 40, family=Family.AMD), reading("p-1", 95, family=Family.NVIDIA)]
    assert run(readings, vendor="amd").value == 40
    assert run(readings, vendor="nvidia").value == 95
    assert run(readings).value == 135


def test_memory_metric() -> None:
    readings = [reading("p-0", 10, memory=91.0), reading("p-1", 10, memory=89.0)]
    assert run(readings, metric="memory").value == pytest.approx(180.0)


def test_mig_uses_engine_active_under_auto() -> None:
    readings = [reading("p-0", 0, engine=41.238, mig=True)]
    assert run(readings).value == pytest.approx(41.238)
    assert run(readings, nvidiaField="gpu_util").value == 0


def test_pods_without_value_for_the_metric_are_not_reporting() -> None:
    assert pod_values([reading("p-0", 50, memory=None)], spec(metric="memory")) == {}


def test_missing_pod_counts_as_threshold_when_the_fresh_pods_are_at_or_under_target() -> None:
    # u = 100 / (2 × 70) ≤ 1: S + M × T = 100 + 70, so a gap in data never scales down.
    result = run([reading("p-0", 50), reading("p-1", 50)], missing=("p-2",))
    assert result.missing_pods == ("p-2",)
    assert result.missing_pod_value == 70
    assert result.value == 170
    assert result.rule == Rule.HOLD


def test_over_target_the_missing_pods_count_zero_with_the_current_count_as_floor() -> None:
    # u = 200 / 140 > 1: max(S, N × T) = max(200, 3 × 70) = 210 → 3 replicas: never fewer than exist.
    result = run([reading("p-0", 100), reading("p-1", 100)], missing=("p-2",))
    assert result.missing_pod_value == 0
    assert result.value == 210
    assert result.rule == Rule.SCALE_UP
    # u = 300 / 210 > 1: max(300, 4 × 70 = 280) = 300 (the fresh pods' own load is above the floor).
    result = run([reading(f"p-{i}", 100) for i in range(3)], missing=("p-3",))
    assert result.value == 300


def test_the_hpas_own_rule_asks_for_13_replicas_where_the_old_fill_asked_for_19() -> None:
    # SPEC §4's worked example: 7 fresh pods holding 650, 6 missing, target 50.
    s = parse_trigger({"threshold": "50", "podNamePrefix": "p-", "metric": "requests"})
    fresh = {f"p-{i}": pod_row(f"p-{i}", "vllm", 650 / 7) for i in range(7)}
    result = evaluate(fresh, [f"m-{i}" for i in range(6)], s, Aggregation.SUM)
    assert result.value == pytest.approx(650)
    assert result.what_if.average_value == 13


def test_missing_pods_with_mean_aggregation_divide_the_value_by_all_pods() -> None:
    result = run([reading("p-0", 20), reading("p-1", 40)], missing=("p-2",), aggregation="mean")
    assert result.missing_pod_value == 70
    assert result.value == pytest.approx((20 + 40 + 70) / 3)
    # ceil(N × value / T) gives the same count as the sum would.
    assert result.what_if.value == math.ceil((20 + 40 + 70) / 70)


def test_starting_pods_count_as_the_target_at_or_under_target_and_zero_over_it() -> None:
    under = run([reading("p-0", 35)], starting=("s-0", "s-1"))
    assert under.value == 35 + 2 * 70
    assert under.starting_pods == ("s-0", "s-1")
    assert under.active  # decided on the fresh pod alone
    over = run([reading("p-0", 210)], starting=("s-0",))
    assert over.value == 210  # max(210, 2 × 70)
    assert over.what_if.average_value == 3


def test_starting_pods_never_hold_a_workload_awake() -> None:
    result = run([reading("p-0", 0)], starting=("s-0",))
    assert not result.active
    assert result.value == 70  # and no scale-down while it starts


def test_no_ready_pod_while_pods_start_is_unavailable_never_zero() -> None:
    # A model loading for minutes: 0 would let KEDA scale the workload to zero mid-load.
    with pytest.raises(NoData, match="no target pod is Ready: 2 starting"):
        run([], starting=("s-0", "s-1"))


def test_activity_is_decided_on_the_fresh_pods_and_unknown_while_pods_are_missing() -> None:
    # One broken page used to count as the threshold and hold the workload awake forever. The value
    # still stands (never a scale-down); whether the workload is idle cannot be told.
    result = run([reading("p-0", 0), reading("p-1", 0)], missing=("p-2",))
    assert result.value == 70 and not result.active
    assert (
        result.activity_unknown is not None and "at or below activationThreshold" in result.activity_unknown
    )
    # Above the activation threshold the fresh pods alone say active, whatever the missing pod holds.
    assert run([reading("p-0", 5), reading("p-1", 0)], missing=("p-2",)).active


def test_max_aggregation_with_missing_pods() -> None:
    assert run([reading("p-0", 10), reading("p-1", 60)], missing=("p-2",), aggregation="max").value == 70
    assert run([reading("p-0", 10), reading("p-1", 90)], missing=("p-2",), aggregation="max").value == 90


@pytest.mark.parametrize(("reporting", "missing"), [(1, 2), (0, 1), (2, 5)])
def test_fewer_than_half_fresh_is_unavailable(reporting: int, missing: int) -> None:
    with pytest.raises(NoData, match="fresh"):
        run(
            [reading(f"p-{i}", 50) for i in range(reporting)], missing=tuple(f"m-{i}" for i in range(missing))
        )


def test_exactly_half_fresh_is_enough() -> None:
    result = run([reading("p-0", 50)], missing=("p-1",))
    assert result.value == 120


def test_no_target_pods_is_zero_and_inactive() -> None:
    result = run([])
    assert result.value == 0
    assert not result.active
    assert result.what_if.current_replicas == 0


def test_activation_threshold_is_strictly_greater() -> None:
    assert not run([reading("p-0", 10)], activationThreshold="10").active
    assert run([reading("p-0", 10.5)], activationThreshold="10").active


def test_max_aggregation() -> None:
    assert run([reading("p-0", 10), reading("p-1", 60)], aggregation="max").value == 60
    assert run([reading("p-0", 10), reading("p-1", 60)], aggregation="max").aggregation is Aggregation.MAX


# Worked examples of the HPA arithmetic (README, "The arithmetic").
@pytest.mark.parametrize(
    ("value", "target", "current", "expected"),
    [
        (360, 70, 4, 6),  # the correct total
        (90, 70, 4, 2),  # the averaging trap: scales 4 → 2 while every GPU is over target
        (100, 5, 20, 20),  # Azure's threshold 5 caps at ceil(100/5) = 20
        (160, 80, 1, 2),  # DOKS: demand worth 160 % at 1 replica → 2
    ],
)
def test_hpa_average_value(value: float, target: float, current: int, expected: int) -> None:
    assert desired_replicas_average_value(value, target, current) == expected


def test_doks_average_oscillates_back_to_one() -> None:
    # At 2 replicas the DOKS form returns 160/2 = 80: ceil(80/80) = 1 → scale-down pressure.
    assert desired_replicas_average_value(80, 80, 2) == 1


def test_hpa_tolerance() -> None:
    assert desired_replicas_average_value(300, 70, 4) == 4  # ratio 1.07: within 10 %
    assert desired_replicas_value(75, 70, 4, 4) == 4
    assert desired_replicas_value(90, 70, 4, 4) == 6
    # Value: the HPA multiplies by its ready pods (2 of the 4 still loading), the tolerance by the usage.
    assert desired_replicas_value(90, 70, 4, 2) == 3
    assert desired_replicas_value(75, 70, 4, 2) == 4


def test_a_kept_evaluation_costs_the_collector_one_object_whatever_its_pods() -> None:
    # Evaluations are kept per ScaledObject until the next one: long enough to reach the collector's older
    # generations, which every tracked object there makes slower. Their pods are plain tuples of strings
    # and numbers, which a young collection stops tracking; the PodValues read back are the same values.
    gpus = [reading(f"p-{i}", 50 + i, gpu=f"GPU-{g}") for i in range(20) for g in range(2)]
    result = run([*gpus, reading("p-ack", 40, family=Family.ACK)])
    gc.collect(0)  # the rows were young: one collection that looks at them drops them from tracking
    assert result.pod_rows and not any(gc.is_tracked(row) for row in result.pod_rows)
    gc.collect()  # and the next one the tuple holding them
    assert not gc.is_tracked(result.pod_rows)
    assert {p.pod: p.value for p in result.pods} == {f"p-{i}": 50.0 + i for i in range(20)} | {"p-ack": 40.0}
    assert [p.family for p in result.pods].count(Family.ACK) == 1
    assert all(type(p.family) is Family for p in result.pods)
    assert [g.gpu for g in result.pods[0].gpus] == ["GPU-0", "GPU-1"]


def test_a_pods_row_reads_back_as_the_same_pod_value() -> None:
    gpus = (("GPU-0", "node-a", 50.0), ("GPU-1", "node-b", 70.0))
    assert PodValue.from_row(pod_row("p-0", Family.NVIDIA, 60.0, gpus)) == PodValue(
        "p-0", Family.NVIDIA, 60.0, (GpuValue(*gpus[0]), GpuValue(*gpus[1]))
    )


def test_an_inference_pod_keeps_its_engine_name_and_inputs_through_its_row() -> None:
    inputs = (("running", 3.0), ("waiting", None), ("kvCache", 0.5))
    read_back = PodValue.from_row(pod_row("vllm-0", "vllm", 3.0, (), inputs))
    assert read_back == PodValue("vllm-0", "vllm", 3.0, (), inputs)
    assert type(read_back.family) is str
