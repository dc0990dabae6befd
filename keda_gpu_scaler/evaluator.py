"""Answers "what is this ScaledObject's value now?" from the store and discovery caches, without any I/O."""

from __future__ import annotations

import difflib
import logging
import time
from collections.abc import Callable
from typing import Protocol

from keda_gpu_scaler.collect.demand_history import DemandHistory
from keda_gpu_scaler.collect.gateway import GatewayPages
from keda_gpu_scaler.collect.gateway_source import ReplicaQueue
from keda_gpu_scaler.collect.inference import page_of
from keda_gpu_scaler.collect.pending_history import PendingHistory
from keda_gpu_scaler.collect.prometheus import gateway_source
from keda_gpu_scaler.collect.prometheus_answer import ReplicaLost
from keda_gpu_scaler.collect.store import NamespaceView, SourceKind, Store, source_problem
from keda_gpu_scaler.demand import MAX_WINDOW_SECONDS, MIN_WINDOW_SECONDS
from keda_gpu_scaler.demand_values import demand_pod_values, measured_tokens_per_request, with_pending
from keda_gpu_scaler.discovery.targets import Targets  # defined beside discovery, re-exported here
from keda_gpu_scaler.engines import PodSamples
from keda_gpu_scaler.errors import ConfigError, NoData
from keda_gpu_scaler.metrics import Telemetry
from keda_gpu_scaler.pending import ReplicaInput, pending_evaluation
from keda_gpu_scaler.registry import Explanation, Followed, Subscription
from keda_gpu_scaler.scaling import Evaluation, evaluate, inference_pod_values, pod_values
from keda_gpu_scaler.trigger import Aggregation, Metric, Source, TriggerSpec
from keda_gpu_scaler.vendors import GpuReading
from keda_gpu_scaler.wanted import EppPool
from keda_gpu_scaler.wire import check_rows, check_total

log = logging.getLogger(__name__)


class TargetResolver(Protocol):
    """Discovery (Kubernetes): answers from its caches, never waits on the API server."""

    def check(self, spec: TriggerSpec) -> None:
        """Raise ConfigError for metadata this resolver cannot serve."""

    def resolve(self, namespace: str, name: str, spec: TriggerSpec) -> Targets:
        """The target pods now; raises NoData while unknown or when discovery is failing."""

    def forget(self, namespace: str, name: str) -> None:
        """Drop everything kept for this ScaledObject (the registry evicted it)."""


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


def _prefix_matching_nothing(spec: TriggerSpec, pods: list[str], inference: bool) -> str:
    """The note for a podNamePrefix no pod of the namespace's pages has (legitimately 0: scaled to zero).

    NoData instead when the prefix is close to pods the pages do name: far likelier a typo than a
    workload at zero beside a near-namesake, and a typo must not read as 0 (KEDA would scale to zero)."""
    prefix = spec.pod_name_prefix or ""
    what = "inference-server" if inference else "GPU"
    heads = {pod[: len(prefix)]: pod for pod in reversed(pods)}  # each prefix-long head → its first pod
    close = [heads[head] for head in difflib.get_close_matches(prefix, heads, n=3, cutoff=0.8)]
    if close:
        raise NoData(
            f"metadata podNamePrefix {prefix!r} matches none of the namespace's {what} pods, but is close to"
            f" {', '.join(close)}: a typo? Pods read: {_listed(pods)}. (A workload at zero reads 0 only when"
            " its prefix is not that close to another's: rename it, or use Kubernetes discovery)"
        )
    return f"podNamePrefix {prefix!r} matches none of the namespace's {what} pods: {_listed(pods)}"


def _listed(names: list[str], limit: int = 10) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


class Evaluator:
    """Works out a trigger's value on every call, from the store only: at the rate KEDA calls (each
    ScaledObject every 30 s by default) an evaluation costs far less than keeping one would save."""

    def __init__(
        self,
        *,
        store: Store,
        telemetry: Telemetry,
        max_staleness: float,
        prometheus_max_staleness: float | None = None,
        clock: Callable[[], float],
        default_source: Source = Source.SCRAPE,
        prometheus_enabled: bool = False,
        targets: TargetResolver | None = None,
        gateway_pages: GatewayPages | None = None,
        gateway_max_staleness: float | None = None,
        demand_forget_after: float = 600.0,
        scrape_interval: float | None = None,
    ) -> None:
        self._store = store
        self._telemetry = telemetry
        self._max_staleness = max_staleness
        self._prometheus_max_staleness = prometheus_max_staleness or max_staleness
        self._clock = clock
        self._default_source = default_source
        self._prometheus_enabled = prometheus_enabled
        self._targets = targets
        self._gateway_pages = gateway_pages
        self._gateway_max_staleness = gateway_max_staleness or max_staleness
        # `demand`'s rates: every pod page is told to the history as the store records it.
        self.demand_history = DemandHistory(forget_after=demand_forget_after)
        store.page_listeners.append(self.demand_history.on_page)
        store.removal_listeners.append(self.demand_history.on_removed)
        # `demand` with `inferencePool`: the gateway's pending requests at the times its pages were read.
        self.pending_history = PendingHistory(forget_after=demand_forget_after)
        store.page_listeners.append(self.pending_history.on_page)
        store.removal_listeners.append(self.pending_history.on_removed)
        self._scrape_interval = scrape_interval

    def source_of(self, spec: TriggerSpec) -> Source:
        if spec.metric is Metric.DEMAND:
            # Rates are taken over the pods' own pages as they are read (trigger parsing refuses prometheus).
            return Source.SCRAPE
        if spec.metric.gateway:
            # The endpoint pickers' own pages unless the trigger says otherwise: through Prometheus the
            # wake comes a scrape interval later, which a server-wide default must not choose silently.
            return spec.source or Source.SCRAPE
        return spec.source or self._default_source

    def check(self, spec: TriggerSpec) -> None:
        """Reject triggers this server's configuration cannot serve (INVALID_ARGUMENT), before any data."""
        if self.source_of(spec) is Source.PROMETHEUS and not self._prometheus_enabled:
            raise ConfigError(
                "metadata source='prometheus' is not available: this server has no --prometheus-url;"
                " allowed: scrape"
            )
        self._check_window(spec)
        if spec.metric.gateway:
            return  # the pool's endpoint pickers are read (or their series), never the target's pods
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

    def _check_window(self, spec: TriggerSpec) -> None:
        """A rate needs two pages within the window: one shorter than the scrape interval would be widened
        to two pages without a word, so it is refused naming both."""
        interval = self._scrape_interval
        if spec.metric is not Metric.DEMAND or interval is None or spec.window >= interval:
            return
        raise ConfigError(
            f"metadata window={spec.window:g} is shorter than the scrape interval (--scrape-interval"
            f" {interval:g} s): a rate needs two pages; allowed: {max(interval, MIN_WINDOW_SECONDS):g}-"
            f"{MAX_WINDOW_SECONDS:g}"
        )

    def kind_of(self, spec: TriggerSpec) -> SourceKind:
        """Which store sources answer a trigger: GPU exporters or inference servers, directly or via Prometheus."""
        prometheus = self.source_of(spec) is Source.PROMETHEUS
        if spec.metric.gateway:
            return SourceKind.PROMETHEUS_GATEWAY if prometheus else SourceKind.GATEWAY
        if spec.metric.inference:
            return SourceKind.PROMETHEUS_INFERENCE if prometheus else SourceKind.INFERENCE
        return SourceKind.PROMETHEUS if prometheus else SourceKind.SCRAPE

    def evaluate(self, followed: Followed, spec: TriggerSpec) -> Evaluation:
        """The trigger's value now, from the caches only; raises NoData (UNAVAILABLE) when it cannot be known."""
        if spec.metric.gateway:
            return self._evaluate_pending(followed, spec)
        namespace, name = followed.namespace, followed.name
        subscription = followed.triggers[spec]  # follow() made it before any evaluation
        targets = self._targets.resolve(namespace, name, spec) if self._targets is not None else None
        now = self._clock()
        kind = self.kind_of(spec)
        view = None
        if targets is None or targets.pods:
            view = self._store.view(namespace, now, self._staleness(kind), kind)
        try:
            evaluation, notes = self._evaluate(followed, spec, targets, view)
        except (NoData, ConfigError) as error:
            self._record(followed, subscription, None, str(error), (), targets)
            raise
        last = subscription.explanation
        if last is not None and last.evaluation == evaluation:
            # The same result again: the objects already held stay and the new ones die at once, so equal
            # results do not promote new long-lived objects through the collector's generations.
            evaluation = last.evaluation
        self._record(followed, subscription, evaluation, None, notes, targets)
        return evaluation

    def _evaluate_pending(self, followed: Followed, spec: TriggerSpec) -> Evaluation:
        """`pending` (SPEC §7): the pool's endpoint-picker replicas' queues, from the store only.

        Reads the pages GatewayPages lists for the pool and adds or removes nothing. Worked out on every
        call: a pool has a few replica pages, and what is kept would have to notice each turning stale
        or fresh again.
        """
        namespace = followed.namespace
        subscription = followed.triggers[spec]  # follow() made it before any evaluation
        replicas = self._replica_inputs(namespace, spec, self._clock())
        try:
            result = pending_evaluation(replicas, spec, namespace, self._no_replica(namespace, spec))
        except (NoData, ConfigError) as error:
            # A `model` that can never match is the trigger's error (INVALID_ARGUMENT), shown in /explain too.
            self._record(followed, subscription, None, str(error), (), None)
            raise
        evaluation, notes = result.evaluation, result.notes
        for note in result.to_log:
            followed.log_once(note, logging.INFO)
        last = subscription.explanation
        if last is not None and last.evaluation == evaluation:
            evaluation = last.evaluation  # see evaluate(): keep the objects already held
        self._record(followed, subscription, evaluation, None, notes, None)
        return evaluation

    def _replica_inputs(self, namespace: str, spec: TriggerSpec, now: float) -> list[ReplicaInput]:
        """Each replica page of the trigger's pool: its fresh queue or why there is none."""
        assert spec.inference_pool is not None
        if self.kind_of(spec) is SourceKind.PROMETHEUS_GATEWAY:
            return self._prometheus_replica_inputs(namespace, spec.inference_pool, now)
        staleness = self._gateway_max_staleness
        found: list[ReplicaInput] = []
        pool = EppPool(namespace, spec.inference_pool, spec.gateway_metrics_port)
        replicas = self._gateway_pages.replicas(pool) if self._gateway_pages else ()
        for replica in replicas:
            state = self._store.source(replica.url)
            page = state.last_page if state is not None else None
            if state is None or page is None or now - page.collected_at > staleness:
                problem = source_problem(state, now, staleness) if state is not None else "not scraped yet"
                # A --gateway-url replica is named by its URL, which the problem already starts with.
                problem = problem.removeprefix(f"{replica.url}: ") if replica.name == replica.url else problem
                found.append(ReplicaInput(replica.name, None, problem))
                continue
            queues = [q for q in page.by_namespace.get(namespace, ()) if isinstance(q, ReplicaQueue)]
            found.append(
                ReplicaInput(replica.name, queues[0].table if queues else None, "no queue on its page")
            )
        return found

    def _prometheus_replica_inputs(self, namespace: str, pool: str, now: float) -> list[ReplicaInput]:
        """The pool's EPP replicas as Prometheus has them (one page per pool: see collect_gateway_once).

        Prometheus failing, or its answer too old, is NoData: the replicas cannot be told at all."""
        staleness = self._prometheus_max_staleness
        state = self._store.source(gateway_source(namespace, pool))
        page = state.last_page if state is not None else None
        if state is None or page is None or now - page.collected_at > staleness:
            why = source_problem(state, now, staleness) if state is not None else "not queried yet"
            raise NoData(
                f"the endpoint-picker series of InferencePool {namespace}/{pool} in Prometheus: {why}"
            )
        found: list[ReplicaInput] = []
        for element in page.by_namespace.get(namespace, ()):
            if isinstance(element, ReplicaQueue):
                found.append(ReplicaInput(element.replica, element.table))
            elif isinstance(element, ReplicaLost):
                found.append(ReplicaInput(element.replica, None, element.reason))
        return found

    def _unknown_pool(self, namespace: str, spec: TriggerSpec) -> str | None:
        """Why the trigger's InferencePool does not exist (naming those that do), or None (SPEC §7)."""
        if self._gateway_pages is None or self.kind_of(spec) is SourceKind.PROMETHEUS_GATEWAY:
            return None  # through Prometheus, which pools exist is not known here
        assert spec.inference_pool is not None
        pool = EppPool(namespace, spec.inference_pool, spec.gateway_metrics_port)
        return self._gateway_pages.unknown_pool(pool, discovering=self._targets is not None)

    def _no_replica(self, namespace: str, spec: TriggerSpec) -> str:
        pool = f"InferencePool {namespace}/{spec.inference_pool}"
        assert spec.inference_pool is not None
        problem = self._unknown_pool(namespace, spec) or (
            self._gateway_pages.problem(EppPool(namespace, spec.inference_pool, spec.gateway_metrics_port))
            if self._gateway_pages
            else None
        )
        if problem is not None:
            return problem
        if self.kind_of(spec) is SourceKind.PROMETHEUS_GATEWAY:
            return (
                f"Prometheus has no current endpoint-picker (EPP) series for {pool}: none of"
                f" llm_d_epp_flow_control_queue_size (or the older inference_extension_ name) and the flow"
                f" control families with inference_pool={spec.inference_pool!r} and namespace={namespace!r}."
                " Check that Prometheus scrapes the EPP pods (with their namespace label) and that the EPP's"
                " `flowControl` feature gate is on"
            )
        if self._targets is not None:
            return (
                f"no endpoint-picker (EPP) pod of {pool} is known yet: no Ready pod behind its"
                " endpointPickerRef Service has been seen"
            )
        return (
            f"no endpoint-picker (EPP) page of {pool} is configured: give --gateway-url"
            f" {namespace}/{spec.inference_pool}=URL (one per EPP replica)"
        )

    def _staleness(self, kind: SourceKind) -> float:
        through_prometheus = kind in (SourceKind.PROMETHEUS, SourceKind.PROMETHEUS_INFERENCE)
        return self._prometheus_max_staleness if through_prometheus else self._max_staleness

    def _record(
        self,
        followed: Followed,
        subscription: Subscription,
        evaluation: Evaluation | None,
        error: str | None,
        notes: tuple[str, ...],
        targets: Targets | None,
    ) -> None:
        self._telemetry.evaluations.labels("ok" if evaluation else "no_data").inc()
        spec = subscription.spec
        last = subscription.explanation
        if (
            evaluation is not None
            and last is not None
            and last.evaluation is evaluation
            and last.spec == spec
            and last.notes == notes
            and last.targets == targets
        ):
            last.evaluated_at = time.time()  # the same explanation, now (and the same gauges)
            return
        subscription.explanation = Explanation(spec, time.time(), evaluation, error, notes, targets)
        if evaluation is not None:
            labels = (followed.namespace, followed.name, spec.metric_name)
            # A ScaledObject shows a bounded number of triggers on /metrics (metrics.MAX_PUBLISHED_TRIGGERS).
            if self._telemetry.publish_trigger(labels, evaluation.value, evaluation.active):
                subscription.metric_labels = labels

    def _evaluate(
        self, followed: Followed, spec: TriggerSpec, targets: Targets | None, view: NamespaceView | None
    ) -> tuple[Evaluation, tuple[str, ...]]:
        """The evaluation from the namespace's view (None: no pods to read) and its notes."""
        namespace = followed.namespace
        kind = self.kind_of(spec)
        if view is None:
            # Scaled to zero with discovery healthy: 0 and inactive, whatever the sources say (SPEC §4),
            # but for the requests the gateway holds for a `demand` trigger's pool.
            # A target with pods that are not Ready yet is not at zero: evaluate() says UNAVAILABLE.
            assert targets is not None
            aggregation = aggregation_for(spec, targets.metric_type)[0]
            zero = evaluate({}, (), spec, aggregation, targets.starting)
            return self._add_pending(namespace, spec, zero)
        problems = "; ".join(view.problems[:5])
        if view.sources == 0:
            raise NoData(f"no {kind.value} source is configured or discovered for namespace {namespace!r}")
        if view.fresh_sources == 0:
            raise NoData(f"no source has fresh data: {problems}")
        families = spec.vendor.families
        inference = spec.metric.inference
        # A view holds the readings of one source kind: GPU readings, or one PodSamples per inference pod.
        gpu: list[GpuReading] = []
        pods: list[PodSamples] = []
        if targets is None:
            # Without Kubernetes the targets are the pods the fresh pages name (with or without a usable
            # value) plus those recently seen on sources now failing or stale; the prefix selects them.
            prefix = spec.pod_name_prefix or ""
            if inference:
                pods = [r for r in view.readings if isinstance(r, PodSamples) and r.pod.startswith(prefix)]
            else:
                gpu = [
                    r
                    for r in view.readings
                    if isinstance(r, GpuReading) and r.pod.startswith(prefix) and r.family in families
                ]
            target_pods = {r.pod for r in pods} | {r.pod for r in gpu}
            target_pods.update(pod for pod in view.recently_seen if pod.startswith(prefix))
            if not target_pods and view.fresh_sources < view.sources:
                # "Scaled to zero" is only an answer when every exporter could have named the pods.
                raise NoData(
                    f"no pod named {prefix}* is in the data and not every exporter answers, so zero pods"
                    f" cannot be told from an outage: {problems}"
                )
        else:
            chosen = targets.pods
            if inference:
                # A pod may serve several pages (one per container): the trigger reads its own.
                own = {
                    pod: page[1]
                    for pod in chosen
                    if (endpoint := targets.endpoints.get(pod)) is not None
                    and (page := page_of(endpoint, spec.metrics_port, spec.metrics_path)) is not None
                }
                pods = [r for r in view.readings if isinstance(r, PodSamples) and own.get(r.pod) == r.source]
            else:
                gpu = [
                    r
                    for r in view.readings
                    if isinstance(r, GpuReading) and r.pod in chosen and r.family in families
                ]
            target_pods = set(chosen)
        aggregation, mismatch = aggregation_for(spec, targets.metric_type if targets else None)
        notes: tuple[str, ...] = ()
        if targets is None and not target_pods and view.readings:
            note = _prefix_matching_nothing(spec, sorted({r.pod for r in view.readings}), inference)
            followed.log_once(note, logging.INFO)
            notes = (note,)
        if mismatch:
            # Every new evaluation counts it; the log says it once per ScaledObject, not on every scrape.
            followed.log_once(mismatch)
            self._telemetry.aggregation_mismatches.inc()
            notes += (mismatch,)
        if spec.metric is Metric.DEMAND:
            pool = (namespace, spec.inference_pool, spec.model) if spec.inference_pool else None
            size = self.pending_history.remember_size(pool, None) if pool else None
            reporting, without_value, demand_notes = demand_pod_values(
                self.demand_history, pods, spec, self._clock(), size
            )
            notes += demand_notes
            if without_value:
                reasons = "; ".join(f"{pod}: {why}" for pod, why in sorted(without_value.items())[:5])
                problems = f"{problems}; {reasons}" if problems else reasons
        elif inference:
            reporting, without_value = inference_pod_values(pods, spec)
            if without_value:
                reasons = "; ".join(f"{pod}: {why}" for pod, why in sorted(without_value.items())[:5])
                problems = f"{problems}; {reasons}" if problems else reasons
        else:
            reporting = pod_values(gpu, spec)
        try:
            # A pod's value beyond what KEDA can carry is UNAVAILABLE naming it (never INTERNAL); each
            # within it, their sum is finite and checked below.
            check_rows(reporting.values())
            evaluation = evaluate(
                reporting,
                target_pods - reporting.keys(),
                spec,
                aggregation,
                targets.starting if targets is not None else (),
            )
        except NoData as error:
            raise NoData(f"{error}{'; ' + problems if problems else ''}") from None
        evaluation, pool_notes = self._add_pending(namespace, spec, evaluation)
        # The workload's value (the pool's pending requests added, for demand) may still be beyond it.
        check_total(evaluation.value, evaluation.pod_rows)
        return evaluation, notes + pool_notes

    def _add_pending(
        self, namespace: str, spec: TriggerSpec, evaluation: Evaluation
    ) -> tuple[Evaluation, tuple[str, ...]]:
        """`demand` with `inferencePool`: the pods' demand plus the pool's pending requests (SPEC §6).

        The pool cannot be read (its replicas failing, none known): the pods' demand alone where it
        already says active (a lower bound, noted), else NoData: the unread queue may hold the requests
        that should wake the workload."""
        if spec.metric is not Metric.DEMAND or spec.inference_pool is None:
            return evaluation, ()
        unknown = self._unknown_pool(namespace, spec)
        if unknown is not None:
            raise NoData(unknown)  # even when the pods say active: a pool-name typo is no lower bound
        now = self._clock()
        key = (namespace, spec.inference_pool, spec.model)
        self.pending_history.want(key, spec.window, now)
        try:
            pending = pending_evaluation(
                self._replica_inputs(namespace, spec, now), spec, namespace, self._no_replica(namespace, spec)
            ).evaluation
        except NoData as error:
            if evaluation.active:
                return evaluation, (
                    f"value is a lower bound: the pool's pending requests cannot be read: {error}",
                )
            raise
        read = [row[0] for row in pending.pod_rows]  # the replicas read now (their growth counts)
        growth = self.pending_history.growth(key, read, spec.window, now)
        size = self.pending_history.remember_size(key, measured_tokens_per_request(evaluation))
        evaluation, note = with_pending(evaluation, spec, growth, pending.value, size)
        return evaluation, (note,)
