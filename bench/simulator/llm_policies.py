"""The policies a user would configure for an LLM fleet, each a list of KEDA triggers as written in a
ScaledObject (and, for llm-d's saturation autoscaler, its controller), with its HPA behaviour. The HPA
takes the largest of the triggers' replica counts, each from the product's own formula
(scaling.hpa_desired_replicas); a trigger that fails forbids a scale-down, as in the HPA."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from bench.simulator.autoscaling import Behavior
from bench.simulator.llm_calibrate import capacity
from bench.simulator.llm_fleet import Fleet, ServerModel
from bench.simulator.llm_product import POOL
from bench.simulator.llm_signals import Signals, View
from bench.simulator.llm_traces import OUTPUT_MEAN, PROMPT_MEAN, LlmTrace
from keda_gpu_scaler.core.scaling import hpa_desired_replicas

# Target requests in flight per pod, chosen as a user would from a concurrency sweep of one pod: in this
# model a pod peaks at 16.1 req/s (prefill-bound) and holds 50 requests in flight at 70 % of that
# (11.3 req/s), the same headroom as the GPU policy's threshold 70. POD_RATE is that 70 %: the traces'
# unit, so "4 pods' worth" of traffic is 4 × POD_RATE.
REQUESTS_TARGET = 50
POD_RATE = 11.3
GPU_THRESHOLD = 70.0  # this scaler's GPU example threshold
AKS_THRESHOLD = 5.0  # Azure's AKS tutorial: avg(DCGM_FI_DEV_GPU_UTIL), threshold 5, maxReplicaCount 20
QUEUE_THRESHOLD = 5.0  # waiting requests per pod: the EPP's saturation queue depth
KV_THRESHOLD = 70.0  # % KV cache per pod
MAX_REPLICAS = 20  # the AKS tutorial's maxReplicaCount, for every policy
DEMAND_WINDOW = 30.0  # demand's `window` default (s), chosen in docs/BENCHMARKS.md
TOKEN_WEIGHT = 1.0  # a prompt token against a generated one, chosen in docs/BENCHMARKS.md
EPP_QUEUE_TARGET = 1.0  # llm-d's KEDA recipe: sum(flow_control_queue_size), 1 per replica
EPP_RUNNING_TARGET = 16.0  # … and the EPP's running requests, 16 per replica
# The behaviour this project's LLM examples ship (chosen in docs/BENCHMARKS.md), and llm-d's recipe's.
DEMAND_BEHAVIOR = Behavior(down_window=120.0)
LLMD_BEHAVIOR = Behavior(up_pods=0, up_percent=100.0, up_period=15.0, down_window=300.0)


def demand_threshold(prompt_mean: float = PROMPT_MEAN, output_mean: float = OUTPUT_MEAN) -> float:
    """The README's rule: the rate one replica serves at the latency target, measured on a load ramp of
    one pod with the traffic's mix (the simulator's calibration mix is the Azure conversation trace)."""
    return capacity(prompt_mean, output_mean)


def demand_tokens_threshold(weight: float = TOKEN_WEIGHT) -> float:
    """The same ramp read in weighted tokens per second."""
    return demand_threshold() * (weight * PROMPT_MEAN + OUTPUT_MEAN)


class Trigger:
    threshold: float = 1.0

    def value(self, signals: Signals) -> float | None:
        """The metric KEDA hands the HPA now; None: an error (the HPA keeps the replica count)."""
        raise NotImplementedError

    def active(self, signals: Signals) -> bool | None:
        """KEDA's IsActive (activation threshold 0); None: an error."""
        value = self.value(signals)
        return None if value is None else value > 0


class ProductTrigger(Trigger):
    """A trigger of this scaler, as a ScaledObject writes it: its value and activity are what the
    product's servicer answers (GetMetrics, IsActive) from the pages the simulated cluster showed it."""

    def __init__(self, threshold: float, metadata: dict[str, str]) -> None:
        self.threshold = threshold
        self.metadata = {"threshold": f"{threshold!r}", "podNamePrefix": "vllm-", **metadata}
        self.target_changes: list[tuple[float, float]] = []  # a learned target's moves: (time, target)

    def learn(self, start: float) -> None:
        """`threshold: auto` from `thresholdStart: start`, on an `external-push` trigger: the HPA holds
        the target the product publishes (StreamMetricSpec), asked as GetMetricSpec at each HPA read."""
        self.threshold = start
        self.metadata |= {"threshold": "auto", "thresholdStart": f"{start!r}"}

    def value(self, signals: Signals) -> float | None:
        if self.metadata["threshold"] == "auto":
            target = signals.cluster.target(signals, self.metadata)
            if target != self.threshold:
                self.threshold = target
                self.target_changes.append((signals.now, target))
        return signals.cluster.metric(signals, self.metadata)

    def active(self, signals: Signals) -> bool | None:
        return signals.cluster.active(signals, self.metadata)


class ScalerTrigger(ProductTrigger):
    """`metric: requests`, `queue`, `kv_cache` on the pods' pages or `utilization` on their GPU exporters."""

    def __init__(self, metric: str, threshold: float) -> None:
        super().__init__(threshold, {"metric": metric})
        self.metric = metric


class PendingTrigger(ProductTrigger):
    """`metric: pending` (SPEC §7): the requests the pool's endpoint picker holds, as the product reads the
    picker's page. It names no pods (the product refuses podNamePrefix on it)."""

    def __init__(self, threshold: float) -> None:
        super().__init__(threshold, {"metric": "pending", "inferencePool": POOL})
        del self.metadata["podNamePrefix"]


class DemandTrigger(ProductTrigger):
    """`metric: demand` (SPEC §6): Σ λ over the Ready pods, in requests or weighted tokens per second;
    with `inferencePool`, the gateway's pending requests add their growth and what clears them within
    the window."""

    def __init__(
        self, threshold: float, window: float, weight: float | None = None, pending: bool = False
    ) -> None:
        metadata = {"metric": "demand", "window": f"{window:g}"}
        if weight is not None:
            metadata |= {"demandUnit": "tokens", "prefillWeight": f"{weight:g}"}
        if pending:
            metadata["inferencePool"] = POOL
        super().__init__(threshold, metadata)
        self.pending = pending


class OracleTrigger(Trigger):
    """A limit, not a product: the replicas the true arrival rate and mix need at the same operating point
    (each mix's calibrated capacity), the most that any moment from now to `ahead` seconds on needs (a
    pod asked for now is Ready within that time)."""

    threshold = 1.0

    def __init__(self, trace: LlmTrace, ahead: float = 0.0, model: ServerModel | None = None) -> None:
        self.trace = trace
        self.ahead = ahead
        self.model = model

    def needed(self, t: float) -> float:
        segment = self.trace.segment_at(t)
        if segment is None or segment.rate <= 0:
            return 0.0
        return segment.rate / capacity(segment.prompt_mean, segment.output_mean, self.model)

    def value(self, signals: Signals) -> float | None:
        now, end = signals.now, signals.now + self.ahead
        changes = (s.start for s in self.trace.segments if now < s.start <= end)
        return max(self.needed(t) for t in (now, *changes))


class EppQueue(Trigger):
    """KEDA's prometheus trigger on `sum(llm_d_epp_flow_control_queue_size)`: the requests the EPP holds."""

    threshold = EPP_QUEUE_TARGET

    def value(self, signals: Signals) -> float | None:
        return float(signals.prometheus.pending)


class PrometheusRequests(Trigger):
    """KEDA's prometheus trigger on `sum(vllm:num_requests_running + vllm:num_requests_waiting)`; the
    EPP's running requests (dispatched, not finished) are the same sum."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def value(self, signals: Signals) -> float | None:
        # Pods without series are not in the sum; an empty result is 0 (KEDA's ignoreNullValues).
        return float(sum(p.running + p.waiting for p in signals.prometheus.pages.values()))


class PrometheusAverageUtilization(Trigger):
    """The AKS tutorial's `avg(DCGM_FI_DEV_GPU_UTIL{…})` through Prometheus, AverageValue threshold 5."""

    threshold = AKS_THRESHOLD

    def value(self, signals: Signals) -> float | None:
        values = signals.prometheus.utilization.values()
        return sum(values) / len(values) if values else 0.0


class PrometheusPending(Trigger):
    """KEDA's prometheus trigger on the gateway's queue as Prometheus last scraped it: the one wake this
    bench computes itself, since it is no trigger of this scaler (`requests+prometheus-wake`). The scaler's
    own wake is `metric: pending`, asked of the product (PendingTrigger)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def value(self, signals: Signals) -> float | None:
        return float(signals.prometheus.pending)


# llm-d's autoscaling recipes (facts: /work/shared/reference/gateways.md): `llm-d-epp`, the base KEDA
# recipe (EppQueue + PrometheusRequests); `llm-d-queue-guard`, its overlay, whose queue trigger discounts the
# pods still starting, so a queue that pods on their way will serve does not ask for more pods again; and
# `llm-d-slo`, the SLO-aware recipe: s = max(p90 TTFT ÷ 3 s, p90 TPOT ÷ 100 ms), clamped at 2, averaged
# over 45 s, credited for warming pods (× ready ÷ replicas); above 0.55 it asks for replicas in proportion
# (current × s ÷ 0.55), below 0.40 for one fewer. Everything through Prometheus recording rules.
SLO_TTFT = 3.0  # s: the recipe's TTFT reference
SLO_TPOT = 0.100  # s: … and its time-per-output-token reference
SLO_CLAMP = 2.0
SLO_SMOOTHING = 45.0  # s
SLO_UP, SLO_DOWN = 0.55, 0.40


class EppQueueGuard(EppQueue):
    """The EPP's queue less what the starting pods will take (each the recipe's running target, whatever
    the search sets it to), never below 0."""

    def __init__(self, running: PrometheusRequests) -> None:
        self.running = running

    def value(self, signals: Signals) -> float | None:
        view = signals.prometheus
        return max(0.0, view.pending - len(view.starting) * self.running.threshold)


class SloSignal(Trigger):
    """The recipe's recorded desired replicas, read by KEDA's prometheus trigger (AverageValue 1)."""

    threshold = 1.0

    def __init__(self, up: float = SLO_UP, down: float = SLO_DOWN) -> None:
        self.up, self.down = up, down
        self.recent: deque[tuple[float, float]] = deque()  # (rule evaluation, s)

    def _record(self, signals: Signals) -> None:
        if signals.latency_p90 is None or (self.recent and self.recent[-1][0] == signals.rule_at):
            return
        ttft, tpot = signals.latency_p90
        self.recent.append((signals.rule_at, min(SLO_CLAMP, max(ttft / SLO_TTFT, tpot / SLO_TPOT))))
        while self.recent[0][0] <= signals.rule_at - SLO_SMOOTHING:
            self.recent.popleft()

    def value(self, signals: Signals) -> float | None:
        self._record(signals)
        view = signals.recorded
        replicas = len(view.targets) + len(view.starting)
        if not self.recent or not replicas:
            return None  # no latency recorded yet: the rule has no value
        smoothed = sum(s for _, s in self.recent) / len(self.recent)
        credited = smoothed * len(view.targets) / replicas
        if credited > self.up:
            return float(math.ceil(replicas * credited / self.up))
        if credited < self.down:
            return float(replicas - 1)
        return float(replicas)


class SaturationController:
    """llm-d's workload-variant-autoscaler, saturation analyser: every reconcile it reads each replica's
    max_over_time[1m] of KV usage and waiting requests from Prometheus; replicas below both thresholds are
    non-saturated; scale up by one when their average spare KV < 0.1 or spare queue < 3 (none
    non-saturated: up too), never while a replica is still starting; down by one when spreading the
    non-saturated load over one fewer replica keeps both spares (and at least 2 are non-saturated)."""

    reconcile = 60.0
    phase = 20.0
    kv_threshold, queue_threshold, kv_spare, queue_spare = 0.8, 5.0, 0.1, 3.0

    def __init__(self) -> None:
        self.published: float | None = None  # the desired-replicas metric it exports
        self.scraped: float | None = None  # that metric as Prometheus last scraped it

    def decide(self, history: list[View], fleet: Fleet) -> None:
        peak: dict[str, tuple[float, float]] = {}
        for view in history:
            for pod, page in view.pages.items():
                kv, waiting = peak.get(pod, (0.0, 0.0))
                peak[pod] = (max(kv, page.kv), max(waiting, float(page.waiting)))
        current = fleet.replicas
        live = {p.name for p in fleet.pods}
        loads = [v for pod, v in peak.items() if pod in live]
        if not loads:
            self.published = float(current)
            return
        calm = [(kv, q) for kv, q in loads if kv < self.kv_threshold and q < self.queue_threshold]
        starting = len(fleet.ready_pods()) < current
        if not calm:
            up = True
        else:
            spare_kv = sum(self.kv_threshold - kv for kv, _ in calm) / len(calm)
            spare_queue = sum(self.queue_threshold - q for _, q in calm) / len(calm)
            up = spare_kv < self.kv_spare or spare_queue < self.queue_spare
        if up:
            self.published = float(current + (0 if starting else 1))
            return
        down = False
        if len(calm) >= 2:
            kv_after = sum(kv for kv, _ in calm) / (len(calm) - 1)
            queue_after = sum(q for _, q in calm) / (len(calm) - 1)
            down = (
                self.kv_threshold - kv_after >= self.kv_spare
                and self.queue_threshold - queue_after >= self.queue_spare
            )
        self.published = float(current - 1 if down else current)


class SaturationDesired(Trigger):
    """The controller's desired replicas read by KEDA's prometheus trigger, AverageValue target 1."""

    threshold = 1.0

    def __init__(self, controller: SaturationController) -> None:
        self.controller = controller

    def value(self, signals: Signals) -> float | None:
        return self.controller.scraped


@dataclass
class LlmPolicy:
    name: str
    triggers: list[Trigger]
    min_replicas: int = 1
    push: PendingTrigger | None = None  # the trigger whose StreamIsActive wakes KEDA at once (external-push)
    controller: SaturationController | None = None
    behavior: Behavior = field(default_factory=Behavior)
    polling: float = 30.0  # KEDA's pollingInterval
    cooldown: float = 300.0  # KEDA's cooldownPeriod (its default): idle seconds before scaling to zero
    description: str = ""
    _was_active: bool = field(default=False, repr=False)

    def desired(self, signals: Signals, current: int) -> int | None:
        """What the HPA's metrics ask for: the largest over the triggers that answered (None: none did).
        A trigger that failed forbids a scale-down (the HPA keeps the count rather than shrink on part
        of its metrics)."""
        wanted, failed = [], False
        for trigger in self.triggers:
            value = trigger.value(signals)
            if value is not None and math.isfinite(value):
                wanted.append(
                    hpa_desired_replicas(max(0.0, value), trigger.threshold, current, average_value=True)
                )
            else:
                failed = True
        if not wanted:
            return None
        return max(*wanted, current) if failed else max(wanted)

    def active(self, signals: Signals) -> bool | None:
        """KEDA's IsActive over the triggers (activation threshold 0); None when every trigger failed."""
        answers = [t.active(signals) for t in self.triggers]
        answered = [a for a in answers if a is not None]
        return any(answered) if answered else None

    def pushed(self, signals: Signals) -> bool:
        """StreamIsActive: true once on each inactive → active change of the pushing trigger, as the product
        answers IsActive; while it cannot tell (UNAVAILABLE), the last known state holds, as its stream's."""
        if self.push is None:
            return False
        active = self.push.active(signals)
        now_active = self._was_active if active is None else active
        woke = now_active and not self._was_active
        self._was_active = now_active
        return woke

    def tick(self, now: float, signals: Signals, fleet: Fleet, scraped: bool) -> None:
        controller = self.controller
        if controller is None:
            return
        if scraped:
            controller.scraped = controller.published
        if (now - controller.phase) % controller.reconcile == 0:
            controller.decide(list(signals.history), fleet)


def make_policy(
    name: str,
    min_replicas: int | None = None,
    requests_target: float | None = None,
    *,
    trace: LlmTrace | None = None,
    window: float | None = None,
    threshold: float | None = None,
    weight: float | None = None,
    behavior: Behavior | None = None,
    model: ServerModel | None = None,
    lookahead: float | None = None,
) -> LlmPolicy:
    """The named policy. `requests_target` overrides the requests and pending targets (default
    REQUESTS_TARGET); `window`, `threshold`, `weight` and `behavior` the demand policies' (defaults: the
    chosen ones); `trace` is what `oracle` and `clairvoyant` know, `lookahead` how far on the clairvoyant
    looks (default: a mean cold start on a warm node)."""
    if name not in POLICY_NAMES:
        raise ValueError(f"policy {name!r} is not one of {', '.join(POLICY_NAMES)}")
    target = float(REQUESTS_TARGET if requests_target is None else requests_target)
    requests = ScalerTrigger("requests", target)
    span = DEMAND_WINDOW if window is None else window
    token_weight = TOKEN_WEIGHT if weight is None else weight
    if name in ("oracle", "clairvoyant") and trace is None:
        raise ValueError(f"policy {name!r} needs the trace it knows")
    builders: dict[str, tuple[list[Trigger], int]] = {
        "gpu-utilization": ([ScalerTrigger("utilization", GPU_THRESHOLD)], 1),
        "gpu-utilization-average": ([PrometheusAverageUtilization()], 1),
        "queue": ([ScalerTrigger("queue", QUEUE_THRESHOLD)], 1),
        "requests": ([requests], 1),
        "prometheus-requests": ([PrometheusRequests(target)], 1),
        "requests+kv_cache": ([requests, ScalerTrigger("kv_cache", KV_THRESHOLD)], 1),
        "saturation-thresholds": ([], 1),
        "requests+pending": ([requests, PendingTrigger(target)], 0),
        "requests+prometheus-wake": ([requests, PrometheusPending(target)], 0),
        "llm-d-epp": ([EppQueue(), PrometheusRequests(EPP_RUNNING_TARGET)], 1),
        "llm-d-queue-guard": ([EppQueueGuard(running := PrometheusRequests(EPP_RUNNING_TARGET)), running], 1),
        "llm-d-slo": ([SloSignal()], 1),
    }
    if name in ("demand", "demand+pending"):
        t = demand_threshold() if threshold is None else threshold
        pending = name == "demand+pending"
        builders[name] = ([DemandTrigger(t, span, pending=pending)], 0 if pending else 1)
    elif name in ("demand-tokens", "demand-tokens+pending"):
        t = demand_tokens_threshold(token_weight) if threshold is None else threshold
        pending = name == "demand-tokens+pending"
        builders[name] = ([DemandTrigger(t, span, weight=token_weight, pending=pending)], 0 if pending else 1)
    elif name in ("oracle", "clairvoyant"):
        assert trace is not None
        ahead = (model or ServerModel()).cold_start if name == "clairvoyant" else 0.0
        ahead = ahead if lookahead is None else lookahead
        builders[name] = ([OracleTrigger(trace, ahead, model)], 1)
    triggers, default_min = builders[name]
    policy = LlmPolicy(name, triggers, default_min if min_replicas is None else min_replicas)
    if name in OURS_DEMAND or name in ("oracle", "clairvoyant"):
        policy.behavior = DEMAND_BEHAVIOR
    if name in ("llm-d-epp", *LLMD_RECIPES):
        policy.behavior, policy.polling = LLMD_BEHAVIOR, 15.0
    if behavior is not None:
        policy.behavior = behavior
    if name == "saturation-thresholds":
        policy.controller = SaturationController()
        policy.triggers = [SaturationDesired(policy.controller)]
    if name == "requests+pending":
        wake = triggers[1]
        assert isinstance(wake, PendingTrigger)
        policy.push = wake
    if name in ("demand+pending", "demand-tokens+pending"):
        policy.push = PendingTrigger(1.0)  # StreamIsActive: the product's IsActive on pending wakes it
    return policy


OURS_DEMAND = ("demand", "demand-tokens", "demand+pending", "demand-tokens+pending")
LLMD_RECIPES = ("llm-d-queue-guard", "llm-d-slo")
POLICY_NAMES = (
    "gpu-utilization",
    "gpu-utilization-average",
    "queue",
    "requests",
    "prometheus-requests",
    "requests+kv_cache",
    "saturation-thresholds",
    "requests+pending",
    "requests+prometheus-wake",
    "demand",
    "demand-tokens",
    "demand+pending",
    "demand-tokens+pending",
    "llm-d-epp",
    *LLMD_RECIPES,
    "oracle",
    "clairvoyant",
)
