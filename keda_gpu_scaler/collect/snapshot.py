"""What one followed trigger reads now, taken from the store, discovery's caches and the histories:
the snapshot decide() turns into a value. Taking it reads caches only (no I/O, never waits)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from keda_gpu_scaler.collect.demand_history import DemandHistory
from keda_gpu_scaler.collect.gateway import GatewayPages
from keda_gpu_scaler.collect.gateway_source import ReplicaQueue
from keda_gpu_scaler.collect.inference import page_of
from keda_gpu_scaler.collect.pending_history import PendingHistory
from keda_gpu_scaler.collect.prometheus_sources import gateway_source
from keda_gpu_scaler.collect.store import Store, source_problem
from keda_gpu_scaler.collect.wanted import EppPool
from keda_gpu_scaler.core.demand import MAX_WINDOW_SECONDS, MIN_WINDOW_SECONDS
from keda_gpu_scaler.core.errors import ConfigError, NoData
from keda_gpu_scaler.core.pending import ReplicaInput
from keda_gpu_scaler.core.snapshot import (
    OWN_PAGE,
    NamespaceView,
    PoolSnapshot,
    Snapshot,
    SourceKind,
    Targets,
    Track,
)
from keda_gpu_scaler.core.trigger import Metric, Source, TriggerSpec
from keda_gpu_scaler.pages.engines import PodSamples
from keda_gpu_scaler.pages.gateways import DEFAULT_GATEWAY_METRICS_PORT
from keda_gpu_scaler.pages.prometheus_answer import ReplicaLost
from keda_gpu_scaler.pages.vendors import GpuReading


class TargetResolver(Protocol):
    """Discovery (Kubernetes): answers from its caches, never waits on the API server."""

    def check(self, spec: TriggerSpec) -> None:
        """Raise ConfigError for metadata this resolver cannot serve."""

    def resolve(self, namespace: str, name: str, spec: TriggerSpec, exporters: bool = True) -> Targets:
        """The target pods now; raises NoData while unknown or when discovery is failing (`exporters`:
        also while no GPU exporter is found on their nodes)."""

    def forget(self, namespace: str, name: str) -> None:
        """Drop everything kept for this ScaledObject (the registry evicted it)."""


class Snapshots:
    """Takes snapshots for followed triggers; owns the histories rates need (fed as pages are stored)."""

    def __init__(
        self,
        *,
        store: Store,
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
        gateway_interval: float | None = None,
    ) -> None:
        self._store = store
        self._max_staleness = max_staleness
        self._prometheus_max_staleness = prometheus_max_staleness or max_staleness
        self._clock = clock
        self._default_source = default_source
        self._prometheus_enabled = prometheus_enabled
        self._targets = targets
        self._gateway_pages = gateway_pages
        self._gateway_max_staleness = gateway_max_staleness or max_staleness
        self._scrape_interval = scrape_interval
        self._gateway_interval = gateway_interval
        # `demand`'s rates: every pod page is told to the history as the store records it.
        self.demand_history = DemandHistory(forget_after=demand_forget_after)
        store.page_listeners.append(self.demand_history.on_page)
        store.removal_listeners.append(self.demand_history.on_removed)
        # `demand` with `inferencePool`: the gateway's pending requests at the times its pages were read.
        self.pending_history = PendingHistory(forget_after=demand_forget_after)
        store.page_listeners.append(self.pending_history.on_page)
        store.removal_listeners.append(self.pending_history.on_removed)

    def source_of(self, spec: TriggerSpec) -> Source:
        if spec.metric is Metric.DEMAND:
            # Rates are taken over the pods' own pages as they are read (trigger parsing refuses prometheus).
            return Source.SCRAPE
        if spec.metric.gateway:
            # The endpoint pickers' own pages unless the trigger says otherwise: through Prometheus the
            # wake comes a scrape interval later, which a server-wide default must not choose silently.
            return spec.source or Source.SCRAPE
        return spec.source or self._default_source

    def kind_of(self, spec: TriggerSpec) -> SourceKind:
        """Which store sources answer a trigger: GPU exporters or inference servers, directly or via Prometheus."""
        prometheus = self.source_of(spec) is Source.PROMETHEUS
        if spec.metric.gateway:
            return SourceKind.PROMETHEUS_GATEWAY if prometheus else SourceKind.GATEWAY
        if spec.metric.inference:
            return SourceKind.PROMETHEUS_INFERENCE if prometheus else SourceKind.INFERENCE
        return SourceKind.PROMETHEUS if prometheus else SourceKind.SCRAPE

    def check(self, spec: TriggerSpec) -> None:
        """Reject triggers this server's configuration cannot serve (INVALID_ARGUMENT), before any data."""
        if self.source_of(spec) is Source.PROMETHEUS and not self._prometheus_enabled:
            raise ConfigError(
                "metadata source='prometheus' is not available: this server has no --prometheus-url;"
                " allowed: scrape"
            )
        self._check_window(spec)
        self._check_pod_page_keys(spec)
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

    def _check_pod_page_keys(self, spec: TriggerSpec) -> None:
        """Where pods' pages are found: with Kubernetes only, and never through Prometheus. Elsewhere the
        keys would be read by nothing (the pages are --inference-url's and --gateway-url's), so a typo'd
        port would go unnoticed."""
        given = [
            f"{key}={value}"
            for key, value, default in (
                ("metricsPort", spec.metrics_port, None),
                ("metricsPath", spec.metrics_path, "/metrics"),
                ("gatewayMetricsPort", spec.gateway_metrics_port, DEFAULT_GATEWAY_METRICS_PORT),
            )
            if value != default
        ]
        if given and self._targets is None:
            raise ConfigError(
                f"metadata {given[0]} needs Kubernetes discovery, which is off on this server: the pages read"
                " are the --inference-url and --gateway-url addresses; remove it"
            )
        # Through Prometheus the pods' pages are not read, nor (for `pending`) the endpoint pickers'.
        if self.kind_of(spec) is SourceKind.PROMETHEUS_GATEWAY:
            read_by_prometheus = given
        elif self.source_of(spec) is Source.PROMETHEUS:
            read_by_prometheus = [g for g in given if not g.startswith("gateway")]
        else:
            read_by_prometheus = []
        if read_by_prometheus:
            raise ConfigError(
                f"metadata {read_by_prometheus[0]} is not read with source=prometheus (Prometheus scrapes"
                " the pages); remove it, or read the pages with source=scrape"
            )

    def _check_window(self, spec: TriggerSpec) -> None:
        """A rate needs two pages within the window: one shorter than the scrape interval would be widened
        to two pages without a word, so it is refused naming both."""
        if spec.metric is not Metric.DEMAND:
            return
        # With inferencePool the pool's pending growth is a rate over the endpoint pickers' pages too.
        pool = spec.inference_pool is not None
        for flag, interval in (
            ("--scrape-interval", self._scrape_interval),
            ("--gateway-interval", self._gateway_interval if pool else None),
        ):
            if interval is not None and spec.window < interval:
                raise ConfigError(
                    f"metadata window={spec.window:g} is shorter than the interval its pages are read at"
                    f" ({flag} {interval:g} s): a rate needs two pages; allowed:"
                    f" {max(interval, MIN_WINDOW_SECONDS):g}-{MAX_WINDOW_SECONDS:g}"
                )

    def now(self) -> float:
        """The time a snapshot taken now is taken at (the clock every collection time is on)."""
        return self._clock()

    def take(
        self,
        namespace: str,
        name: str,
        spec: TriggerSpec,
        recent_demand: tuple[float, ...] = (),
        recent_latency: tuple[tuple[float, float], ...] = (),
    ) -> Snapshot:
        """What the trigger reads now (`recent_demand`: what its recent decisions summed; `recent_latency`:
        its recent windows' requests and misses; both kept by the caller); NoData when discovery cannot
        say which pods are the target."""
        now, kind = self._clock(), self.kind_of(spec)
        pool = self._pool(namespace, spec, now) if spec.inference_pool is not None else None
        if spec.metric.gateway:
            return Snapshot(namespace, now, kind, pool=pool)
        scraped = kind is SourceKind.SCRAPE
        targets = self._targets.resolve(namespace, name, spec, scraped) if self._targets is not None else None
        if targets is not None and not targets.pods:
            return Snapshot(namespace, now, kind, targets, pool=pool)
        view = self._store.view(namespace, now, self._staleness(kind), kind)
        gpu, pods, target_pods = _chosen(view, spec, targets, kind is SourceKind.PROMETHEUS_INFERENCE)
        tracks: tuple[tuple[str, Track], ...] = ()
        if spec.metric is Metric.DEMAND or spec.slo is not None:  # rates, or a latency target's histograms
            read = self.demand_history.read
            tracks = tuple((p.pod, read(p, spec.engine, spec.model, spec.window, now)) for p in pods)
        return Snapshot(
            namespace,
            now,
            kind,
            targets,
            view,
            gpu,
            pods,
            target_pods,
            tracks,
            pool,
            recent_demand,
            recent_latency,
        )

    def remember(self, namespace: str, spec: TriggerSpec, tokens_per_request: float) -> None:
        """`demandUnit: tokens`: the pods' tokens per request just measured, for when they measure none."""
        assert spec.inference_pool is not None
        key = (namespace, spec.inference_pool, spec.model)
        self.pending_history.remember_size(key, spec.prefill_weight, tokens_per_request, self.now())

    def _pool(self, namespace: str, spec: TriggerSpec, now: float) -> PoolSnapshot:
        assert spec.inference_pool is not None
        key = (namespace, spec.inference_pool, spec.model)
        unknown = self._unknown_pool(namespace, spec)
        no_replica = unknown or self._no_replica(namespace, spec)
        demand = spec.metric is Metric.DEMAND
        if demand and unknown is None:
            self.pending_history.want(key, spec.window, now)
        size = self.pending_history.remember_size(key, spec.prefill_weight, None, now) if demand else None
        try:
            replicas = tuple(self._replica_inputs(namespace, spec, now))
        except NoData as error:
            return PoolSnapshot((), no_replica, unknown, str(error), tokens_per_request=size)
        growth: dict[str, float] = {}
        if demand and unknown is None:
            for replica in replicas:
                if replica.table is not None:
                    growth[replica.name] = self.pending_history.growth(key, (replica.name,), spec.window, now)
        return PoolSnapshot(replicas, no_replica, unknown, None, growth, size)

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
        # Ready replicas whose metrics port cannot be reached, or whose page is read for another pool or
        # for none: unread, never left out (SPEC §7).
        if self._gateway_pages is not None:
            unread = {**self._gateway_pages.unreachable(pool), **self._gateway_pages.read_elsewhere(pool)}
            found.extend(ReplicaInput(name, None, why) for name, why in sorted(unread.items()))
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
        assert spec.inference_pool is not None
        pool = f"InferencePool {namespace}/{spec.inference_pool}"
        if self._gateway_pages is not None:
            problem = self._gateway_pages.problem(
                EppPool(namespace, spec.inference_pool, spec.gateway_metrics_port)
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


def _chosen(
    view: NamespaceView, spec: TriggerSpec, targets: Targets | None, through_prometheus: bool = False
) -> tuple[tuple[GpuReading, ...], tuple[PodSamples, ...], frozenset[str]]:
    """The target pods' readings in the view (GPU readings, or one PodSamples per inference pod page) and
    every pod that counts as a target, read or not."""
    if targets is not None and through_prometheus:
        # Prometheus gives one PodSamples per pod (by its namespace/pod labels), with no page address:
        # metricsPort and metricsPath choose nothing there.
        pods = tuple(r for r in view.readings if isinstance(r, PodSamples) and r.pod in targets.pods)
        return (), pods, targets.pods
    if targets is not None:
        # A pod may serve several pages (one per container): the trigger reads its own.
        own = {
            pod: page[1]
            for pod in targets.pods
            if (endpoint := targets.endpoints.get(pod)) is not None
            and (page := page_of(endpoint, spec.metrics_port, spec.metrics_path)) is not None
        }
        pods = tuple(r for r in view.readings if isinstance(r, PodSamples) and own.get(r.pod) == r.source)
        return _gpu(view, spec, targets.pods.__contains__), pods, targets.pods
    # Without Kubernetes the targets are the pods the fresh pages name (with or without a usable value)
    # plus those recently seen on sources now failing or stale; the prefix selects them.
    prefix = spec.pod_name_prefix or ""
    pods = tuple(r for r in view.readings if isinstance(r, PodSamples) and r.pod.startswith(prefix))
    gpu = _gpu(view, spec, lambda pod: pod.startswith(prefix))
    target_pods = {r.pod for r in pods} | {r.pod for r in gpu}
    # Only where the trigger read them: a pod seen on another vendor's failing exporter is not its target.
    kinds = (OWN_PAGE,) if spec.metric.inference else spec.vendor.families
    target_pods.update(
        pod for pod in view.recently_seen if pod.startswith(prefix) and view.read_as(pod, kinds)
    )
    return gpu, pods, frozenset(target_pods)


def _gpu(view: NamespaceView, spec: TriggerSpec, chosen: Callable[[str], bool]) -> tuple[GpuReading, ...]:
    """The chosen pods' GPU readings of the trigger's vendor families (none for an inference metric)."""
    if spec.metric.inference:
        return ()
    families = spec.vendor.families
    return tuple(
        r for r in view.readings if isinstance(r, GpuReading) and chosen(r.pod) and r.family in families
    )
