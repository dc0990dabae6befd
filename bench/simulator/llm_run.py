"""One LLM fleet under one policy through one trace, on a fixed time step, and what it cost."""

from __future__ import annotations

import bisect
import gc
import math
import multiprocessing
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from bench.simulator.autoscaling import Behavior, Hpa, Keda, due
from bench.simulator.llm_fleet import Fleet, Request, ServerModel
from bench.simulator.llm_policies import MAX_REPLICAS, POD_RATE, LlmPolicy, make_policy
from bench.simulator.llm_signals import Signals, Timing, random_timing
from bench.simulator.llm_traces import Arrivals, LlmTrace, draw_arrivals

STEP = 0.25  # seconds per simulation step (decode steps are 7–20 ms: a step holds tens of them)
SAMPLE = 5.0  # seconds between the points kept for plots


@dataclass(frozen=True)
class Slo:
    """A request meets it when its TTFT and its mean time per output token are both within target."""

    ttft: float = 2.0  # s
    tpot: float = 0.050  # s
    attainment: float = 0.95  # the share of requests that must meet both (what the user states)

    def metadata(self) -> dict[str, str]:
        """The SLO as a demand trigger states it (sloTtftSeconds, sloTpotMs, sloAttainment)."""
        return {
            "sloTtftSeconds": f"{self.ttft:g}",
            "sloTpotMs": f"{self.tpot * 1000:g}",
            "sloAttainment": f"{self.attainment:g}",
        }


@dataclass(frozen=True)
class Realism:
    """What makes a run more like a cluster: every loop at its own seeded random phase, and (when
    `disruption_every` is set) a Ready pod restarting or vanishing at random, on average that often (s)."""

    random_phases: bool = True
    disruption_every: float | None = 1200.0


STEADY = Realism(disruption_every=None)  # every run: random phases; pods that never fail


def slo_attainment(ttfts: list[float], tpots: list[float], failed: int, slo: Slo) -> float:
    """The share of judged requests that met the SLO: completed ones (their TTFT and TPOT) plus `failed`
    ones (dropped, still waiting past the TTFT target at the end, or running then with their first token
    past it), which all missed. 1.0 when none."""
    met = sum(1 for ttft, tpot in zip(ttfts, tpots, strict=True) if ttft <= slo.ttft and tpot <= slo.tpot)
    judged = len(ttfts) + failed
    return met / judged if judged else 1.0


@dataclass
class LlmRun:
    trace: LlmTrace
    policy: LlmPolicy
    gateway_ttl: float
    gpu_seconds: float = 0.0
    quiet_gpu_seconds: float = 0.0  # GPU-seconds while nothing arrives and nothing is in the system
    waiting_request_seconds: float = 0.0
    p95_wait_seconds: float = 0.0
    ttft_p95_seconds: float = 0.0
    preempted: int = 0
    arrived: int = 0
    completed: int = 0
    dropped: int = 0
    in_system: int = 0
    scale_changes: int = 0
    seconds_per_token: float = (
        0.0  # first → last token, per output token after the first (completed requests)
    )
    slo_attainment: float | None = None  # with an Slo: see slo_attainment
    disruptions: int = 0  # pods restarted or vanished
    first_waits_after_quiet: list[float | None] = field(default_factory=list)  # None: dropped
    # Every replica change: (time, replicas before, after, requests waiting for a slot or a pod then).
    events: list[tuple[float, int, int, int]] = field(default_factory=list)
    # Every HPA sync: (time, replicas, what the metrics asked for, what the HPA set within its behaviour).
    decisions: list[tuple[float, int, int, int]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)

    @property
    def scale_downs_while_waiting(self) -> int:
        return sum(1 for _, before, after, waiting in self.events if after < before and waiting > 0)

    def first_decision_after(self, t: float) -> tuple[float, int, int] | None:
        """The first HPA decision after time t that changed the count: (seconds after t, what the metrics
        asked for, what the HPA set)."""
        return next(
            (
                (at - t, asked, set_)
                for at, current, asked, set_ in self.decisions
                if at > t and set_ != current
            ),
            None,
        )

    def summary(self) -> dict[str, Any]:
        return {
            "trace": self.trace.name,
            "policy": self.policy.name,
            "min_replicas": self.policy.min_replicas,
            "gateway_ttl_seconds": self.gateway_ttl,
            "gpu_seconds": round(self.gpu_seconds, 1),
            "quiet_gpu_seconds": round(self.quiet_gpu_seconds, 1),
            "waiting_request_seconds": round(self.waiting_request_seconds, 1),
            "p95_wait_seconds": round(self.p95_wait_seconds, 2),
            "ttft_p95_seconds": round(self.ttft_p95_seconds, 2),
            "dropped_requests": self.dropped,
            "scale_changes": self.scale_changes,
            "scale_downs_while_waiting": self.scale_downs_while_waiting,
            "arrived_requests": self.arrived,
            "completed_requests": self.completed,
            "requests_in_system_at_end": self.in_system,
            "max_replicas": max(self.replicas, default=0),
            "ms_per_output_token": round(1000 * self.seconds_per_token, 1),
            "preemptions": self.preempted,
            "first_wait_after_quiet_seconds": [
                None if w is None else round(w, 1) for w in self.first_waits_after_quiet
            ],
        } | ({} if self.slo_attainment is None else {"slo_attainment": round(self.slo_attainment, 4)})


def initial_replicas(trace: LlmTrace, policy: LlmPolicy, unit: float) -> int:
    """Start from the fleet the first rate needs (a warm start), or from zero when it is 0 and allowed."""
    needed = math.ceil(trace.rate_at(0.0) / unit) if unit > 0 else 1
    return max(policy.min_replicas, needed)


def simulate_llm(
    trace: LlmTrace,
    arrivals: Arrivals,
    policy: LlmPolicy,
    unit: float,
    model: ServerModel | None = None,
    timing: Timing | None = None,
    behavior: Behavior | None = None,
    seed: int = 0,
    realism: Realism = STEADY,
    slo: Slo | None = None,
) -> LlmRun:
    """`behavior` overrides the policy's own; `seed` draws the cold starts, the loops' phases (unless
    `timing` fixes them) and the pod disruptions, the same for every policy; `slo` adds the run's SLO
    attainment."""
    model = model or ServerModel()
    behavior = behavior or policy.behavior
    if timing is None:
        timing = (
            random_timing(seed, STEP, behavior.sync, policy.polling) if realism.random_phases else Timing()
        )
    disruptions = _disruptions(seed, trace.duration, realism, model)
    start = initial_replicas(trace, policy, unit)
    fleet = Fleet(model, start, 0.0, seed)
    keda = Keda(policy.min_replicas, MAX_REPLICAS, polling=policy.polling, cooldown=policy.cooldown)
    hpa = Hpa(behavior, keda.hpa_min, MAX_REPLICAS, 0.0, start)
    signals = Signals(timing)
    run = LlmRun(trace, policy, model.gateway_ttl)
    watched = _first_after_quiet(trace, arrivals)
    times, prompts, outputs = arrivals.times, arrivals.prompts, arrivals.outputs
    index, total = 0, len(times)
    steps = round(trace.duration / STEP)

    def resize(target: int, now: float) -> None:
        before = fleet.replicas
        if fleet.resize(target, now):
            run.scale_changes += 1
            run.events.append((now, before, target, fleet.waiting()))

    for step in range(steps + 1):
        now = step * STEP
        while disruptions and disruptions[-1][0] <= now:
            _, pick, vanish, reload = disruptions.pop()
            fleet.disrupt(now, pick, vanish, reload)
            run.disruptions += 1
        if step:
            fleet.step(now, STEP)
            gpus = fleet.gpus() * STEP
            run.gpu_seconds += gpus
            if gpus and trace.rate_at(now - STEP) == 0 and not fleet.in_system():
                run.quiet_gpu_seconds += gpus
        gateway_read, scraped = signals.tick(now, fleet)
        policy.tick(now, signals, fleet, scraped)
        # KEDA acts on a push only at minReplicaCount 0 (it wakes from 0, restarts the cooldown to 0):
        # above, the stream's answer changes nothing, so the product is not asked it every second.
        if gateway_read and keda.min_replica_count == 0 and policy.pushed(signals):
            resize(keda.push(now, fleet.replicas), now)
        if due(now, keda.polling, timing.keda_phase):
            resize(keda.poll(now, policy.active(signals), fleet.replicas), now)
        if fleet.replicas and due(now, behavior.sync, timing.hpa_phase):
            desired = policy.desired(signals, fleet.replicas)
            if desired is not None:
                decided = hpa.decide(now, fleet.replicas, desired)
                run.decisions.append((now, fleet.replicas, desired, decided))
                resize(decided, now)
        if due(now, SAMPLE, 0.0):
            run.times.append(now)
            run.replicas.append(fleet.replicas)
            run.ready.append(len(fleet.ready_pods()))
            run.waiting.append(fleet.waiting())
            run.rate.append(trace.rate_at(now))
        end = now + STEP
        while index < total and times[index] < end:
            request = Request(times[index], prompts[index], outputs[index])
            if index in watched:
                watched[index] = request
            fleet.arrive(request)
            index += 1

    tally = fleet.tally
    end_time = steps * STEP
    still_waiting = [r.arrived for r in fleet.gateway] + [
        r.arrived for pod in (*fleet.pods, *fleet.draining) for r in pod.queue
    ]
    run.waiting_request_seconds = math.fsum(tally.waits) + math.fsum(end_time - t for t in still_waiting)
    run.p95_wait_seconds = _p95(tally.waits)
    # A request still waiting at the end has waited at least this long for its first token.
    run.ttft_p95_seconds = _p95(tally.ttfts + [end_time - t for t in still_waiting])
    run.preempted = tally.preempted
    run.arrived, run.completed, run.dropped = tally.arrived, tally.completed, tally.dropped
    run.in_system = fleet.in_system()
    run.seconds_per_token = tally.decode_seconds / tally.decode_tokens if tally.decode_tokens else 0.0
    run.first_waits_after_quiet = [_wait(r) for r in watched.values()]
    if slo is not None:
        # Running ones whose first token came (or comes) past the target missed it too.
        late = sum(1 for t in still_waiting if end_time - t > slo.ttft) + sum(
            1
            for pod in (*fleet.pods, *fleet.draining)
            for r in pod.active.values()
            if r.first_token - r.arrived > slo.ttft
        )
        run.slo_attainment = slo_attainment(tally.done_ttft, tally.done_tpot, tally.dropped + late, slo)
    return run


def _disruptions(
    seed: int, duration: float, realism: Realism, model: ServerModel
) -> list[tuple[float, float, bool, float]]:
    """(time, which Ready pod ∈ [0, 1), vanishes rather than restarts, seconds to reload), latest first."""
    if realism.disruption_every is None:
        return []
    rng = random.Random(seed ^ 0xD15)
    events, t = [], 0.0
    while (t := t + rng.expovariate(1 / realism.disruption_every)) < duration:
        events.append((t, rng.random(), rng.random() < 0.5, rng.uniform(*model.warm_start)))
    return events[::-1]


def _first_after_quiet(trace: LlmTrace, arrivals: Arrivals) -> dict[int, Request | None]:
    watched: dict[int, Request | None] = {}
    for end in trace.quiet_ends():
        index = bisect.bisect_left(arrivals.times, end)
        if index < len(arrivals.times):
            watched[index] = None
    return watched


def _wait(request: Request | None) -> float | None:
    if request is None or request.dropped:
        return None
    if request.admitted is None:
        return math.inf
    return request.admitted - request.arrived


def _p95(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def run_matrix(
    traces: list[LlmTrace],
    policies: tuple[str, ...],
    seed: int,
    min_replicas: int | None = None,
    model: ServerModel | None = None,
    unit: float = POD_RATE,
    requests_target: float | None = None,
    **options: Any,
) -> list[LlmRun]:
    """Every policy through every trace, two runs at a time (one per core); each trace's arrivals and cold
    starts are drawn once and replayed for all. `options` go to make_policy (window, threshold, weight,
    behavior)."""
    jobs = []
    for trace in traces:
        arrivals = draw_arrivals(trace, seed)
        jobs += [
            (trace, arrivals, name, seed, min_replicas, model, unit, requests_target, options)
            for name in policies
        ]
    if len(jobs) == 1:
        return [_run_job(jobs[0])]
    with forked_workers(min(2, len(jobs))) as pool:
        return pool.map(_run_job, jobs, chunksize=1)


@contextmanager
def forked_workers(processes: int) -> Iterator[multiprocessing.pool.Pool]:
    """A pool of workers forked from this process, which inherit what it computed (calibrations), with
    none of its garbage: collected first, and what is left frozen, so a worker's collector never finalizes
    an object of the parent. A gRPC object left over from a test of the same process, finalized in a
    worker, joined a gRPC thread that only the parent has, and spun there for good (the judge's test
    stalled in 2 of 4 full runs)."""
    gc.collect()
    gc.freeze()
    try:
        pool = multiprocessing.Pool(processes)
    finally:
        gc.unfreeze()
    with pool:
        yield pool


def _run_job(job: tuple[Any, ...]) -> LlmRun:
    trace, arrivals, name, seed, min_replicas, model, unit, requests_target, options = job
    policy = make_policy(name, min_replicas, requests_target, trace=trace, model=model, **options)
    return simulate_llm(trace, arrivals, policy, unit, model, seed=seed)
