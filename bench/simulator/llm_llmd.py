"""llm-d's autoscaling recipes as the simulator runs them (facts: /work/shared/reference/gateways.md).

- `llm-d-epp`, the base KEDA recipe (llm_policies: EppQueue + PrometheusRequests).
- `llm-d-queue-guard`, its overlay: the queue trigger discounts the pods still starting, so a queue that
  pods on their way will serve does not ask for more pods again.
- `llm-d-slo`, the SLO-aware recipe: s = max(p90 TTFT ÷ 3 s, p90 TPOT ÷ 100 ms), clamped at 2, averaged
  over 45 s, credited for warming pods (× ready ÷ replicas); above 0.55 it asks for replicas in proportion
  (current × s ÷ 0.55), below 0.40 for one fewer. Everything through Prometheus recording rules.
"""

from __future__ import annotations

import math
from collections import deque

from bench.simulator.llm_policies import (
    EPP_RUNNING_TARGET,
    LLMD_BEHAVIOR,
    EppQueue,
    LlmPolicy,
    PrometheusRequests,
    Trigger,
)
from bench.simulator.llm_signals import Signals

SLO_TTFT = 3.0  # s: the recipe's TTFT reference
SLO_TPOT = 0.100  # s: … and its time-per-output-token reference
SLO_CLAMP = 2.0
SLO_SMOOTHING = 45.0  # s
SLO_UP, SLO_DOWN = 0.55, 0.40


class EppQueueGuard(EppQueue):
    """The EPP's queue less what the starting pods will take (EPP_RUNNING_TARGET each), never below 0."""

    def value(self, signals: Signals) -> float | None:
        view = signals.prometheus
        return max(0.0, view.pending - len(view.starting) * EPP_RUNNING_TARGET)


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


def llmd_policy(name: str, min_replicas: int) -> LlmPolicy:
    triggers: dict[str, list[Trigger]] = {
        "llm-d-queue-guard": [EppQueueGuard(), PrometheusRequests(EPP_RUNNING_TARGET)],
        "llm-d-slo": [SloSignal()],
    }
    return LlmPolicy(name, triggers[name], min_replicas, behavior=LLMD_BEHAVIOR, polling=15.0)
