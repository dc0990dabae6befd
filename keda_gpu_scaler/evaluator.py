"""Answers "what is this ScaledObject's value now?": its trigger's snapshot, decided, then recorded for
/explain, /metrics and the log. Reads caches only, never waits on I/O."""

from __future__ import annotations

import time
from typing import Any

from keda_gpu_scaler.decide import Decision, decide
from keda_gpu_scaler.metrics import Telemetry
from keda_gpu_scaler.registry import Explanation, Followed
from keda_gpu_scaler.scaling import Evaluation
from keda_gpu_scaler.snapshot import Snapshots
from keda_gpu_scaler.trigger import TriggerSpec


class Evaluator:
    """Works out a trigger's value on every call, from the caches only: at the rate KEDA calls (each
    ScaledObject every 30 s by default) an evaluation costs far less than keeping one would save."""

    def __init__(self, *, snapshots: Snapshots, telemetry: Telemetry) -> None:
        self._telemetry = telemetry
        self.snapshots = snapshots
        self.check = self.snapshots.check
        self.kind_of = self.snapshots.kind_of

    def evaluate(self, followed: Followed, spec: TriggerSpec) -> Evaluation:
        """The trigger's value now; raises NoData (UNAVAILABLE) when it cannot be known, ConfigError when
        the trigger can never be served. Discovery failing is raised before anything is recorded."""
        snapshot = self.snapshots.take(followed.namespace, followed.name, spec)
        decision = decide(spec, snapshot)
        self._record(followed, spec, decision, snapshot.targets)
        if decision.error is not None:
            raise decision.error
        assert decision.evaluation is not None
        return decision.evaluation

    def _record(self, followed: Followed, spec: TriggerSpec, decision: Decision, targets: Any) -> None:
        """The decision's log lines, counters and remembered size; its explanation and gauges when new."""
        for note, level in decision.to_log:
            followed.log_once(note, level)
        if decision.aggregation_mismatch:
            self._telemetry.aggregation_mismatches.inc()
        if decision.tokens_per_request is not None:
            self.snapshots.remember(followed.namespace, spec, decision.tokens_per_request)
        self._telemetry.evaluations.labels("ok" if decision.evaluation else "no_data").inc()
        subscription = followed.triggers[spec]  # follow() made it before any evaluation
        last = subscription.explanation
        evaluation, notes = decision.evaluation, decision.notes
        if evaluation is not None and last is not None and last.evaluation == evaluation:
            # The same result again: the objects already held stay and the new ones die at once, so equal
            # results do not promote new long-lived objects through the collector's generations.
            evaluation = decision.evaluation = last.evaluation
            if last.spec == spec and last.notes == notes and last.targets == targets:
                last.evaluated_at = time.time()  # the same explanation, now (and the same gauges)
                return
        error = str(decision.error) if decision.error is not None else None
        subscription.explanation = Explanation(spec, time.time(), evaluation, error, notes, targets)
        if evaluation is not None:
            labels = (followed.namespace, followed.name, spec.metric_name)
            # A ScaledObject shows a bounded number of triggers on /metrics (metrics.MAX_PUBLISHED_TRIGGERS).
            if self._telemetry.publish_trigger(labels, evaluation.value, evaluation.active):
                subscription.metric_labels = labels
