"""The LLM-serving simulator's invariants: requests are conserved, no pod means no GPU-seconds, its HPA uses
the product's formula, runs repeat with a seed, a bad trace file is refused with one clear line; and its
fidelity rules: starting pods are not missing pods, KV fills as tokens are generated and preempts when
full, the gateway holds requests while every pod is saturated, a failing trigger forbids a scale-down,
the scale-up limit counts only scale-ups, cold starts come from a range, and the Pareto judge."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.simulator.__main__ import main  # noqa: E402
from bench.simulator.autoscaling import Behavior, Hpa  # noqa: E402
from bench.simulator.llm_fleet import (  # noqa: E402
    TPOT_BOUNDS,
    TTFT_BOUNDS,
    Fleet,
    Pod,
    Request,
    ServerModel,
    Tally,
    observe,
)
from bench.simulator.llm_policies import (  # noqa: E402
    POD_RATE,
    LlmPolicy,
    OracleTrigger,
    PendingTrigger,
    ProductTrigger,
    Trigger,
    demand_threshold,
    make_policy,
)
from bench.simulator.llm_product import POOL  # noqa: E402
from bench.simulator.llm_run import LlmRun, simulate_llm  # noqa: E402
from bench.simulator.llm_signals import Page, Signals, Timing, View  # noqa: E402
from bench.simulator.llm_study import extend, versus  # noqa: E402
from bench.simulator.llm_traces import (  # noqa: E402
    LlmTrace,
    Segment,
    TraceFileError,
    draw_arrivals,
    mix_shift_trace,
    read_trace,
)
from keda_gpu_scaler.core.scaling import hpa_desired_replicas  # noqa: E402

# Quiet 5 min, a burst of 4 pods' worth for 2 min, quiet again: wakes from zero and overloads on the way.
WAKE = LlmTrace("wake", "", (Segment(0, 0.0), Segment(300, 4 * POD_RATE), Segment(420, 0.0)), 1200.0)


def run(trace: LlmTrace, policy: str, ttl: float = 60.0, seed: int = 3):  # type: ignore[no-untyped-def]
    model = dataclasses.replace(ServerModel(), gateway_ttl=ttl)
    return simulate_llm(trace, draw_arrivals(trace, seed), make_policy(policy), POD_RATE, model)


@pytest.mark.parametrize("policy", ["requests+pending", "requests+prometheus-wake", "requests"])
def test_every_request_is_served_dropped_or_still_in_the_system(policy: str) -> None:
    result = run(WAKE, policy, ttl=30.0)  # a TTL shorter than the cold start: the wake drops some
    assert result.arrived > 1000
    assert result.arrived == result.completed + result.dropped + result.in_system
    if policy != "requests":
        assert result.dropped > 0


def test_no_gpu_seconds_while_scaled_to_zero() -> None:
    quiet = LlmTrace("quiet", "", (Segment(0, 0.0),), 1200.0)
    result = run(quiet, "requests+pending")
    assert result.arrived == 0
    assert result.gpu_seconds == 0
    assert max(result.replicas) == 0
    assert Fleet(ServerModel(), 0, 0.0).gpus() == 0


def test_scaled_to_zero_after_the_cooldown_once_requests_stop() -> None:
    result = run(WAKE, "requests+pending", ttl=120.0)
    assert result.dropped == 0  # the cold start (75 s) fits in the TTL
    assert result.replicas[-1] == 0
    # Idle once the backlog is served: the pods stay for KEDA's 300 s cooldown (and a poll, and the age
    # of the scrape that last saw a request in flight: the loops run at random phases), no longer.
    assert 0 < result.quiet_gpu_seconds <= (300 + 30 + 5) * max(result.replicas)


def signals_with(
    pages: dict[str, Page], starting: tuple[str, ...] = (), scrapes: list[View] | None = None
) -> Signals:
    """What the collectors saw: `scrapes` (default: one scrape of `pages` at 0 s), the last one now;
    Kubernetes has the last scrape's pods Ready and `starting` starting."""
    views = scrapes or [View(0.0, pages, tuple(pages), starting, 0, {})]
    signals = Signals(Timing())
    signals.scrapes.extend(views)
    signals.direct = views[-1]
    signals.now = views[-1].at
    signals.ready, signals.starting = tuple(views[-1].pages), starting
    return signals


@pytest.mark.parametrize(
    ("in_flight", "current"),
    [((90, 90, 90, 90), 4), ((50, 52, 55), 3), ((10, 10), 2), ((400,), 1), ((0, 0, 0), 3)],
)
def test_the_hpa_step_is_the_products_formula_on_the_sum(in_flight: tuple[int, ...], current: int) -> None:
    pages = {f"vllm-{i}": Page(n, 0, 0.1) for i, n in enumerate(in_flight)}
    policy = make_policy("requests")
    target = policy.triggers[0].threshold
    expected = hpa_desired_replicas(float(sum(in_flight)), target, current, average_value=True)
    assert policy.desired(signals_with(pages), current) == expected


def test_four_pods_at_90_in_flight_with_target_50_ask_for_8() -> None:
    pages = {f"vllm-{i}": Page(80, 10, 0.3) for i in range(4)}
    assert make_policy("requests").desired(signals_with(pages), 4) == 8
    # requests+kv_cache: the larger of ceil(360 / 50) and ceil(4 × 30 % / 70 %).
    assert make_policy("requests+kv_cache").desired(signals_with(pages), 4) == 8


def test_a_starting_pod_counts_as_the_scaler_counts_a_missing_pod() -> None:
    pages = {"vllm-0": Page(20, 0, 0.1), "vllm-1": Page(20, 0, 0.1)}
    # The ready pods alone ask for 1 of 3: the starting pod counts as the target, 20 + 20 + 50 → 2.
    assert make_policy("requests").desired(signals_with(pages, ("vllm-2",)), 3) == 2
    # Prometheus has no series for it at all: 40 → 1.
    prometheus = signals_with(pages, ("vllm-2",))
    prometheus.prometheus = prometheus.direct
    assert make_policy("prometheus-requests").desired(prometheus, 3) == 1


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    first, again, other = (
        run(WAKE, "requests", seed=5),
        run(WAKE, "requests", seed=5),
        run(WAKE, "requests", seed=6),
    )
    assert first.summary() == again.summary()
    assert first.summary() != other.summary()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("time,rate\n0,1\n", "row 1: header 'time,rate' is not allowed; use seconds,requests_per_second"),
        ("", "row 1: the file is empty"),
        ("seconds,requests_per_second\n", "row 2: no rows after the header"),
        (
            "seconds,requests_per_second\n0,1\n60,-2\n",
            "row 3: requests_per_second '-2' must be a finite number ≥ 0",
        ),
        ("seconds,requests_per_second\n0,1\n60,lots\n", "row 3: requests_per_second 'lots' is not a number"),
        (
            "seconds,requests_per_second\n0,1\n60,2\n30,1\n",
            "row 4: seconds 30 must be greater than the row before (60)",
        ),
    ],
)
def test_a_bad_trace_file_is_one_line_naming_the_row_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    with pytest.raises(TraceFileError, match="^" + str(path)):
        read_trace(path)
    assert main(["llm", "--json", "--trace", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_a_trace_file_with_token_means_is_read_piecewise_constant(tmp_path: Path) -> None:
    path = tmp_path / "night.csv"
    path.write_text("seconds,requests_per_second,prompt_tokens,output_tokens\n0,2,500,50\n60,0,500,50\n")
    trace = read_trace(path)
    assert (trace.rate_at(30), trace.rate_at(90), trace.duration) == (2.0, 0.0, 120.0)
    arrivals = draw_arrivals(trace, 1)
    assert all(t < 60 for t in arrivals.times)
    assert 300 < sum(arrivals.prompts) / len(arrivals.prompts) < 700


def test_the_json_has_one_object_per_trace_and_policy_with_the_named_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "short.csv"
    path.write_text("seconds,requests_per_second\n0,5\n120,0\n")
    args = ["llm", "--json", "--trace", str(path), "--policy", "requests", "--policy", "requests+pending"]
    assert main([*args, "--min-replicas", "1"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["trace"], r["policy"], r["min_replicas"]) for r in rows] == [
        ("short", "requests", 1),
        ("short", "requests+pending", 1),
    ]
    for field in (
        "gpu_seconds",
        "waiting_request_seconds",
        "p95_wait_seconds",
        "ttft_p95_seconds",
        "ms_per_output_token",
        "dropped_requests",
        "scale_changes",
    ):
        assert all(isinstance(r[field], int | float) for r in rows)


def test_the_gpu_simulator_still_runs_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5 * 4  # five traces, four GPU metrics
    assert lines[0].startswith("step     (a) keda-gpu-scaler")


# ---------------------------------------------------------------------------------------------------------
# Fidelity rules.


def test_starting_pods_are_starting_not_missing_as_spec_4_now_counts_them() -> None:
    # The example: 7 fresh pods holding 650, 6 pods starting, target 50 → 13 (the old rule: 19).
    pages = {f"vllm-{i}": Page(93 if i < 6 else 92, 0, 0.3) for i in range(7)}
    starting = tuple(f"vllm-{i}" for i in range(7, 13))
    assert make_policy("requests").desired(signals_with(pages, starting), 13) == 13
    # u ≤ 1: a starting pod counts as the target, so it can never cause a scale-down: 20 + 20 + 50 → 2.
    two = {"vllm-0": Page(20, 0, 0.1), "vllm-1": Page(20, 0, 0.1)}
    assert make_policy("requests").desired(signals_with(two, ("vllm-2",)), 3) == 2
    # Many starting pods beside few Ready ones: still an answer (the half-fresh rule is over Ready pods).
    busy = {"vllm-0": Page(200, 0, 0.3), "vllm-1": Page(200, 0, 0.3)}
    starting = tuple(f"vllm-{i}" for i in range(2, 9))
    assert make_policy("requests").desired(signals_with(busy, starting), 9) == 9
    # All starting: UNAVAILABLE, never 0.
    assert make_policy("requests").desired(signals_with({}, ("vllm-0",)), 1) is None


class _Fixed(Trigger):
    def __init__(self, value: float | None, threshold: float = 10.0) -> None:
        self.fixed, self.threshold = value, threshold

    def value(self, signals: Signals) -> float | None:
        return self.fixed


def test_a_failing_trigger_forbids_a_scale_down_but_not_a_scale_up() -> None:
    signals = signals_with({})
    assert LlmPolicy("p", [_Fixed(20.0), _Fixed(None)]).desired(signals, 5) == 5  # alone it asks for 2
    assert LlmPolicy("p", [_Fixed(20.0)]).desired(signals, 5) == 2
    assert LlmPolicy("p", [_Fixed(80.0), _Fixed(None)]).desired(signals, 5) == 8
    assert LlmPolicy("p", [_Fixed(None)]).desired(signals, 5) is None


def test_the_scale_up_limit_counts_only_scale_ups() -> None:
    hpa = Hpa(Behavior(down_window=0.0), 1, 50, 0.0, 8)
    assert hpa.decide(0.0, 8, 4) == 4  # a scale-down in this period
    # From 4: max(4 + 4 pods, 4 × 2) = 8. Counting the scale-down as a negative scale-up would allow 16.
    assert hpa.decide(5.0, 4, 30) == 8


def _pod(model: ServerModel) -> tuple[Pod, Tally]:
    return Pod("vllm-0", 0.0, 0.0, model), Tally()


def test_kv_blocks_are_taken_for_the_prompt_and_grow_as_tokens_are_generated() -> None:
    model = dataclasses.replace(ServerModel(), kv_capacity_tokens=1000, kv_watermark=0.0)
    pod, tally = _pod(model)
    for _ in range(2):
        pod.enqueue(Request(0.0, 400, 500), 0.0, tally)
    assert pod.batch == 2  # prompt + output (1,800) would not fit; the prompts (800) do
    assert pod.kv_used() == 800
    pod.advance(0.25, 0.25, tally)  # ~30 decode steps: 30 tokens each
    assert 800 < pod.kv_used() <= 1000


def test_a_full_kv_cache_preempts_the_newest_request_which_still_finishes() -> None:
    model = dataclasses.replace(ServerModel(), kv_capacity_tokens=1000, kv_watermark=0.0)
    pod, tally = _pod(model)
    first, second = Request(0.0, 400, 500), Request(0.0, 400, 500)
    pod.enqueue(first, 0.0, tally)
    pod.enqueue(second, 0.0, tally)
    now = 0.0
    while tally.completed < 2 and now < 60:
        now += 0.25
        pod.advance(now, 0.25, tally)
        assert pod.kv_used() <= 1000 or pod.batch == 1
    assert tally.preempted >= 1
    assert tally.completed == 2 and pod.inflight == 0
    assert second.generated > 0  # it was the newer one: preempted after generating some tokens


def test_the_gateway_holds_requests_while_every_ready_pod_is_saturated_and_drops_after_its_ttl() -> None:
    model = dataclasses.replace(ServerModel(), batch_limit=1, gateway_ttl=10.0)
    fleet = Fleet(model, 1, 0.0)
    for _ in range(20):
        fleet.arrive(Request(0.0, 100, 10_000))  # one runs; the pod queues up to its threshold
    pod = fleet.pods[0]
    assert pod.waiting == model.saturation_queue + 1  # 6 waiting: saturated (> 5), the rest held
    assert len(fleet.gateway) == 20 - 1 - pod.waiting
    fleet.step(11.0, 11.0)
    assert fleet.tally.dropped == len([r for r in fleet.tally.waits if r == 10.0]) > 0
    assert fleet.tally.arrived == fleet.tally.completed + fleet.tally.dropped + fleet.in_system()


def test_cold_starts_come_from_the_warm_range_and_longer_when_a_node_must_be_provisioned() -> None:
    model = ServerModel()
    fleet = Fleet(model, 1, 0.0, seed=4)
    fleet.resize(1 + model.node_spare + 3, 0.0)
    starts = sorted(p.ready_at for p in fleet.pods[1:])
    warm, cold = starts[: model.node_spare], starts[model.node_spare :]
    assert all(model.warm_start[0] <= s <= model.warm_start[1] for s in warm)
    assert all(model.warm_start[0] + model.node_start[0] <= s for s in cold)
    assert len(set(starts)) == len(starts)  # drawn, not one constant


def test_demand_is_the_products_finished_plus_the_in_flight_change_over_the_window() -> None:
    views = [
        View(0.0, {"vllm-0": Page(10, 0, 0.1, finished=100)}),
        View(30.0, {"vllm-0": Page(12, 0, 0.1, finished=130), "vllm-1": Page(1, 0, 0.0, finished=0)}),
        View(60.0, {"vllm-0": Page(15, 5, 0.1, finished=160), "vllm-1": Page(4, 0, 0.0, finished=3)}),
    ]
    trigger = make_policy("demand", window=60.0).triggers[0]
    signals = signals_with({}, scrapes=views[:1])
    # The product keeps a pod's points from its first evaluation on: one point is no rate yet.
    assert trigger.value(signals) is None
    for view in views[1:]:  # the HPA asks after every scrape
        signals.scrapes.append(view)
        signals.now, signals.ready = view.at, tuple(view.pages)
        value = trigger.value(signals)
    # vllm-0: (60 finished + 10 more in flight) / 60 s; vllm-1, younger than the window: (3 + 3) / 30 s.
    assert value == pytest.approx(70 / 60 + 6 / 30)


def test_pending_requests_add_to_demand_in_tokens_at_the_pods_tokens_per_request() -> None:
    # 1 req/s at the pods, each 1,000 prompt and 200 generated tokens; the pool holds 0, then 300.
    views = [
        View(t, {"vllm-0": Page(10, 0, 0.1, t, 1_000 * t, 200.0 * t, 1_000 * t, 200 * t)})
        for t in (0, 30, 60)
    ]
    held = {0: 0, 30: 0, 60: 300}
    requests = make_policy("demand+pending", window=30.0, threshold=1.0).triggers[0]
    tokens = make_policy("demand-tokens+pending", window=30.0, weight=1.0, threshold=1.0).triggers[0]
    values = []
    for trigger in (requests, tokens):
        signals = signals_with({}, scrapes=views[:1])
        for view in views:  # the product reads the pool's pending requests when it evaluates
            if view.at:
                signals.scrapes.append(view)
                signals.now, signals.ready = view.at, ("vllm-0",)
            signals.pending_history.append((view.at, held[int(view.at)]))
            value = trigger.value(signals)
        values.append(value)
    # 300 pending grew by 10/s over the window and clear in one window: + 10 + 10.
    assert values[0] == pytest.approx(1 + 20)
    # In tokens each request is 1,200 weighted tokens: the pending part is weighed the same.
    assert values[1] == pytest.approx(1_200 * (1 + 20))


def test_the_pareto_judge_beats_only_beyond_the_noise() -> None:
    def runs(gpu: list[float], wait: list[float]) -> list[LlmRun]:
        made = []
        for g, w in zip(gpu, wait, strict=True):
            made.append(LlmRun(WAKE, make_policy("requests"), 60.0, gpu_seconds=g, waiting_request_seconds=w))
        return made

    ours = runs([100, 110, 90, 105, 95], [10_000, 12_000, 9_000, 11_000, 10_000])
    cheaper = runs([80, 88, 72, 84, 76], [10_000, 12_000, 9_000, 11_000, 10_000])
    assert versus(ours, cheaper).beaten and versus(cheaper, ours).beats
    cheaper_but_waits = runs([80, 88, 72, 84, 76], [20_000, 24_000, 18_000, 22_000, 20_000])
    assert not versus(ours, cheaper_but_waits).beaten
    within_noise = runs([98, 108, 89, 103, 94], [9_900, 11_800, 9_000, 10_900, 10_000])
    assert not versus(ours, within_noise).beaten
    noisy = runs([60, 150, 60, 150, 60], [10_000, 12_000, 9_000, 11_000, 10_000])
    assert not versus(ours, noisy).beaten  # cheaper on average, but not beyond the seeds' spread


def test_oracle_sizes_at_each_mixs_capacity() -> None:
    trace = mix_shift_trace(POD_RATE)
    oracle = make_policy("oracle", trace=trace)
    trigger = oracle.triggers[0]
    assert isinstance(trigger, OracleTrigger)
    chat, rag = trace.segments[0], trace.segments[1]
    assert trigger.needed(10.0) == pytest.approx(chat.rate / demand_threshold())
    assert trigger.needed(rag.start + 10) > 2 * rag.rate / demand_threshold()  # long prompts: fewer per pod
    with pytest.raises(ValueError, match="needs the trace"):
        make_policy("clairvoyant")


@pytest.mark.parametrize("window", ["1", "9", "601", "nan"])
def test_a_window_outside_its_range_is_refused_naming_it(
    window: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["llm", "--json", "--policy", "demand", "--window", window])
    assert exit_.value.code == 2
    assert f"--window {window}: must be between 10 and 600 seconds" in capsys.readouterr().err


def test_more_seeds_add_to_the_runs_of_the_first_instead_of_replacing_them() -> None:
    first, second, other = (run(WAKE, "requests", seed=s) for s in (1, 2, 3))
    runs = extend({("wake", "requests"): [first]}, {("wake", "requests"): [second], ("wake", "x"): [other]})
    assert runs[("wake", "requests")] == [first, second]
    assert runs[("wake", "x")] == [other]


def test_the_products_latency_guard_reads_the_simulated_pods_ttft_buckets() -> None:
    """The same steady demand; only the TTFT the pod's histogram shows differs, read through the
    product with a 2 s target: 0.1 s keeps the demand, 6 s over target adds a pod's worth."""

    def view(at: float, ttft: float) -> View:
        done = int(at)  # 1 request/s finishes, steadily: no headroom for variability
        ttfts = [0] * (len(TTFT_BOUNDS) + 1)
        tpots = [0] * (len(TPOT_BOUNDS) + 1)
        for _ in range(done):
            observe(ttfts, TTFT_BOUNDS, ttft)
            observe(tpots, TPOT_BOUNDS, 0.02)
        page = Page(10, 0, 0.1, done, 1_000 * done, 200.0 * done, 1_000 * done, 200 * done,
                    ttft * done, done, 0.02 * done, tuple(ttfts), tuple(tpots))  # fmt: skip
        return View(at, {"vllm-0": page})

    values = {}
    for ttft in (0.1, 6.0):
        trigger = make_policy("demand", window=30.0, threshold=1.0).triggers[0]
        assert isinstance(trigger, ProductTrigger)
        trigger.metadata["sloTtftSeconds"] = "2"
        views = [view(t, ttft) for t in (0.0, 15.0, 30.0, 45.0, 60.0)]
        signals = signals_with({}, scrapes=views[:1])
        for later in views[1:]:
            signals.scrapes.append(later)
            signals.now, signals.ready = later.at, ("vllm-0",)
            values[ttft] = trigger.value(signals)
    assert values[0.1] == pytest.approx(1.0)
    assert values[6.0] == pytest.approx(2.0)  # 1 Ready pod + 1: the guard's smallest step


class _Leftover:
    """Garbage of the parent with a finalizer (as a gRPC channel a test left behind): it says where it ran."""

    def __init__(self, marks: Path) -> None:
        self.marks = marks
        self.me = self  # a cycle: only the collector frees it

    def __del__(self) -> None:
        with self.marks.open("a") as out:
            out.write(f"{os.getpid()}\n")


def _collect(_: int) -> int:
    return gc.collect()


def test_forked_workers_never_finalize_the_parents_garbage(tmp_path: Path) -> None:
    from bench.simulator.llm_run import forked_workers

    marks = tmp_path / "finalized"
    enabled = gc.isenabled()
    gc.disable()  # the parent has not collected it yet when the workers are forked
    try:
        _Leftover(marks)
        with forked_workers(2) as pool:
            pool.map(_collect, [0, 1], chunksize=1)
    finally:
        if enabled:
            gc.enable()
    # Finalized once, here, before the fork: never in a worker, where its threads would not exist.
    assert marks.read_text().split() == [str(os.getpid())]


@pytest.mark.parametrize("policy", ["requests+pending", "demand+pending", "demand-tokens+pending"])
def test_the_wake_is_the_products_pending_trigger_asked_through_its_servicer(policy: str) -> None:
    made = make_policy(policy)
    assert isinstance(made.push, PendingTrigger)
    # `metric: pending` names the pool and no pods, as the README writes it (the product refuses a prefix).
    assert made.push.metadata == {
        "threshold": made.push.metadata["threshold"],
        "metric": "pending",
        "inferencePool": POOL,
    }
    assert all(isinstance(t, ProductTrigger) for t in made.triggers)  # requests+pending: both HPA metrics
    signals = signals_with({"vllm-0": Page(80, 10, 0.9)})
    signals.pending, signals.now = 3, 1.0
    signals.pending_history.append((1.0, 3))
    # The product reads the picker's page the simulated gateway showed: 3 requests held, active.
    assert made.push.value(signals) == 3.0
    assert made.push.active(signals) is True
    assert made.pushed(signals) and not made.pushed(signals)  # once per inactive → active change


def test_the_products_pending_wakes_a_pool_at_zero_within_a_gateway_read() -> None:
    result = run(WAKE, "demand-tokens+pending", ttl=120.0)
    woke = next(at for at, before, after, _ in result.events if before == 0 and after > 0)
    assert 300.0 < woke <= 302.0  # the first request arrives just after 300 s; the page is read every second
