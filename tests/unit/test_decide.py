"""decide(): a trigger's value from a snapshot alone, with no store, clock or log behind it."""

from __future__ import annotations

import dataclasses
import logging
import math

import pytest

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


def demand_snapshot(ttft_over_2s: float, recent_latency: tuple[tuple[float, float], ...]) -> Snapshot:
    """Two vLLM pods at 5 requests/s each over the minute; of their 600 first tokens, `ttft_over_2s` took
    more than 2 s, all within 5 s; the demand swung 8 → 12 → 8 → 12 lately."""
    from keda_gpu_scaler.collect.inference import POD_PAGE_NAMES
    from keda_gpu_scaler.core.demand import DemandPoint
    from keda_gpu_scaler.core.snapshot import Track
    from keda_gpu_scaler.pages.engines import PodSamples
    from keda_gpu_scaler.pages.exposition import parse_exposition

    names = ("vllm-0", "vllm-1")
    page = 'vllm:num_requests_running{engine="0",model_name="m"} 0\nvllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
    pods = tuple(
        PodSamples("llm", pod, tuple(parse_exposition(page, POD_PAGE_NAMES)), f"http://{pod}")
        for pod in names
    )
    per_pod = {"ttft:le=1.0": 240.0, "ttft:le=2.0": 300 - ttft_over_2s / 2, "ttft:le=5.0": 300.0}
    per_pod |= {"ttft:le=+Inf": 300.0, "ttft:count": 300.0, "ttft:sum": 300.0}
    track = Track(
        [DemandPoint(0.0, 0.0, 0.0), DemandPoint(60.0, 300.0, 0.0)], used=2, engine="vllm", latency=per_pod
    )
    view = NamespaceView((), tuple(f"http://{pod}" for pod in names), 1)
    return Snapshot(
        "llm", 60.0, SourceKind.SCRAPE, None, view, (), pods, frozenset(names),
        tuple((pod, track) for pod in names), None, (8.0, 12.0, 8.0, 12.0), recent_latency,
    )  # fmt: skip


SLO_SPEC = parse_trigger(
    {"metric": "demand", "threshold": "5", "podNamePrefix": "vllm-", "window": "60", "sloTtftSeconds": "2"}
)


def test_the_slo_spends_headroom_and_guard_as_far_as_the_last_half_hour_needs() -> None:
    # This window's p95 is 3.5 s (60 of 600 over 2 s). The last half hour's windows: 2,000 requests, of which 20 missed (a fifth of the 5 % allowance).
    calm = decide(SLO_SPEC, demand_snapshot(60, ((1000.0, 10.0), (1000.0, 10.0))))
    assert calm.slo is not None and calm.slo.budget_used == pytest.approx(0.2)
    # The demand is 10/s; the headroom z·σ/mean (σ 2.83 from the swings) is spent at its floor, half:
    # 10 × (1 + 0.5 × 1.645 × 2.83 / 10) = 12.3; the p95 over 2 s does not add a pod while the SLO holds.
    full_share = 1.6449 * math.sqrt(3 * 16 / 6) / 10
    assert calm.slo.headroom == pytest.approx(0.5 * full_share, rel=1e-3)
    assert calm.evaluation is not None and calm.evaluation.value == pytest.approx(
        10 * (1 + 0.5 * full_share), rel=1e-3
    )
    # The allowance used up: all the headroom, and the guard asks for one pod more (3 pods × 5).
    spent = decide(SLO_SPEC, demand_snapshot(60, ((1000.0, 60.0), (1000.0, 60.0))))
    assert spent.slo is not None and spent.slo.budget_used == pytest.approx(1.2)
    assert spent.slo.headroom == pytest.approx(full_share, rel=1e-3)
    assert spent.evaluation is not None and spent.evaluation.value == pytest.approx(15.0)
    # Too few requests to judge: as if spent (never a made-up 0).
    unknown = decide(SLO_SPEC, demand_snapshot(60, ((100.0, 0.0),)))
    assert unknown.slo is not None and unknown.slo.budget_used is None
    assert unknown.evaluation is not None and unknown.evaluation.value == pytest.approx(15.0)


def test_the_latency_guard_asks_one_pod_over_the_ready_ones_never_over_those_starting() -> None:
    # Two Ready pods over the SLO, the allowance spent, the demand steady (no headroom), and three pods
    # already starting: what they will serve is not in the pods' latency yet, so the guard asks for
    # nothing beyond them. Counted as if up, it asked for one more at every sync while they started
    # (one Ready pod over target became 9 replicas for 1.5 pods' worth of load in the simulator).
    over = demand_snapshot(60, ((1000.0, 60.0), (1000.0, 60.0)))
    starting = frozenset({"vllm-2", "vllm-3", "vllm-4"})
    snapshot = dataclasses.replace(
        over, targets=Targets(over.target_pods, starting=starting), recent_demand=(10.0,) * 4
    )
    decision = decide(SLO_SPEC, snapshot)
    assert decision.evaluation is not None and decision.evaluation.starting_pods == tuple(sorted(starting))
    # The two Ready pods' 10/s plus the three starting ones at the threshold: 25, as without a guard.
    assert decision.evaluation.value == pytest.approx(25.0)
    # Once they are up and still over, one pod more than those Ready: (2 + 1) × 5.
    up = dataclasses.replace(over, recent_demand=(10.0,) * 4)
    assert decide(SLO_SPEC, up).evaluation.value == pytest.approx(15.0)  # type: ignore[union-attr]


def test_the_headroom_is_for_the_demand_never_for_the_floor_that_holds_pods_starting() -> None:
    spec = parse_trigger(
        {
            "metric": "demand",
            "threshold": "4",
            "podNamePrefix": "vllm-",
            "window": "60",
            "sloTtftSeconds": "2",
        }
    )
    full_share = 1.6449 * math.sqrt(3 * 16 / 6) / 10  # the swings' noise; the allowance is spent: all of it
    over = demand_snapshot(60, ((1000.0, 60.0), (1000.0, 60.0)))
    # Once up: the two pods' 10/s with the whole headroom (over the guard's (2 + 1) × 4).
    assert decide(spec, over).evaluation.value == pytest.approx(10 * (1 + full_share), rel=1e-3)  # type: ignore[union-attr]
    # Three more starting: the two Ready pods are over their 2 × 4, so SPEC §4 holds all five at the
    # threshold, 20, above the demand with its headroom (14.7). Multiplied by the headroom too (29.3), each
    # sync asked for 47 % more than the pods already asked for.
    starting = Targets(over.target_pods, starting=frozenset({"vllm-2", "vllm-3", "vllm-4"}))
    decision = decide(spec, dataclasses.replace(over, targets=starting))
    assert decision.slo is not None and decision.slo.headroom == pytest.approx(full_share, rel=1e-3)
    assert decision.evaluation is not None and decision.evaluation.value == pytest.approx(20.0)
    # /explain says what the headroom was for: the two Ready pods' 10/s, not the floor's 20.
    assert decision.slo.headroom_base == pytest.approx(10.0)


def test_a_pending_part_beyond_the_wire_at_zero_replicas_is_unavailable_never_sent() -> None:
    from keda_gpu_scaler.core.pending import ReplicaInput
    from keda_gpu_scaler.core.snapshot import PoolSnapshot
    from keda_gpu_scaler.demo.epp import Queued, epp_page
    from keda_gpu_scaler.pages.gateways import page_queue

    spec = parse_trigger(
        {
            "metric": "demand",
            "threshold": "5",
            "window": "30",
            "inferencePool": "chat-pool",
            "podSelector": "app=x",
        }
    )
    table = page_queue(epp_page("chat-pool", {Queued("m"): 1e15}))
    pool = PoolSnapshot((ReplicaInput("epp-0", table),), "no replica", growth={"epp-0": 1e16})
    at_zero = Targets(frozenset(), replicas=0)  # its /scale read since the pods went: none asked for
    decision = decide(spec, Snapshot("llm", 0.0, SourceKind.INFERENCE, at_zero, None, pool=pool))
    assert isinstance(decision.error, NoData) and "KEDA cannot carry" in str(decision.error)
    assert decision.evaluation is None


@pytest.mark.parametrize("added", ["pool", "slo"])
def test_aggregation_max_on_demand_stays_a_per_pod_maximum_with_a_pool_or_a_latency_target(
    added: str,
) -> None:
    from keda_gpu_scaler.core.pending import ReplicaInput
    from keda_gpu_scaler.core.snapshot import PoolSnapshot
    from keda_gpu_scaler.core.trigger import Aggregation
    from keda_gpu_scaler.demo.epp import Queued, epp_page
    from keda_gpu_scaler.pages.gateways import page_queue

    # Two pods at 5/s each: a per-pod maximum is their mean, half their sum, whatever is added on top.
    metadata = {"metric": "demand", "threshold": "5", "podNamePrefix": "vllm-", "window": "60"}
    snapshot = demand_snapshot(0.0, ())
    if added == "pool":
        metadata["inferencePool"] = "chat-pool"
        table = page_queue(epp_page("chat-pool", {Queued("m"): 30}))
        pool = PoolSnapshot((ReplicaInput("epp-0", table),), "no replica", growth={"epp-0": 0.0})
        snapshot = dataclasses.replace(snapshot, pool=pool)
    else:
        metadata["sloTtftSeconds"] = "2"
    values = {}
    for aggregation in ("sum", "mean", "max"):
        decision = decide(parse_trigger(metadata | {"aggregation": aggregation}), snapshot)
        assert decision.error is None and decision.evaluation is not None
        values[aggregation] = decision.evaluation.value
    assert values["sum"] > 10  # the pool's 30 requests, or the SLO's headroom, added something
    assert values["max"] == pytest.approx(values["mean"]) and values["max"] == pytest.approx(
        values["sum"] / 2
    )
    assert decision.evaluation.aggregation is Aggregation.MAX
