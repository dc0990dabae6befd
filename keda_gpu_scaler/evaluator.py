"""Answers "what is this ScaledObject's value now?" from the store and discovery caches, without any I/O."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from keda_gpu_scaler.collect.prometheus import prometheus_interest
from keda_gpu_scaler.collect.scrape import SCRAPE_INTEREST, Interest
from keda_gpu_scaler.collect.store import SourceKind, Store
from keda_gpu_scaler.errors import ConfigError, NoData
from keda_gpu_scaler.scaling import Evaluation, evaluate, pod_values
from keda_gpu_scaler.telemetry import Telemetry
from keda_gpu_scaler.trigger import Aggregation, Source, TriggerSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Targets:
    """A ScaledObject's target pods as discovery knows them."""

    pods: frozenset[str]
    metric_type: str | None = None  # the trigger's metricType ("AverageValue" or "Value") when read


# GetMetrics is always followed by IsActive, and many streams and polls ask about the same data: one
# evaluation serves them all until the namespace's data changes, a page ages out, or targets move.
MAX_MEMO_ENTRIES = 10_000
# A "no data" answer is kept briefly only: its message names ages that move on.
NO_DATA_MEMO_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class _Memo:
    version: int
    epoch: int
    targets: Targets | None
    valid_until: float
    evaluation: Evaluation | None
    error: str | None

    def still_right(self, version: int, epoch: int, targets: Targets | None, now: float) -> bool:
        return (
            self.version == version
            and self.epoch == epoch
            and self.targets == targets
            and now < self.valid_until
        )


class TargetResolver(Protocol):
    """Discovery (Kubernetes): answers from its caches, never waits on the API server."""

    def check(self, spec: TriggerSpec) -> None:
        """Raise ConfigError for metadata this resolver cannot serve."""

    def track(self, namespace: str, name: str, spec: TriggerSpec) -> None:
        """Start (or keep) discovering this ScaledObject in the background, without waiting."""

    def resolve(self, namespace: str, name: str, spec: TriggerSpec) -> Targets:
        """The target pods now; raises NoData while unknown or when discovery is failing."""


def aggregation_for(spec: TriggerSpec, metric_type: str | None) -> tuple[Aggregation, str | None]:
    """The aggregation to use and, when the trigger's explicit choice contradicts metricType, why that is wrong."""
    matching = Aggregation.MEAN if metric_type == "Value" else Aggregation.SUM
    if spec.aggregation is None:
        return (matching if metric_type else Aggregation.SUM), None
    if metric_type is None:
        return spec.aggregation, None
    fits = (spec.aggregation is Aggregation.SUM) == (metric_type == "AverageValue")
    if fits:
        return spec.aggregation, None
    return spec.aggregation, (
        f"aggregation={spec.aggregation.value} contradicts metricType={metric_type}: the HPA computes"
        f" {'ceil(value / target)' if metric_type == 'AverageValue' else 'ceil(pods × value / target)'},"
        f" which needs aggregation={matching.value}"
    )


class Evaluator:
    def __init__(
        self,
        *,
        store: Store,
        interest: Interest,
        telemetry: Telemetry,
        max_staleness: float,
        prometheus_max_staleness: float | None = None,
        clock: Callable[[], float],
        default_source: Source = Source.SCRAPE,
        prometheus_enabled: bool = False,
        targets: TargetResolver | None = None,
    ) -> None:
        self._store = store
        self._interest = interest
        self._telemetry = telemetry
        self._max_staleness = max_staleness
        self._prometheus_max_staleness = prometheus_max_staleness or max_staleness
        self._clock = clock
        self._default_source = default_source
        self._prometheus_enabled = prometheus_enabled
        self._targets = targets
        self._memo: dict[tuple[str, str, TriggerSpec], _Memo] = {}
        self._mismatches_logged: set[tuple[str, str, str]] = set()

    def source_of(self, spec: TriggerSpec) -> Source:
        return spec.source or self._default_source

    def check(self, spec: TriggerSpec) -> None:
        """Reject triggers this server's configuration cannot serve (INVALID_ARGUMENT), before any data."""
        if self.source_of(spec) is Source.PROMETHEUS and not self._prometheus_enabled:
            raise ConfigError(
                "metadata source='prometheus' is not available: this server has no --prometheus-url;"
                " allowed: scrape"
            )
        if self._targets is not None:
            self._targets.check(spec)
            return
        if spec.pod_selector is not None:
            raise ConfigError(
                f"metadata podSelector={spec.pod_selector!r} needs Kubernetes discovery, which is off on this"
                " server; use podNamePrefix"
            )
        if spec.pod_name_prefix is None:
            raise ConfigError(
                "metadata podNamePrefix is required when the server runs without Kubernetes;"
                " allowed: the common name prefix of the target's pods, e.g. 'vllm-qwen-'"
            )

    def want(self, namespace: str, spec: TriggerSpec, name: str | None = None) -> None:
        """Note that a trigger wants data, so collection starts (or goes on) without any I/O here."""
        self.check(spec)
        if self._targets is not None and name is not None:
            self._targets.track(namespace, name, spec)
        if self.source_of(spec) is Source.PROMETHEUS:
            self._interest.touch(prometheus_interest(namespace))
        else:
            self._interest.touch(SCRAPE_INTEREST)

    def evaluate(self, namespace: str, name: str, spec: TriggerSpec) -> Evaluation:
        self.want(namespace, spec)
        targets = self._targets.resolve(namespace, name, spec) if self._targets is not None else None
        now = self._clock()
        key = (namespace, name, spec)
        version, epoch = self._store.version(namespace), self._store.epoch
        memo = self._memo.get(key)
        if memo is not None and memo.still_right(version, epoch, targets, now):
            if memo.error is not None:
                raise NoData(memo.error)
            assert memo.evaluation is not None
            return memo.evaluation
        try:
            evaluation, notes, valid_until = self._evaluate(namespace, name, spec, targets, now)
        except NoData as error:
            self._remember(key, _Memo(version, epoch, targets, now + NO_DATA_MEMO_SECONDS, None, str(error)))
            self._telemetry.record_evaluation(
                namespace, name, spec, None, str(error), (), _discovery(targets)
            )
            raise
        self._remember(key, _Memo(version, epoch, targets, valid_until, evaluation, None))
        self._telemetry.record_evaluation(namespace, name, spec, evaluation, None, notes, _discovery(targets))
        return evaluation

    def _remember(self, key: tuple[str, str, TriggerSpec], memo: _Memo) -> None:
        if len(self._memo) >= MAX_MEMO_ENTRIES:
            self._memo.clear()  # ScaledObjects come and go; a full clear only costs one evaluation each
        self._memo[key] = memo

    def _evaluate(
        self, namespace: str, name: str, spec: TriggerSpec, targets: Targets | None, now: float
    ) -> tuple[Evaluation, tuple[str, ...], float]:
        """The evaluation, its notes, and until when it stays right if the store does not change."""
        kind = SourceKind.PROMETHEUS if self.source_of(spec) is Source.PROMETHEUS else SourceKind.SCRAPE
        if targets is not None and not targets.pods:
            # Scaled to zero with discovery healthy: 0 and inactive, whatever the sources say (SPEC §4).
            return evaluate({}, (), spec, aggregation_for(spec, targets.metric_type)[0]), (), float("inf")
        staleness = self._prometheus_max_staleness if kind is SourceKind.PROMETHEUS else self._max_staleness
        view = self._store.view(namespace, now, staleness, kind)
        problems = "; ".join(view.problems[:5])
        if view.sources == 0:
            raise NoData(f"no {kind.value} source is configured or discovered for namespace {namespace!r}")
        if view.fresh_sources == 0:
            raise NoData(f"no source has fresh data: {problems}")
        families = spec.vendor.families
        if targets is None:
            # Without Kubernetes the targets are the pods the fresh pages name (with or without a usable
            # value) plus those recently seen on sources now failing or stale; the prefix selects them.
            prefix = spec.pod_name_prefix or ""
            readings = [r for r in view.readings if r.pod.startswith(prefix) and r.family in families]
            target_pods = {r.pod for r in readings}
            target_pods.update(pod for pod in view.recently_seen if pod.startswith(prefix))
        else:
            readings = [r for r in view.readings if r.pod in targets.pods and r.family in families]
            target_pods = set(targets.pods)
        aggregation, mismatch = aggregation_for(spec, targets.metric_type if targets else None)
        notes: tuple[str, ...] = ()
        if mismatch:
            # Every new evaluation counts it; the log says it once per ScaledObject, not on every scrape.
            if (namespace, name, mismatch) not in self._mismatches_logged:
                self._mismatches_logged.add((namespace, name, mismatch))
                log.warning("ScaledObject %s/%s: %s", namespace, name, mismatch)
            self._telemetry.aggregation_mismatches.inc()
            notes = (mismatch,)
        reporting = pod_values(readings, spec)
        try:
            return (
                evaluate(reporting, target_pods - reporting.keys(), spec, aggregation),
                notes,
                view.valid_until,
            )
        except NoData as error:
            raise NoData(f"{error}{'; ' + problems if problems else ''}") from None


def _discovery(targets: Targets | None) -> dict[str, Any] | None:
    """What Kubernetes discovery said, for /explain (None without Kubernetes)."""
    if targets is None:
        return None
    return {"targetPods": sorted(targets.pods), "metricType": targets.metric_type}
