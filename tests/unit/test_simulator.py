"""The simulator's arithmetic: HPA formulas (README, "The arithmetic"), behaviour, KEDA activation."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.simulator import (  # noqa: E402
    AksPolicy,
    Behavior,
    DoksPolicy,
    Hpa,
    Keda,
    PerGpuSumPolicy,
    Pod,
    ScalerPolicy,
    Snapshot,
    Trace,
    World,
    scale_up_limit,
    settling,
    simulate,
    value_replicas,
)
from keda_gpu_scaler.core.scaling import (  # noqa: E402
    desired_replicas_average_value as average_value_replicas,
)


def world_with(utils: dict[str, float]) -> World:
    pods = tuple(Pod(name, -100.0, -100.0) for name in utils)
    return World(0.0, pods)


def seen_by(policy_type: type, utils: dict[str, float], gpus: int = 1):  # type: ignore[no-untyped-def]
    policy = policy_type(gpus)
    policy.collect(Snapshot(0.0, dict(utils)), len(utils))
    return policy


FOUR_AT_90 = {f"w-{i}": 90.0 for i in range(4)}


def test_sum_of_four_pods_at_90_with_target_70_gives_6() -> None:
    value = seen_by(ScalerPolicy, FOUR_AT_90).value(world_with(FOUR_AT_90))
    assert value == 360
    assert average_value_replicas(value, 70, 4) == 6


def test_average_of_four_pods_at_90_with_target_70_scales_down_to_2() -> None:
    average = seen_by(AksPolicy, FOUR_AT_90).value(world_with(FOUR_AT_90))
    assert average == 90
    assert average_value_replicas(average, 70, 4) == 2


def test_value_metric_type_multiplies_by_ready_pods() -> None:
    assert value_replicas(90, 70, current=4, ready=4) == 6
    assert value_replicas(75, 70, current=4, ready=3) == 4  # within 10 %: the current count stays


def test_tolerance_keeps_the_current_count_within_ten_percent() -> None:
    assert average_value_replicas(13 * 76, 70, 13) == 13  # ratio 1.086: kept
    assert average_value_replicas(13 * 78, 70, 13) == 15


@pytest.mark.parametrize("average", [5, 40, 99, 100])
def test_azure_threshold_5_never_asks_for_more_than_20(average: float) -> None:
    for current in (1, 7, 20, 50):
        assert average_value_replicas(average, 5, current) <= 20
    assert average_value_replicas(100, 5, 1) == 20


def test_per_gpu_sum_counts_a_four_gpu_pod_four_times() -> None:
    one_pod = {"w-0": 90.0}
    summed = seen_by(PerGpuSumPolicy, one_pod, gpus=4).value(world_with(one_pod))
    collapsed = seen_by(ScalerPolicy, one_pod, gpus=4).value(world_with(one_pod))
    assert (summed, collapsed) == (360, 90)
    assert (average_value_replicas(summed, 70, 1), average_value_replicas(collapsed, 70, 1)) == (6, 2)


def test_doks_form_gives_2_at_1_replica_and_1_at_2() -> None:
    # Demand worth 160 % of one pod: one pod (capped at 100 %) asks for 2; two pods at 80 % ask for 1.
    at_one = seen_by(DoksPolicy, {"w-0": 100.0}).value(world_with({"w-0": 100.0}))
    at_two = seen_by(DoksPolicy, {"w-0": 80.0, "w-1": 80.0}).value(world_with({"w-0": 80.0, "w-1": 80.0}))
    assert average_value_replicas(at_one, 80, 1) == 2
    assert average_value_replicas(at_two, 80, 2) == 1


def test_doks_form_oscillates_where_the_sum_holds() -> None:
    trace = Trace("flat", 3600, lambda t: 1.6, None)
    doks = simulate(DoksPolicy, trace)
    ours = simulate(ScalerPolicy, trace)
    assert {1, 2} <= set(doks.replicas)
    assert doks.changes >= 6
    assert ours.changes == 0
    assert set(ours.replicas) == {3}  # ceil(160 / 70)


def test_scale_up_limit_is_max_of_4_pods_and_100_percent() -> None:
    b = Behavior()
    assert scale_up_limit(1, 0, b) == 5
    assert scale_up_limit(3, 0, b) == 7
    assert scale_up_limit(10, 0, b) == 20
    assert scale_up_limit(10, 6, b) == 8  # 6 already added in this period: counted from 4


def test_hpa_scales_up_step_by_step_within_the_policy() -> None:
    hpa = Hpa(Behavior(), 1, 100, 0.0, 1)
    replicas, seen = 1, []
    for now in (15.0, 30.0, 45.0, 60.0):
        replicas = hpa.decide(now, replicas, 30)
        seen.append(replicas)
    assert seen == [5, 10, 20, 30]


def test_hpa_respects_max_replicas() -> None:
    hpa = Hpa(Behavior(), 1, 20, 0.0, 16)
    assert hpa.decide(15.0, 16, 40) == 20


def test_scale_down_waits_for_the_stabilisation_window() -> None:
    hpa = Hpa(Behavior(), 1, 100, 0.0, 10)
    replicas = 10
    history = {}
    for step in range(1, 25):
        now = 15.0 * step
        replicas = hpa.decide(now, replicas, 2)
        history[now] = replicas
    assert all(r == 10 for t, r in history.items() if t < 300)
    assert history[300.0] == 2  # the initial recommendation (at 0) has left the 300 s window


def test_scale_down_window_uses_the_highest_recent_recommendation() -> None:
    hpa = Hpa(Behavior(), 1, 100, 0.0, 4)
    assert hpa.decide(15.0, 4, 8) == 8
    assert hpa.decide(30.0, 8, 3) == 8
    assert hpa.decide(300.0, 8, 3) == 8  # the 8 of t=15 is still inside the window
    assert hpa.decide(330.0, 8, 3) == 3


def test_scale_up_is_not_delayed() -> None:
    hpa = Hpa(Behavior(), 1, 100, 0.0, 4)
    assert hpa.decide(15.0, 4, 2) == 4
    assert hpa.decide(30.0, 4, 6) == 6


def test_keda_activates_from_zero_and_scales_to_zero_after_cooldown() -> None:
    keda = Keda(min_replica_count=0, max_replica_count=20)
    assert keda.poll(0.0, True, 0) == 1
    assert keda.poll(30.0, False, 3) == 3
    assert keda.poll(299.0, False, 3) == 3
    assert keda.poll(300.0, False, 3) == 0
    assert keda.poll(330.0, None, 3) == 3  # an error: replicas stay


def test_keda_push_restarts_the_cooldown() -> None:
    keda = Keda(min_replica_count=0, max_replica_count=20)
    assert keda.push(250.0, 2) == 2
    assert keda.poll(330.0, False, 2) == 2
    assert keda.poll(550.0, False, 2) == 0


def test_keda_never_scales_to_zero_with_min_replica_count_1() -> None:
    keda = Keda(min_replica_count=1, max_replica_count=20)
    assert keda.poll(10_000.0, False, 3) == 3


def test_settling_reports_the_last_change_or_never() -> None:
    replicas = [2] * 100 + [5] * 2000
    assert settling([100.0], replicas, 50, 2100) == (50.0, 5)
    assert settling([100.0, 1900.0], replicas, 50, 2100) == (None, None)
