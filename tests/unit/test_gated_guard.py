"""The `requests` guard with `inferencePool`: it asks for replicas only while the pool holds requests."""

from __future__ import annotations

import dataclasses

import pytest

from keda_gpu_scaler.collect.inference import POD_PAGE_NAMES
from keda_gpu_scaler.core.decide import decide
from keda_gpu_scaler.core.demand import DemandPoint
from keda_gpu_scaler.core.errors import ConfigError, NoData
from keda_gpu_scaler.core.pending import ReplicaInput
from keda_gpu_scaler.core.snapshot import NamespaceView, PoolSnapshot, Snapshot, SourceKind, Track
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.pages.engines import PodSamples
from keda_gpu_scaler.pages.exposition import parse_exposition
from keda_gpu_scaler.pages.gateways import page_queue

GUARD_KEYS = {"metric": "requests", "threshold": "64", "podNamePrefix": "vllm-", "inferencePool": "chat-pool"}
GUARD = parse_trigger(GUARD_KEYS)


def pods(in_flight: float) -> tuple[PodSamples, ...]:
    """Two vLLM pods, each holding `in_flight` requests running, none waiting."""
    page = f'vllm:num_requests_running{{engine="0",model_name="m"}} {in_flight}\n'
    page += 'vllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
    samples = tuple(parse_exposition(page, POD_PAGE_NAMES))
    return tuple(PodSamples("llm", pod, samples, f"http://{pod}") for pod in ("vllm-0", "vllm-1"))


def snapshot(pool: PoolSnapshot | None, in_flight: float = 190.0) -> Snapshot:
    readings = pods(in_flight)
    view = NamespaceView((), tuple(p.source for p in readings), 2)
    return Snapshot(
        "llm", 0.0, SourceKind.INFERENCE, None, view, (), readings, frozenset({"vllm-0", "vllm-1"}), pool=pool
    )  # fmt: skip


def holding(held: float) -> PoolSnapshot:
    table = page_queue(epp_page("chat-pool", {Queued("m"): held}))
    return PoolSnapshot((ReplicaInput("epp-0", table),), "no replica")


def test_while_the_pool_holds_nothing_the_guard_asks_for_no_replica() -> None:
    # Short answers: two pods at their target hold 190 in flight each, 6 replicas' worth at 64 a pod.
    decision = decide(GUARD, snapshot(holding(0)))
    assert decision.evaluation is not None and decision.evaluation.value == 0.0
    assert decision.evaluation.what_if.average_value == 1  # the HPA's floor: the other triggers size
    assert decision.evaluation.active  # pods with requests in flight are serving
    assert any("holds no request" in note and "380 in flight" in note for note in decision.notes)


def test_while_the_pool_holds_requests_the_guard_acts() -> None:
    decision = decide(GUARD, snapshot(holding(12)))
    assert decision.evaluation is not None and decision.evaluation.value == 380.0
    assert decision.evaluation.what_if.average_value == 6
    assert any("holds 12 requests" in note for note in decision.notes)


def test_with_a_latency_target_the_guard_also_acts_while_requests_miss_it() -> None:
    guard = parse_trigger({**GUARD_KEYS, "sloTtftSeconds": "2"})
    # Of each pod's 300 first tokens in the window, 30 took over 2 s (within 5 s): the p95 is over 2 s.
    latency = {"ttft:le=1.0": 240.0, "ttft:le=2.0": 270.0, "ttft:le=5.0": 300.0, "ttft:le=+Inf": 300.0}
    latency |= {"ttft:count": 300.0, "ttft:sum": 400.0}
    track = Track([DemandPoint(0.0, 0.0, 0.0), DemandPoint(60.0, 300.0, 0.0)], used=2, latency=latency)
    over = dataclasses.replace(
        snapshot(holding(0)), tracks=(("vllm-0", track), ("vllm-1", track)), recent_latency=((1000.0, 60.0),)
    )
    decision = decide(guard, over)  # the last half hour's allowance spent (60 of 1,000 missed)
    assert decision.evaluation is not None and decision.evaluation.value == 380.0
    assert any("miss the latency target" in note for note in decision.notes)
    assert decision.slo is not None and decision.slo.budget_used == pytest.approx(1.2)
    # Within the allowance (10 of 1,000 missed lately), the same window leaves the guard quiet.
    calm = dataclasses.replace(over, recent_latency=((1000.0, 10.0),))
    assert decide(guard, calm).evaluation.value == 0.0  # type: ignore[union-attr]


def test_without_the_pool_the_guard_acts_as_before() -> None:
    plain = parse_trigger({"metric": "requests", "threshold": "64", "podNamePrefix": "vllm-"})
    decision = decide(plain, snapshot(None))
    assert decision.evaluation is not None and decision.evaluation.value == 380.0


def test_an_unreadable_pool_never_quiets_the_guard() -> None:
    unread = PoolSnapshot((ReplicaInput("epp-0", None, "timed out after 3s"),), "no replica")
    decision = decide(GUARD, snapshot(unread))
    assert decision.evaluation is not None and decision.evaluation.value == 380.0
    assert any("cannot be read" in note and "timed out" in note for note in decision.notes)
    failing = PoolSnapshot((), "no replica", unreadable="Prometheus answers 503")
    assert decide(GUARD, snapshot(failing)).evaluation.value == 380.0  # type: ignore[union-attr]


def test_a_pool_that_does_not_exist_is_an_error_not_a_quiet_guard() -> None:
    typo = PoolSnapshot(
        (), "no replica", unknown="InferencePool llm/chat-poll does not exist; pools: chat-pool"
    )
    decision = decide(GUARD, snapshot(typo))
    assert isinstance(decision.error, NoData) and "chat-poll" in str(decision.error)


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"gatewayMetricsPort": "9090"}, "applies only with inferencePool"),
        ({"inferencePool": "chat-pool", "source": "prometheus"}, "source='prometheus' is not available"),
        ({"sloTtftSeconds": "2"}, "metric=requests with inferencePool"),
    ],
)
def test_requests_refuses_pool_keys_it_cannot_serve(metadata: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_trigger({"metric": "requests", "threshold": "64", "podNamePrefix": "vllm-", **metadata})


def test_other_pod_metrics_still_refuse_the_pool() -> None:
    with pytest.raises(
        ConfigError, match="applies only to metric=pending, metric=demand and metric=requests"
    ):
        parse_trigger({"metric": "queue", "threshold": "5", "podNamePrefix": "vllm-", "inferencePool": "p"})
