"""Answers "what is this ScaledObject's value now?": its trigger's snapshot, decided, then recorded for
/explain, /metrics and the log. Reads caches only, never waits on I/O."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from keda_gpu_scaler.collect.snapshot import Snapshots
from keda_gpu_scaler.core.decide import Decision, decide
from keda_gpu_scaler.core.demand_values import is_measured
from keda_gpu_scaler.core.latency import late_observations
from keda_gpu_scaler.core.learned_target import (
    DEFAULT_ALLOWED_MISSES,
    DEFAULT_TPOT_SECONDS,
    DEFAULT_TTFT_SECONDS,
    Learner,
    Sample,
)
from keda_gpu_scaler.core.scaling import ROW_VALUE, Evaluation
from keda_gpu_scaler.core.snapshot import Snapshot
from keda_gpu_scaler.core.trigger import Metric, TriggerSpec
from keda_gpu_scaler.pages.engines._common import ITL, TPOT, TTFT
from keda_gpu_scaler.server.registry import Explanation, Followed, Subscription
from keda_gpu_scaler.server.spec_targets import SPEC_UPDATE_INTERVAL
from keda_gpu_scaler.telemetry import Telemetry

# The arrival rate's variability (the SLO's headroom) is read over the last registry.DEMAND_SUMS_KEPT
# summed demands, at most four a window (4 minutes at the default 30 s window), none older than this.
# Read over all of the last 10 minutes it was measured and not kept (docs/BENCHMARKS.md): the developers'
# traces within ±0.6 % GPU-seconds and bursty's attainment 0.011 lower, `threshold: auto` worse.
HEADROOM_SPAN = 600.0
# The SLO's allowance of misses is counted over the windows of this many seconds: long enough that a
# burst's misses stay counted while it is likely to come back, short enough to follow a day's changes.
BUDGET_SPAN = 1800.0
NO_PUSH = (
    "push: no StreamMetricSpec stream: use external-push, or the target reaches the HPA only when KEDA"
    " rebuilds the ScaledObject"
)


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
        subscription = followed.triggers[spec]  # follow() made it before any evaluation
        # Forgotten by age on every read, not only when a new one is kept: after an outage or a quiet
        # hour (nothing kept meanwhile) the old ones are not "recent".
        now = self.snapshots.now()
        _forget_before(subscription.demand_sums, now - HEADROOM_SPAN)
        _forget_before(subscription.latency_windows, now - BUDGET_SPAN)
        recent = tuple(total for at, total in subscription.demand_sums)
        latency = tuple((requests, missed) for at, requests, missed in subscription.latency_windows)
        snapshot = self.snapshots.take(followed.namespace, followed.name, spec, recent, latency)
        decision = decide(_at_current_target(followed, spec), snapshot)
        if decision.evaluation is not None and spec.slo is not None:
            if spec.metric is Metric.DEMAND:  # its headroom's variability
                _remember_demand(subscription, spec, snapshot.now, decision.evaluation)
            _remember_latency(subscription, spec, snapshot.now, decision)
        if spec.learned:
            self._learn(followed, subscription, spec, snapshot, decision)
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
        subscription = followed.triggers[spec]
        last = subscription.explanation
        evaluation, notes = decision.evaluation, decision.notes
        if evaluation is not None and last is not None and last.evaluation == evaluation:
            # The same result again: the objects already held stay and the new ones die at once, so equal
            # results do not promote new long-lived objects through the collector's generations.
            evaluation = decision.evaluation = last.evaluation
            if last.spec == spec and last.notes == notes and last.targets == targets:
                last.evaluated_at = time.time()  # the same explanation, now (and the same gauges)
                last.slo, last.learned = decision.slo, subscription.learned
                return
        error = str(decision.error) if decision.error is not None else None
        subscription.explanation = Explanation(
            spec, time.time(), evaluation, error, notes, targets, decision.slo, subscription.learned
        )
        labels = (followed.namespace, followed.name, spec.metric_name)
        if publish(self._telemetry, labels, subscription):
            subscription.metric_labels = labels

    def _learn(
        self,
        followed: Followed,
        subscription: Subscription,
        spec: TriggerSpec,
        snapshot: Snapshot,
        decision: Decision,
    ) -> None:
        """`threshold: auto`: one sample per pod and window for the trigger's learner, then its target
        (CurrentTargets publishes it); a trigger nobody pushes the target to is told so after a minute."""
        now = snapshot.now
        if subscription.learner is None:
            assert spec.threshold_start is not None
            targets = spec.slo.targets() if spec.slo is not None else {}
            subscription.learner = Learner(
                spec.threshold_start,
                targets.get(TPOT) or DEFAULT_TPOT_SECONDS,
                targets.get(TTFT) or DEFAULT_TTFT_SECONDS,
                1 - spec.slo.attainment if spec.slo is not None else DEFAULT_ALLOWED_MISSES,
            )
            subscription.learning_since = now
        if followed.spec_streams[spec] <= 0 and now - subscription.learning_since >= SPEC_UPDATE_INTERVAL:
            decision.notes += (NO_PUSH,)
            decision.to_log.append((NO_PUSH, logging.WARNING))
        evaluation = decision.evaluation
        # Windows that overlap would count the same requests twice: one sample per pod per window.
        if evaluation is None or now - subscription.sampled_at < spec.window:
            return
        subscription.sampled_at = now
        tracks = dict(snapshot.tracks)
        # Only a pod's own measured rate is a sample of what it served at its latency (never an assumed one).
        for row in filter(is_measured, evaluation.pod_rows):
            track = tracks.get(row[0])
            latency = track.latency if track is not None else {}
            # A request's mean where the pod prints it, else the gaps between its tokens (a pod prints one
            # kind, and the learner judges each pod's levels on its own samples: the two are never summed).
            kind = TPOT if f"{TPOT}:count" in latency else ITL
            per_token = _mean(latency, kind)
            if per_token is not None:
                tokens, first_token = latency[f"{kind}:count"], _mean(latency, TTFT)
                learner = subscription.learner
                # A pod whose requests in flight fell over the window served a backlog: its late tokens
                # waited for load that came before the window, so they say nothing of the rate it had.
                points = track.points if track is not None else []
                draining = len(points) >= 2 and points[-1].in_flight < points[0].in_flight
                late = (
                    None if draining else late_observations(TTFT, latency, learner.first_token_target),
                    latency.get(f"{TTFT}:count"),
                    None if draining else late_observations(kind, latency, learner.latency_target),
                )
                held = decision.pool_held is not None and decision.pool_held > 0
                sample = Sample(now, row[0], row[ROW_VALUE], per_token, tokens, first_token, *late, held)
                learner.observe(sample)
        subscription.learned = subscription.learner.update(now, [row[0] for row in evaluation.pod_rows])
        followed.targets.set(spec, subscription.learned.target)


def _at_current_target(followed: Followed, spec: TriggerSpec) -> TriggerSpec:
    """The trigger as the HPA holds it: a learned target is what the HPA divides the value by, so one
    replica's worth (the floor of a pod without data or starting, the wake) is that target; sized at
    thresholdStart, every sync while pods start would ask for start ÷ target times the replicas."""
    if not spec.learned:
        return spec
    return dataclasses.replace(spec, threshold=followed.targets.target(spec))


def _mean(latency: Mapping[str, float], kind: str) -> float | None:
    """The mean of a latency histogram over the window; None when no observation was made in it."""
    count = latency.get(f"{kind}:count", 0.0)
    return latency.get(f"{kind}:sum", math.nan) / count if count > 0 else None


def _remember_latency(subscription: Subscription, spec: TriggerSpec, now: float, decision: Decision) -> None:
    """The window's requests and those over a target, once a window (windows that do not overlap count
    each request once). Over the targets, the kind that missed the larger share counts: the histograms
    cannot say which requests missed both. Its share is weighed by the window's requests: where that kind
    counts gaps between tokens (ITL, an observation per token), by a per-request read's count, so that a
    window's thousands of gaps do not outweigh another window's hundreds of requests."""
    windows = subscription.latency_windows
    slo = decision.slo
    if slo is None or (windows and now - windows[-1][0] < spec.window):
        return
    counted = [read for read in slo.reads if read.missed is not None and read.requests]
    if not counted:
        return
    worst = max(counted, key=lambda read: (read.missed or 0.0) / read.requests)
    share = (worst.missed or 0.0) / worst.requests
    per_request = [read.requests for read in slo.reads if read.kind != ITL and read.requests]
    requests = max(per_request) if worst.kind == ITL and per_request else worst.requests
    windows.append((now, requests, share * requests))


def _remember_demand(
    subscription: Subscription, spec: TriggerSpec, now: float, evaluation: Evaluation
) -> None:
    """The fresh pods' summed demand, for the SLO's headroom: at most four a window (a stream evaluates on
    every page), the last DEMAND_SUMS_KEPT of them (read within HEADROOM_SPAN seconds). Only sums of
    measured rates of every Ready pod: a pod without its own rate yet (a new pod, counted as the others'
    mean) or without data (a page failed: missing) would add a step to arrivals that never changed, read
    as variability (one failed page of three pods at 5/s made 35 % headroom for ten minutes)."""
    sums = subscription.demand_sums
    if sums and now - sums[-1][0] < spec.window / 4:
        return
    if evaluation.missing_pods or not all(map(is_measured, evaluation.pod_rows)):
        return
    sums.append((now, math.fsum(row[ROW_VALUE] for row in evaluation.pod_rows)))


def _forget_before(kept: deque[Any], since: float) -> None:
    """Drop what was kept before `since` (each entry's first item is its time, oldest first)."""
    while kept and kept[0][0] < since:
        kept.popleft()


def publish(telemetry: Telemetry, labels: tuple[str, str, str], subscription: Subscription) -> bool:
    """Show a trigger's last evaluation on /metrics under `labels`; False when it has none, or when its
    ScaledObject already shows the most triggers it may (telemetry.MAX_PUBLISHED_TRIGGERS). A trigger
    shown before whose last evaluation failed (UNAVAILABLE) shows NaN, not its last value and activity."""
    explanation = subscription.explanation
    learned = subscription.learned.target if subscription.learned is not None else None
    if explanation is None or (evaluation := explanation.evaluation) is None:
        if explanation is None or subscription.metric_labels is None:
            return False
        return telemetry.publish_trigger(labels, math.nan, None, learned)
    # A value that cannot be told is shown as NaN, never as the 0 it was computed from.
    value = math.nan if evaluation.value_unknown is not None else evaluation.value
    active = None if evaluation.activity_unknown is not None else evaluation.active
    return telemetry.publish_trigger(labels, value, active, learned)
