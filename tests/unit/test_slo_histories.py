"""The histories a latency target reads (the allowance's windows, the demand's recent sums): kept by the
evaluator per trigger, read by age, each window counted as one consistent pair."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from keda_gpu_scaler.collect.inference import POD_PAGE_NAMES
from keda_gpu_scaler.core.decide import decide
from keda_gpu_scaler.core.demand import DemandPoint
from keda_gpu_scaler.core.errors import NoData
from keda_gpu_scaler.core.latency import budget_used
from keda_gpu_scaler.core.pending import ReplicaInput
from keda_gpu_scaler.core.snapshot import NamespaceView, PoolSnapshot, Snapshot, SourceKind, Track
from keda_gpu_scaler.core.trigger import TriggerSpec
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.pages.engines import PodSamples
from keda_gpu_scaler.pages.exposition import parse_exposition
from keda_gpu_scaler.pages.gateways import page_queue
from keda_gpu_scaler.server.evaluator import Evaluator, _remember_latency
from keda_gpu_scaler.server.registry import Followed, Registry, Subscription
from keda_gpu_scaler.telemetry import Telemetry

PODS = ("vllm-0", "vllm-1")
GUARD = parse_trigger(
    {"metric": "requests", "threshold": "64", "podNamePrefix": "vllm-", "inferencePool": "chat-pool"}
    | {"sloTtftSeconds": "2"}
)
DEMAND = parse_trigger(
    {"metric": "demand", "threshold": "5", "podNamePrefix": "vllm-", "window": "60", "sloTtftSeconds": "2"}
)
UNREADABLE = PoolSnapshot((ReplicaInput("epp-0", None, "timed out after 3s"),), "no replica")


def holding(held: float) -> PoolSnapshot:
    return PoolSnapshot((ReplicaInput("epp-0", page_queue(epp_page("chat-pool", {Queued("m"): held}))),), "-")


def ttft(requests: float, over_2s: float) -> dict[str, float]:
    """Per pod: `requests` first tokens in the window, `over_2s` of them within (2, 5] s, the rest under 1 s."""
    buckets = {"ttft:le=1.0": requests - over_2s, "ttft:le=2.0": requests - over_2s, "ttft:le=5.0": requests}
    return buckets | {"ttft:le=+Inf": requests, "ttft:count": requests, "ttft:sum": requests * 0.5}


def snap(
    now: float,
    latency: dict[str, float],
    *,
    pool: PoolSnapshot | None = None,
    finished: float = 300.0,
    recent: tuple[float, ...] = (),
    recent_latency: tuple[tuple[float, float], ...] = (),
    fresh: bool = True,
) -> Snapshot:
    """Two vLLM pods holding 190 running each, `finished` requests each over the last minute."""
    page = 'vllm:num_requests_running{engine="0",model_name="m"} 190\n'
    page += 'vllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
    samples = tuple(parse_exposition(page, POD_PAGE_NAMES))
    pods = tuple(PodSamples("llm", pod, samples, f"http://{pod}") for pod in PODS)
    view = NamespaceView((), tuple(p.source for p in pods) if fresh else (), 2)
    points = [DemandPoint(now - 60.0, 0.0, 0.0), DemandPoint(now, finished, 0.0)]
    track = Track(points, used=2, engine="vllm", latency=latency)
    tracks = tuple((pod, track) for pod in PODS)
    return Snapshot(
        "llm", now, SourceKind.INFERENCE, None, view, (), pods, frozenset(PODS), tracks, pool, recent, recent_latency
    )  # fmt: skip


class ScriptedSnapshots:
    """The evaluator's Snapshots seam: each snapshot from `plan(recent sums, recent windows)`, at `now`."""

    def __init__(self, clock: list[float], plan: Callable[..., Snapshot]) -> None:
        self.clock, self.plan = clock, plan
        self.asked: list[tuple[Any, Any]] = []

    def now(self) -> float:
        return self.clock[0]

    def check(self, spec: TriggerSpec) -> None:
        pass

    def kind_of(self, spec: TriggerSpec) -> SourceKind:
        return SourceKind.INFERENCE

    def remember(self, *args: Any) -> None:
        pass

    def take(
        self, namespace: str, name: str, spec: TriggerSpec, recent: Any = (), latency: Any = ()
    ) -> Snapshot:
        self.asked.append((recent, latency))
        return self.plan(recent, latency)


def run(
    clock: list[float], plan: Callable[..., Snapshot], spec: TriggerSpec
) -> tuple[Evaluator, Followed, Any]:
    snapshots = ScriptedSnapshots(clock, plan)
    evaluator = Evaluator(snapshots=snapshots, telemetry=Telemetry())  # type: ignore[arg-type]
    followed = Registry(ttl=1e9, cap=10, clock=lambda: clock[0]).follow("llm", "vllm", spec)
    return evaluator, followed, snapshots


def test_a_window_counts_the_kind_that_missed_the_larger_share_as_its_own_pair() -> None:
    """SGLang and older vLLM observe time per output token once per token: 20 % of requests over the
    time-to-first-token target must not be read as 120 misses out of 60,000 tokens."""
    spec = parse_trigger(
        {
            "metric": "demand",
            "threshold": "5",
            "podNamePrefix": "vllm-",
            "window": "60",
            "sloTtftSeconds": "2",
        }
        | {"sloTpotMs": "100"}
    )
    latency = ttft(300.0, 60.0)
    latency |= itl(30000.0, 0.0)  # 100 tokens a request, all fast
    decision = decide(spec, snap(60.0, latency))
    subscription = Subscription(spec, 0.0)
    _remember_latency(subscription, spec, 60.0, decision)
    assert list(subscription.latency_windows) == [(60.0, 600.0, 120.0)]
    assert spec.slo is not None
    assert budget_used(spec.slo, [(600.0, 120.0)]) == pytest.approx(4.0)


def itl(tokens: float, over_100ms: float) -> dict[str, float]:
    """Per pod: `tokens` gaps between tokens (SGLang, older vLLM), `over_100ms` of them in (0.1, 0.25] s."""
    fast = tokens - over_100ms
    buckets = {"itl:le=0.05": fast, "itl:le=0.1": fast, "itl:le=0.25": tokens, "itl:le=+Inf": tokens}
    return buckets | {"itl:count": tokens, "itl:sum": tokens * 0.02}


def test_a_window_whose_gaps_between_tokens_missed_most_is_weighed_by_its_requests() -> None:
    """Windows of first tokens (a request each) and of gaps between tokens (one per token) are one
    allowance: a window whose larger share was of its 60,000 gaps counts as its 600 requests. Counted as
    60,000, it outweighed a window in which a fifth of 600 requests missed: 120 + 120 of 60,600 read as
    8 % of the allowance used, where first tokens alone had used it twice over, and the guard waited."""
    spec = parse_trigger(
        {"metric": "demand", "threshold": "5", "podNamePrefix": "vllm-", "window": "60"}
        | {"sloTtftSeconds": "2", "sloTpotMs": "100"}
    )
    clock = [60.0]
    phases = {
        60.0: ttft(300.0, 60.0) | itl(30_000.0, 0.0),  # a fifth of the first tokens late
        120.0: ttft(300.0, 0.0) | itl(30_000.0, 60.0),  # 0.2 % of the gaps late
        180.0: ttft(300.0, 60.0) | itl(30_000.0, 0.0),  # the first tokens' p95 over 2 s again
    }
    evaluator, followed, snapshots = run(
        clock, lambda recent, windows: snap(clock[0], phases[clock[0]], recent_latency=windows), spec
    )
    for at in phases:
        clock[0] = at
        found = evaluator.evaluate(followed, spec).value
    windows = snapshots.asked[-1][1]
    assert [pair for window in windows for pair in window] == pytest.approx([600.0, 120.0, 600.0, 1.2]), (
        windows
    )
    # Spent: the guard acts on the p95 over 2 s (two Ready pods at 5/s against 5: one pod more).
    assert found == pytest.approx(15.0), windows


def rated_pods(
    now: float, rates: dict[str, float | None], targets: tuple[str, ...], recent: tuple[float, ...]
) -> Snapshot:
    """The target pods, those in `rates` read, each at its own rate over the last minute (None: one page
    so far, no rate yet); the others missing."""
    page = 'vllm:num_requests_running{engine="0",model_name="m"} 0\n'
    page += 'vllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
    samples = tuple(parse_exposition(page, POD_PAGE_NAMES))
    pods = tuple(PodSamples("llm", pod, samples, f"http://{pod}") for pod in rates)
    view = NamespaceView((), tuple(p.source for p in pods), len(targets))
    tracks = tuple(
        (pod, Track([DemandPoint(now, 0.0, 0.0)] if rate is None else
                    [DemandPoint(now - 60.0, 0.0, 0.0), DemandPoint(now, rate * 60.0, 0.0)], engine="vllm"))
        for pod, rate in rates.items()
    )  # fmt: skip
    return Snapshot(
        "llm", now, SourceKind.INFERENCE, None, view, (), pods, frozenset(targets), tracks, None, recent
    )  # fmt: skip


def demand_through(
    times: Iterable[float], fleet_at: Callable[[float], tuple[dict[str, float | None], tuple[str, ...]]]
) -> tuple[tuple[float, ...], float]:
    """DEMAND evaluated at each of `times` on the fleet `fleet_at(time)` gives (rates, pods): the recent
    summed demands the last evaluation read, and its value."""
    clock = [0.0]

    def fleet(recent: tuple[float, ...], _: Any) -> Snapshot:
        rates, pods = fleet_at(clock[0])
        return rated_pods(clock[0], rates, pods, recent)

    evaluator, followed, snapshots = run(clock, fleet, DEMAND)
    for at in times:
        clock[0] = at
        found = evaluator.evaluate(followed, DEMAND).value
    return snapshots.asked[-1][0], found


def test_a_pod_without_a_rate_of_its_own_adds_no_variability_to_the_arrivals() -> None:
    """10 requests/s arrive throughout: two pods at 5/s, then a third is Ready without a rate yet (it
    counts as the others' mean, 5/s), then the three share the 10/s. Kept, that 15 read as noise and
    sized 42 % headroom for arrivals that never changed."""
    third = 10 / 3
    phases: dict[float, dict[str, float | None]] = {
        0.0: {"vllm-0": 5.0, "vllm-1": 5.0},
        20.0: {"vllm-0": 5.0, "vllm-1": 5.0},
        40.0: {"vllm-0": 5.0, "vllm-1": 5.0, "vllm-2": None},
        60.0: {"vllm-0": third, "vllm-1": third, "vllm-2": third},
        80.0: {"vllm-0": third, "vllm-1": third, "vllm-2": third},
    }
    recent, found = demand_through(phases, lambda at: (phases[at], tuple(phases[at])))
    assert recent == pytest.approx((10.0, 10.0, 10.0)), recent
    assert found == pytest.approx(10.0)


def test_a_pod_missing_for_one_evaluation_adds_no_variability_to_the_arrivals() -> None:
    """15 requests/s arrive throughout, 5/s a pod; at 40 s one pod's page is not fresh (a missing pod). Its
    rate left that sum (10), read as noise: 35 % headroom for ten minutes on a steady rate."""
    pods = ("vllm-0", "vllm-1", "vllm-2")
    fresh_at = {0.0: pods, 20.0: pods, 40.0: pods[:2], 60.0: pods, 80.0: pods}
    recent, found = demand_through(fresh_at, lambda at: (dict.fromkeys(fresh_at[at], 5.0), pods))
    assert recent == pytest.approx((15.0, 15.0, 15.0)), recent
    assert found == pytest.approx(15.0)


def test_windows_older_than_the_allowances_span_are_not_read_after_a_quiet_hour() -> None:
    clock, latency = [0.0], {"now": ttft(500.0, 0.0)}  # calm: 1,000 requests, none missed
    evaluator, followed, snapshots = run(
        clock,
        lambda recent, windows: snap(clock[0], latency["now"], pool=holding(0), recent_latency=windows),
        GUARD,
    )
    evaluator.evaluate(followed, GUARD)
    latency["now"] = ttft(0.0, 0.0)  # an hour in which no request is served: no window is kept
    for at in range(60, 3600, 60):
        clock[0] = float(at)
        evaluator.evaluate(followed, GUARD)
    clock[0], latency["now"] = 3600.0, ttft(300.0, 60.0)  # traffic back, the p95 well over 2 s
    value = evaluator.evaluate(followed, GUARD).value
    assert snapshots.asked[-1][1] == ()  # the calm window of an hour ago is not "the last half hour"
    assert value == 380.0  # the allowance not measured: the guard acts


def test_demand_sums_older_than_the_headrooms_span_are_not_read_after_an_outage() -> None:
    clock, state = [1000.0], {"finished": 150.0, "fresh": True}

    def plan(recent: tuple[float, ...], windows: Any) -> Snapshot:
        return snap(clock[0], {}, finished=state["finished"], recent=recent, fresh=bool(state["fresh"]))

    evaluator, followed, snapshots = run(clock, plan, DEMAND)
    evaluator.evaluate(followed, DEMAND)
    clock[0], state["finished"] = 1020.0, 450.0
    evaluator.evaluate(followed, DEMAND)
    state["fresh"] = False  # no fresh page for half an hour: nothing is kept
    for at in range(1050, 3000, 30):
        clock[0] = float(at)
        with pytest.raises(NoData):
            evaluator.evaluate(followed, DEMAND)
    clock[0], state["finished"], state["fresh"] = 3000.0, 300.0, True
    value = evaluator.evaluate(followed, DEMAND).value
    assert snapshots.asked[-1][0] == ()  # sums from 2,000 s ago are not the arrival rate's variability
    assert value == pytest.approx(10.0)  # fewer than two sums: no headroom measured, none added


def test_a_windows_misses_count_while_the_pool_cannot_be_read() -> None:
    clock, phase = [0.0], {"latency": ttft(300.0, 0.0), "pool": holding(0)}
    evaluator, followed, _ = run(
        clock,
        lambda recent, windows: snap(clock[0], phase["latency"], pool=phase["pool"], recent_latency=windows),
        GUARD,
    )
    evaluator.evaluate(followed, GUARD)  # 600 requests, none missed
    clock[0], phase["latency"], phase["pool"] = 60.0, ttft(300.0, 60.0), UNREADABLE
    evaluator.evaluate(followed, GUARD)  # 600 requests, 120 missed, the pool unread
    clock[0], phase["pool"] = 120.0, holding(0)
    value = evaluator.evaluate(followed, GUARD).value
    windows = [(requests, missed) for _, requests, missed in followed.triggers[GUARD].latency_windows]
    assert windows[:2] == [(600.0, 0.0), (600.0, 120.0)]
    assert value == 380.0  # 120 of 1,200 missed: the allowance (5 %) spent twice over, the guard acts


def test_the_guard_says_no_latency_was_read_where_no_pod_prints_it() -> None:
    decision = decide(GUARD, snap(60.0, {}, pool=holding(0)))
    assert decision.evaluation is not None and decision.evaluation.value == 0.0  # it follows the pool
    assert not any("latency target holds" in note for note in decision.notes), decision.notes
    assert any("no fresh pod's latency was read" in note for note in decision.notes), decision.notes
