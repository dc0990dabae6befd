"""The policies a user would configure for an LLM fleet, each a list of KEDA triggers as written in a
ScaledObject (and, for llm-d's saturation autoscaler, its controller). The HPA takes the largest of the
triggers' replica counts, each from the product's own formula (scaling.hpa_desired_replicas)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bench.simulator.llm_fleet import Fleet
from bench.simulator.llm_signals import Page, Signals, View
from keda_gpu_scaler.errors import NoData
from keda_gpu_scaler.scaling import PodRow, evaluate, hpa_desired_replicas, pod_row
from keda_gpu_scaler.trigger import Aggregation, parse_trigger

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


class Trigger:
    threshold: float = 1.0

    def value(self, signals: Signals) -> float | None:
        """The metric KEDA hands the HPA now; None: an error (the HPA keeps the replica count)."""
        raise NotImplementedError


class ScalerTrigger(Trigger):
    """A trigger of this scaler on the pods' pages: the product's own evaluation (sum over the target's
    pods, missing pods counted as SPEC §4 says) on what its last scrape saw."""

    def __init__(self, metric: str, threshold: float) -> None:
        self.threshold = threshold
        self.metric = metric
        self.spec = parse_trigger({"metric": metric, "threshold": f"{threshold:g}", "podNamePrefix": "vllm-"})

    def pod_value(self, page: Page, view: View, pod: str) -> float:
        if self.metric == "requests":
            return float(page.running + page.waiting)
        if self.metric == "queue":
            return float(page.waiting)
        if self.metric == "kv_cache":
            return 100.0 * page.kv
        return view.utilization[pod]

    def value(self, signals: Signals) -> float | None:
        view = signals.direct
        if self.metric == "utilization":
            # The exporter's page exists from pod creation (the GPU is attributed to the pod at once).
            rows: dict[str, PodRow] = {
                pod: pod_row(pod, "nvidia", view.utilization[pod]) for pod in view.targets
            }
        else:
            rows = {
                pod: pod_row(pod, "vllm", self.pod_value(page, view, pod))
                for pod, page in view.pages.items()
                if pod in view.targets
            }
        try:
            return evaluate(rows, set(view.targets) - rows.keys(), self.spec, Aggregation.SUM).value
        except NoData:
            return None


class PrometheusRequests(Trigger):
    """KEDA's prometheus trigger on `sum(vllm:num_requests_running + vllm:num_requests_waiting)`."""

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


class Pending(Trigger):
    """The gateway's queue (`metric: pending`): read directly every second, or through Prometheus."""

    def __init__(self, threshold: float, through_prometheus: bool) -> None:
        self.threshold = threshold
        self.through_prometheus = through_prometheus

    def value(self, signals: Signals) -> float | None:
        return float(signals.prometheus.pending if self.through_prometheus else signals.pending)


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
    push: Pending | None = None  # the trigger whose StreamIsActive wakes KEDA at once (external-push)
    controller: SaturationController | None = None
    description: str = ""
    _was_active: bool = field(default=False, repr=False)

    def desired(self, signals: Signals, current: int) -> int | None:
        """What the HPA's metrics ask for: the largest over the triggers that answered (None: none did)."""
        wanted = []
        for trigger in self.triggers:
            value = trigger.value(signals)
            if value is not None and math.isfinite(value):
                wanted.append(
                    hpa_desired_replicas(max(0.0, value), trigger.threshold, current, average_value=True)
                )
        return max(wanted) if wanted else None

    def active(self, signals: Signals) -> bool | None:
        """KEDA's IsActive over the triggers (activation threshold 0); None when every trigger failed."""
        values = [t.value(signals) for t in self.triggers]
        answered = [v for v in values if v is not None]
        return any(v > 0 for v in answered) if answered else None

    def pushed(self, signals: Signals) -> bool:
        """StreamIsActive: true once on each inactive → active change of the pushing trigger."""
        if self.push is None:
            return False
        value = self.push.value(signals)
        now_active = value is not None and value > 0
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
    name: str, min_replicas: int | None = None, requests_target: float | None = None
) -> LlmPolicy:
    """The named policy; `requests_target` overrides the requests and pending targets (default REQUESTS_TARGET)."""
    target = float(REQUESTS_TARGET if requests_target is None else requests_target)
    requests = ScalerTrigger("requests", target)
    policies: dict[str, tuple[list[Trigger], int]] = {
        "gpu-utilization": ([ScalerTrigger("utilization", GPU_THRESHOLD)], 1),
        "gpu-utilization-average": ([PrometheusAverageUtilization()], 1),
        "queue": ([ScalerTrigger("queue", QUEUE_THRESHOLD)], 1),
        "requests": ([requests], 1),
        "prometheus-requests": ([PrometheusRequests(target)], 1),
        "requests+kv_cache": ([requests, ScalerTrigger("kv_cache", KV_THRESHOLD)], 1),
        "saturation-thresholds": ([], 1),
        "requests+pending": ([requests, Pending(target, through_prometheus=False)], 0),
        "requests+prometheus-wake": ([requests, Pending(target, through_prometheus=True)], 0),
    }
    if name not in policies:
        raise ValueError(f"policy {name!r} is not one of {', '.join(POLICY_NAMES)}")
    triggers, default_min = policies[name]
    policy = LlmPolicy(name, triggers, default_min if min_replicas is None else min_replicas)
    if name == "saturation-thresholds":
        policy.controller = SaturationController()
        policy.triggers = [SaturationDesired(policy.controller)]
    if name == "requests+pending":
        pending = triggers[1]
        assert isinstance(pending, Pending)
        policy.push = pending
    return policy


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
)
