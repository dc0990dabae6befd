"""KEDA and the HPA as the simulators drive them: the HPA's behaviour and KEDA's activation 0 ↔ 1.

Written from their documented behaviour (Kubernetes pkg/controller/podautoscaler, KEDA's scale loop); pure
functions and small state. The replica formula itself is the product's own (scaling.hpa_desired_replicas).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from keda_gpu_scaler.core.scaling import HPA_TOLERANCE


def due(t: float, period: float, phase: float) -> bool:
    """Whether a loop with this period and phase ticks at time t (t on the simulator's time grid)."""
    return (t - phase) % period == 0


def value_replicas(value: float, target: float, current: int, ready: int) -> int:
    """External metric, Value: ceil(ready pods × value / target), unless within tolerance of 1."""
    ratio = value / target
    if abs(ratio - 1) <= HPA_TOLERANCE:
        return current
    return math.ceil(ratio * ready)


@dataclass(frozen=True)
class Behavior:
    """The HPA's default `behavior` (autoscaling/v2) and sync period."""

    sync: float = 15.0
    up_window: float = 0.0
    down_window: float = 300.0
    up_pods: int = 4
    up_percent: float = 100.0
    up_period: float = 15.0
    down_percent: float = 100.0
    down_period: float = 15.0


def scale_up_limit(current: int, added_in_period: int, behavior: Behavior) -> int:
    """Most replicas allowed now: the larger of the Pods and Percent policies from the period's start."""
    start = current - added_in_period
    return max(start + behavior.up_pods, math.ceil(start * (1 + behavior.up_percent / 100)))


def scale_down_limit(current: int, removed_in_period: int, behavior: Behavior) -> int:
    start = current + removed_in_period
    return int(start * (1 - behavior.down_percent / 100))


class Hpa:
    """One HorizontalPodAutoscaler: stabilisation windows, then rate limits, then min/max."""

    def __init__(
        self, behavior: Behavior, min_replicas: int, max_replicas: int, now: float, current: int
    ) -> None:
        self.behavior = behavior
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        # Kubernetes seeds the scale-down window with the current count, so a new HPA does not shrink at once.
        self.recommendations: list[tuple[float, int]] = [(now, current)]
        self.events: list[tuple[float, int]] = []

    def decide(self, now: float, current: int, metric_desired: int) -> int:
        b = self.behavior
        up, down = metric_desired, metric_desired
        for at, replicas in self.recommendations:
            if at > now - b.up_window:
                up = min(up, replicas)
            if at > now - b.down_window:
                down = max(down, replicas)
        horizon = now - max(b.up_window, b.down_window)
        self.recommendations = [r for r in self.recommendations if r[0] > horizon]
        self.recommendations.append((now, metric_desired))
        desired = max(current, up)
        desired = min(desired, down)
        if desired > current:
            added = sum(d for at, d in self.events if d > 0 and at + b.up_period > now)
            desired = min(desired, max(scale_up_limit(current, added, b), current), self.max_replicas)
        elif desired < current:
            removed = sum(-d for at, d in self.events if d < 0 and at + b.down_period > now)
            desired = max(desired, min(scale_down_limit(current, removed, b), current), self.min_replicas)
        desired = min(max(desired, self.min_replicas), self.max_replicas)
        if desired != current:
            self.events.append((now, desired - current))
            self.events = [e for e in self.events if e[0] + max(b.up_period, b.down_period) > now]
        return desired


@dataclass
class Keda:
    min_replica_count: int
    max_replica_count: int
    polling: float = 30.0
    cooldown: float = 300.0
    last_active: float = 0.0

    @property
    def hpa_min(self) -> int:
        return max(self.min_replica_count, 1)

    def poll(self, now: float, active: bool | None, replicas: int) -> int:
        """The scale loop: IsActive (None: the scaler failed, replicas stay) → activation or scale to zero."""
        if active is None:
            return replicas
        if active:
            self.last_active = now
            return max(replicas, self.hpa_min) if replicas == 0 else replicas
        if replicas > 0 and self.min_replica_count == 0 and now - self.last_active >= self.cooldown:
            return 0
        return replicas

    def push(self, now: float, replicas: int) -> int:
        """StreamIsActive sent true: activate at once and restart the cooldown."""
        self.last_active = now
        return self.hpa_min if replicas == 0 else replicas
