"""GPU-utilisation workloads: exporter and Prometheus delays, four ways to feed KEDA and the HPA a GPU metric."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench.simulator.autoscaling import Behavior, Hpa, Keda, due
from bench.simulator.llm_product import SimulatedScaler
from keda_gpu_scaler.core.scaling import desired_replicas_average_value

# ---------------------------------------------------------------------------------------------------------
# The workload and the pipelines that turn its GPUs into a metric.


@dataclass(frozen=True)
class Pod:
    name: str
    created: float
    ready_at: float


@dataclass(frozen=True)
class World:
    """What exists at one instant: the pods, starting or ready."""

    now: float
    pods: tuple[Pod, ...]


def utilization(demand: float, pods: Sequence[Pod], now: float) -> dict[str, float]:
    """Demand is in pods' worth of work, shared evenly by the ready pods; each pod's GPUs run at min(100, share)."""
    ready = [p for p in pods if p.ready_at <= now]
    share = 100.0 * demand / len(ready) if ready else 0.0
    return {p.name: (min(100.0, share) if p.ready_at <= now else 0.0) for p in pods}


@dataclass
class Snapshot:
    """The series one collector last saw: pod → utilisation (one value per pod; `gpus` GPUs each)."""

    at: float = -math.inf
    pods: dict[str, float] = field(default_factory=dict)
    replicas: int = 0  # kube_deployment_status_replicas, scraped alongside (the DOKS query needs it)


class Policy:
    """How a metric reaches KEDA and the HPA: who collects, how often, and what query returns it."""

    key: str = ""
    label: str = ""
    target: float = 70.0
    activation_threshold: float = 0.0
    interval: float = 15.0  # the collector's scrape interval
    push: bool = False

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.seen = Snapshot()

    def collect(self, exporter: Snapshot, replicas: int) -> None:
        self.seen = Snapshot(exporter.at, dict(exporter.pods), replicas)

    def value(self, world: World) -> float | None:
        """The value KEDA returns to the HPA now (None: an error, the HPA keeps the replica count)."""
        raise NotImplementedError


class ScalerPolicy(Policy):
    """(a) This scaler: per-pod values summed over the target's pods, by the product's own code."""

    key, label, target, activation_threshold, interval, push = (
        "a",
        "(a) keda-gpu-scaler",
        70.0,
        5.0,
        5.0,
        True,
    )

    def __init__(self, gpus: int) -> None:
        super().__init__(gpus)
        self.scaler = SimulatedScaler()
        self.metadata = {"podNamePrefix": "w-", "threshold": f"{self.target:g}", "activationThreshold": "5"}
        self.ref = self.scaler.follow(self.metadata)
        self._fed = -math.inf

    def value(self, world: World) -> float | None:
        """The product's GetMetrics on the exporter pages collected so far."""
        if self.seen.at > self._fed:
            self.scaler.scrape_exporters(self.seen.at, self.seen.pods, self.gpus)
            self._fed = self.seen.at
        # With Kubernetes discovery the targets are the pods that exist now, whether the page has them yet.
        self.scaler.cluster(world.now, (p.name for p in world.pods))
        return self.scaler.metric(self.ref)


class AksPolicy(Policy):
    """(b) AKS tutorial: avg(DCGM_FI_DEV_GPU_UTIL) over the deployment's GPUs, threshold 5, AverageValue."""

    key, label, target = "b", "(b) AKS: avg, threshold 5", 5.0

    def value(self, world: World) -> float | None:
        series = [u for u in self.seen.pods.values() for _ in range(self.gpus)]
        # Prometheus's avg(); no series: KEDA's ignoreNullValues makes the empty result 0.
        return math.fsum(series) / len(series) if series else 0.0


class DoksPolicy(Policy):
    """(c) DOKS tutorial: sum(per-pod gauge) / sum(kube_deployment_status_replicas), threshold 80."""

    key, label, target = "c", "(c) DOKS: sum/replicas, threshold 80", 80.0

    def value(self, world: World) -> float | None:
        if not self.seen.replicas:
            return 0.0
        return sum(self.seen.pods.values()) / self.seen.replicas


class PerGpuSumPolicy(Policy):
    """(d) sum(DCGM_FI_DEV_GPU_UTIL) over GPUs without collapsing pods first, threshold 70."""

    key, label, target = "d", "(d) per-GPU sum, threshold 70", 70.0

    def value(self, world: World) -> float | None:
        return sum(u * self.gpus for u in self.seen.pods.values())


POLICIES: tuple[type[Policy], ...] = (ScalerPolicy, AksPolicy, DoksPolicy, PerGpuSumPolicy)


# ---------------------------------------------------------------------------------------------------------
# Scenarios and the simulation loop.


@dataclass(frozen=True)
class Trace:
    name: str
    duration: int
    demand: Callable[[float], float]
    # The demand change after which "time to steady state" is measured, and the end of that segment.
    settle_from: float | None
    settle_until: float | None = None
    min_replicas: int = 1
    description: str = ""


def _step(t: float) -> float:
    return 8.0 if 300 <= t < 2100 else 2.0


def _ramp(t: float) -> float:
    if t < 300:
        return 1.0
    if t < 1500:
        return 1.0 + 9.0 * (t - 300) / 1200
    if t < 2400:
        return 10.0
    if t < 3000:
        return 10.0 - 9.0 * (t - 2400) / 600
    return 1.0


def _spike(t: float) -> float:
    return 12.0 if 900 <= t < 1020 else 3.0


def _diurnal(t: float) -> float:
    # A day compressed into an hour, with a deterministic wobble so no two minutes are alike.
    base = 1.0 + 9.0 * (1 - math.cos(2 * math.pi * t / 3600)) / 2
    return max(0.0, base + 0.6 * math.sin(2 * math.pi * t / 170) * math.sin(2 * math.pi * t / 610))


def _idle(t: float) -> float:
    return 0.0 if 600 <= t < 840 or 1800 <= t < 3000 else 4.0


TRACES: tuple[Trace, ...] = (
    Trace("step", 3600, _step, 300, 2100, description="2 → 8 pods' worth at 5 min, back to 2 at 35 min"),
    Trace(
        "ramp", 3600, _ramp, 1500, 2400, description="1 → 10 over 20 min, hold 15 min, down to 1 over 10 min"
    ),
    Trace("spike", 2400, _spike, 1020, 2400, description="3, with a 2-minute spike to 12 at 15 min"),
    Trace(
        "diurnal", 3600, _diurnal, None, description="1 → 10 → 1 as a day compressed into an hour, wobbling"
    ),
    Trace(
        "idle",
        3600,
        _idle,
        None,
        min_replicas=0,
        description="minReplicaCount 0: 4, idle 4 min, 4, idle 20 min, 4 again",
    ),
)


@dataclass(frozen=True)
class Timing:
    """Periods and phases (seconds) of every loop; phases differ so no two loops tick in lockstep."""

    exporter_refresh: float = 30.0
    exporter_phase: float = 0.0
    collector_phase: float = 2.0
    hpa_phase: float = 7.0
    keda_phase: float = 11.0
    pod_startup: float = 60.0
    gpus_per_pod: int = 4
    max_replicas: int = 20
    target_utilization: float = 70.0  # the yardstick for "over-provisioned"


@dataclass
class Run:
    policy: Policy
    trace: Trace
    times: list[float] = field(default_factory=list)
    demand: list[float] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)
    ideal: list[int] = field(default_factory=list)
    under: float = 0.0  # GPU-seconds of demand with no ready GPU to run on
    over: float = 0.0  # GPU-seconds allocated beyond what the target utilisation needs
    change_times: list[float] = field(default_factory=list)
    settle: float | None = None  # seconds from `settle_from` to the last change (None: never settled)
    settled_at: int | None = None

    @property
    def changes(self) -> int:
        return len(self.change_times)


def simulate(policy_type: type[Policy], trace: Trace, timing: Timing = Timing()) -> Run:
    policy = policy_type(timing.gpus_per_pod)
    behavior = Behavior()
    keda = Keda(trace.min_replicas, timing.max_replicas)
    start = max(keda.hpa_min, math.ceil(trace.demand(0) * 100 / timing.target_utilization))
    pods = [Pod(f"w-{i}", -3600.0, -3600.0) for i in range(start)]
    serial = start
    hpa = Hpa(behavior, keda.hpa_min, keda.max_replica_count, 0.0, len(pods))
    exporter = Snapshot()
    was_active = False
    run = Run(policy, trace)

    def resize(target: int, now: float) -> None:
        nonlocal serial
        if target == len(pods):
            return
        run.change_times.append(now)
        while len(pods) < target:
            pods.append(Pod(f"w-{serial}", now, now + timing.pod_startup))
            serial += 1
        # A ReplicaSet removes starting pods before ready ones, and newer before older.
        pods.sort(key=lambda p: (p.ready_at <= now, -p.created), reverse=True)
        del pods[target:]

    for step in range(trace.duration):
        now = float(step)
        demand = trace.demand(now)
        util = utilization(demand, pods, now)
        world = World(now, tuple(pods))
        if due(now, timing.exporter_refresh, timing.exporter_phase):
            exporter = Snapshot(now, dict(util))
        if due(now, policy.interval, timing.collector_phase):
            policy.collect(exporter, len(pods))
            if policy.push:
                value = policy.value(world)
                active = was_active if value is None else value > policy.activation_threshold
                if active and not was_active:
                    resize(keda.push(now, len(pods)), now)
                was_active = active
        if due(now, keda.polling, timing.keda_phase):
            value = policy.value(world)
            resize(
                keda.poll(now, None if value is None else value > policy.activation_threshold, len(pods)), now
            )
        if due(now, behavior.sync, timing.hpa_phase) and pods:
            value = policy.value(world)
            if value is not None:  # a failed metric: the HPA leaves the replica count alone
                desired = desired_replicas_average_value(value, policy.target, len(pods))
                resize(hpa.decide(now, len(pods), desired), now)
        ideal = math.ceil(demand * 100 / timing.target_utilization - 1e-9)
        ready = sum(1 for p in pods if p.ready_at <= now)
        run.under += max(0.0, demand - ready) * timing.gpus_per_pod
        run.over += max(0, len(pods) - ideal) * timing.gpus_per_pod
        run.times.append(now)
        run.demand.append(demand)
        run.replicas.append(len(pods))
        run.ideal.append(ideal)

    if trace.settle_from is not None:
        run.settle, run.settled_at = settling(
            run.change_times, run.replicas, trace.settle_from, trace.settle_until
        )
    return run


def settling(
    change_times: Sequence[float], replicas: Sequence[int], since: float, until: float | None
) -> tuple[float | None, int | None]:
    """Seconds from `since` to the last replica change before `until`, and the count then held; None when
    the count still changed in the segment's last 10 minutes (it never settled)."""
    end = len(replicas) if until is None else until
    inside = [t for t in change_times if since <= t < end]
    if not inside:
        return 0.0, replicas[int(since)]
    if end - inside[-1] < 600:
        return None, None
    return inside[-1] - since, replicas[int(inside[-1])]


def simulate_all(timing: Timing = Timing()) -> dict[str, list[Run]]:
    return {trace.name: [simulate(p, trace, timing) for p in POLICIES] for trace in TRACES}
