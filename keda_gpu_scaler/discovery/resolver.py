"""KubeDiscovery: the TargetResolver for Kubernetes, kept current in the background so that RPCs never wait."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol

from prometheus_client import Counter, Gauge

from keda_gpu_scaler.discovery.kube import KubeApi, KubeError, PodInformer, connect
from keda_gpu_scaler.discovery.pods import exporter_url
from keda_gpu_scaler.discovery.scaledobject import (
    ScaledObjectError,
    ScaledObjectInfo,
    ScaleTarget,
    metric_type_for,
    parse_scaled_object,
)
from keda_gpu_scaler.discovery.selectors import ExporterSelector, Selector, SelectorError, parse_selector
from keda_gpu_scaler.errors import ConfigError, NoData
from keda_gpu_scaler.evaluator import Targets
from keda_gpu_scaler.telemetry import PREFIX, Telemetry
from keda_gpu_scaler.trigger import TriggerSpec

log = logging.getLogger(__name__)

# How long a kind → plural look-up is trusted before a miss triggers a new discovery request (a CRD
# installed after the scaler started must become usable without a restart).
DISCOVERY_CACHE_SECONDS = 60.0
FIRST_RETRY_SECONDS = 0.5


class ExporterSink(Protocol):
    """Where discovered exporter URLs go (the scrape collector)."""

    def add(self, url: str) -> None: ...

    def remove(self, url: str) -> None: ...


@dataclass(frozen=True, slots=True)
class DiscoveryConfig:
    kubeconfig: str | None  # None: the in-cluster service account
    exporter_selectors: tuple[ExporterSelector, ...]
    refresh_interval: float  # seconds between re-reads of a ScaledObject and its /scale
    interest_ttl: float  # a ScaledObject no call asked about for this long is forgotten
    static_urls: frozenset[str] = frozenset()  # --exporter-url: never removed by discovery


@dataclass(frozen=True, slots=True)
class _Selection:
    """What one selector picks in a namespace's pod cache, as of the last reconciliation."""

    targets: frozenset[str]  # names of the pods that count as targets
    nodes: frozenset[str]  # the nodes those pods run on


@dataclass(eq=False)
class _Tracked:
    """What discovery knows of one ScaledObject."""

    namespace: str
    name: str
    last_wanted: float
    info: ScaledObjectInfo | None = None
    object_error: str | None = None
    selector: Selector | None = None  # the scale target's, from its /scale subresource
    scale_error: str | None = None
    overrides: dict[str, Selector] = field(default_factory=dict)  # podSelector metadata seen in calls
    task: asyncio.Task[None] | None = None
    notes_logged: set[str] = field(default_factory=set)
    selections: dict[Selector, _Selection] = field(default_factory=dict)  # of selectors(), by _sync

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selectors(self) -> list[Selector]:
        return [s for s in (self.selector, *self.overrides.values()) if s is not None]


class KubeDiscovery:
    """ScaledObject → scaleTargetRef → /scale selector → pods; trigger metricType; exporters on those nodes."""

    def __init__(
        self, settings: DiscoveryConfig, telemetry: Telemetry, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._api: KubeApi | None = None
        self._sink: ExporterSink | None = None
        self._tracked: dict[tuple[str, str], _Tracked] = {}
        self._namespaces: dict[str, PodInformer] = {}
        self._exporters: list[tuple[ExporterSelector, PodInformer]] = []
        self._plurals: dict[tuple[str, str], tuple[float, dict[str, tuple[str, bool]]]] = {}
        self._discovered: dict[str, str] = {}  # exporter URL → node
        self._sync_pending = False
        registry = telemetry.registry
        self.watch_restarts = Counter(
            f"{PREFIX}_kubernetes_watch_restarts",
            "pod list+watch restarts: reason=gone (410, relisted) or error (API unreachable or denied)",
            ["reason"],
            registry=registry,
        )
        self.discovered_exporters = Gauge(
            f"{PREFIX}_kubernetes_discovered_exporters",
            "exporter endpoints scraped because target pods run on their nodes",
            registry=registry,
        )
        self.tracked_scaled_objects = Gauge(
            f"{PREFIX}_kubernetes_tracked_scaledobjects", "ScaledObjects discovery follows", registry=registry
        )

    async def start(self, sink: ExporterSink) -> None:
        """Load credentials (raises kube.ConnectError); nothing is read from the API until a call asks."""
        self._sink = sink
        self._api = KubeApi(await connect(self._settings.kubeconfig))

    async def stop(self) -> None:
        tasks = [t.task for t in self._tracked.values() if t.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tracked.clear()
        for informer in [*self._namespaces.values(), *(i for _, i in self._exporters)]:
            await informer.stop()
        self._namespaces.clear()
        self._exporters.clear()
        if self._api is not None:
            await self._api.close()
            self._api = None

    # --- TargetResolver -------------------------------------------------------------------------------

    def check(self, spec: TriggerSpec) -> None:
        if spec.pod_name_prefix is not None:
            raise ConfigError(
                f"metadata podNamePrefix={spec.pod_name_prefix!r} is for servers running with --kubernetes off;"
                " this server finds the target's pods from the ScaledObject's scaleTargetRef. Remove"
                " podNamePrefix, or give podSelector (a label selector) to choose other pods"
            )
        if spec.pod_selector is not None:
            _pod_selector(spec.pod_selector)

    def track(self, namespace: str, name: str, spec: TriggerSpec) -> None:
        """Start following a ScaledObject (or note that it is still wanted), without waiting for anything."""
        self.check(spec)
        key = (namespace, name)
        tracked = self._tracked.get(key)
        now = self._clock()
        if tracked is None:
            tracked = _Tracked(namespace, name, now)
            self._tracked[key] = tracked
            self.tracked_scaled_objects.set(len(self._tracked))
        if tracked.task is None and self._api is not None:
            self._watch_namespace(namespace)
            self._watch_exporters()
            tracked.task = asyncio.create_task(self._follow(tracked), name=f"follow {tracked.ref}")
        tracked.last_wanted = now
        if spec.pod_selector is not None and spec.pod_selector not in tracked.overrides:
            tracked.overrides[spec.pod_selector] = _pod_selector(spec.pod_selector)
            self._schedule_sync()

    def resolve(self, namespace: str, name: str, spec: TriggerSpec) -> Targets:
        self.track(namespace, name, spec)
        tracked = self._tracked[(namespace, name)]
        if self._api is None:
            raise NoData("Kubernetes discovery is not connected")
        if tracked.object_error is not None:
            raise NoData(tracked.object_error)
        if tracked.info is None:
            raise NoData(f"reading ScaledObject {tracked.ref} from the Kubernetes API (first look-up)")
        if spec.pod_selector is not None:
            selector = tracked.overrides[spec.pod_selector]
        elif tracked.scale_error is not None:
            raise NoData(tracked.scale_error)
        elif tracked.selector is None:
            raise NoData(f"reading the pod selector of {tracked.info.target} (first look-up)")
        else:
            selector = tracked.selector
        informer = self._namespaces[namespace]
        if informer.error is not None:
            raise NoData(informer.error)
        if not informer.synced:
            raise NoData(f"listing the {informer.what} (first list)")
        # A pod event may have arrived since the last reconciliation: bring it up to date first.
        self._sync_if_pending()
        selection = tracked.selections[selector]
        if selection.targets:
            self._check_exporters(selection.nodes)
        metric_type, note = metric_type_for(tracked.info, spec)
        if note is not None and note not in tracked.notes_logged:
            tracked.notes_logged.add(note)
            log.warning(
                "ScaledObject %s: cannot tell the trigger's metricType (%s); aggregation defaults to sum,"
                " right for metricType AverageValue",
                tracked.ref,
                note,
            )
        return Targets(selection.targets, metric_type)

    # --- internals ------------------------------------------------------------------------------------

    def _check_exporters(self, nodes: frozenset[str]) -> None:
        failing = [i.error for _, i in self._exporters if i.error is not None]
        if failing and len(failing) == len(self._exporters):
            raise NoData(f"cannot find the GPU exporters: {failing[0]}")
        if self._settings.static_urls or not nodes.isdisjoint(self._discovered.values()):
            return
        if any(not i.synced for _, i in self._exporters):
            raise NoData("listing the GPU exporter pods (first list)")
        selectors = ", ".join(repr(str(s)) for s, _ in self._exporters)
        raise NoData(
            f"no GPU exporter pod runs on the target pods' nodes ({', '.join(sorted(nodes))}); exporters are"
            f" found by --exporter-selector {selectors}"
        )

    def _watch_namespace(self, namespace: str) -> None:
        if namespace in self._namespaces or self._api is None:
            return
        informer = PodInformer(
            self._api,
            namespace=namespace,
            label_selector=None,
            on_change=self._schedule_sync,
            on_restart=self._restarted,
        )
        self._namespaces[namespace] = informer
        informer.start()

    def _watch_exporters(self) -> None:
        if self._exporters or self._api is None:
            return
        for exporter in self._settings.exporter_selectors:
            informer = PodInformer(
                self._api,
                namespace=None,
                label_selector=str(exporter.selector),
                on_change=self._schedule_sync,
                on_restart=self._restarted,
            )
            self._exporters.append((exporter, informer))
            informer.start()

    def _restarted(self, reason: str) -> None:
        self.watch_restarts.labels(reason).inc()

    async def _follow(self, tracked: _Tracked) -> None:
        """Re-read the ScaledObject and its /scale until no call has wanted it for the interest TTL."""
        failures = 0
        try:
            while self._clock() - tracked.last_wanted < self._settings.interest_ttl:
                try:
                    ok = await self._refresh(tracked)
                except Exception:
                    # A bug must not stop following the object silently: say so, answer NoData, retry.
                    log.exception("ScaledObject %s: discovery failed", tracked.ref)
                    tracked.object_error = (
                        f"discovery of ScaledObject {tracked.ref} failed; see the scaler's log"
                    )
                    ok = False
                failures = 0 if ok else failures + 1
                interval = self._settings.refresh_interval
                delay = interval if ok else min(interval, FIRST_RETRY_SECONDS * 2 ** min(failures - 1, 10))
                await asyncio.sleep(delay * random.uniform(0.9, 1.0))
        finally:
            if self._tracked.get((tracked.namespace, tracked.name)) is tracked and not _cancelling():
                await self._forget(tracked)

    async def _forget(self, tracked: _Tracked) -> None:
        log.info(
            "ScaledObject %s: no call for %.0fs, no longer followed", tracked.ref, self._settings.interest_ttl
        )
        del self._tracked[(tracked.namespace, tracked.name)]
        self.tracked_scaled_objects.set(len(self._tracked))
        if not any(t.namespace == tracked.namespace for t in self._tracked.values()):
            informer = self._namespaces.pop(tracked.namespace, None)
            if informer is not None:
                await informer.stop()
        if not self._tracked:
            exporters, self._exporters = self._exporters, []
            for _, informer in exporters:
                await informer.stop()
        self._schedule_sync()

    async def _refresh(self, tracked: _Tracked) -> bool:
        assert self._api is not None
        try:
            obj = await self._api.scaled_object(tracked.namespace, tracked.name)
            tracked.info = parse_scaled_object(obj)
            tracked.object_error = None
        except (KubeError, ScaledObjectError) as error:
            tracked.object_error = f"cannot read ScaledObject {tracked.ref}: {error}"
            return False
        target = tracked.info.target
        try:
            plural = await self._plural(target)
            scale = await self._api.scale(
                target.group, target.version, tracked.namespace, plural, target.name
            )
            text = (scale.get("status") or {}).get("selector") or ""
            selector = parse_selector(text)
            if selector.empty:
                raise KubeError(
                    "its /scale subresource has no status.selector; give podSelector in the trigger metadata"
                )
            tracked.selector = selector
            tracked.scale_error = None
            return True
        except (KubeError, SelectorError) as error:
            # The last selector stays in use for exporter discovery, so a blip does not stop scraping.
            tracked.scale_error = (
                f"cannot read the pod selector of {target} for ScaledObject {tracked.ref}: {error}"
            )
            return False
        finally:
            self._schedule_sync()

    async def _plural(self, target: ScaleTarget) -> str:
        """Kind → resource name through API discovery, so any kind with a /scale subresource works."""
        assert self._api is not None
        if not target.group:
            raise KubeError(
                f"scaleTargetRef apiVersion {target.api_version!r} (the core API group) is not supported"
            )
        key = (target.group, target.version)
        cached = self._plurals.get(key)
        now = self._clock()
        if cached is None or (target.kind not in cached[1] and now - cached[0] > DISCOVERY_CACHE_SECONDS):
            document = await self._api.api_resources(target.group, target.version)
            names = {r.get("name") for r in document.get("resources") or ()}
            kinds = {
                r["kind"]: (r["name"], f"{r['name']}/scale" in names)
                for r in document.get("resources") or ()
                if r.get("kind") and r.get("name") and "/" not in r["name"]
            }
            cached = (now, kinds)
            self._plurals[key] = cached
        found = cached[1].get(target.kind)
        if found is None:
            raise KubeError(f"the API server does not serve kind {target.kind!r} in {target.api_version!r}")
        plural, has_scale = found
        if not has_scale:
            raise KubeError(f"kind {target.kind!r} has no /scale subresource, so KEDA cannot scale it either")
        return plural

    def _schedule_sync(self) -> None:
        # Coalesce bursts (a relist, many watch events) into one reconciliation on the next loop turn.
        if not self._sync_pending:
            self._sync_pending = True
            asyncio.get_running_loop().call_soon(self._sync_if_pending)

    def _sync_if_pending(self) -> None:
        # resolve() may have reconciled already since this was scheduled: then there is nothing to do.
        if self._sync_pending:
            self._sync()

    def _sync(self) -> None:
        """Select each followed ScaledObject's pods, and scrape exactly the exporters on their nodes."""
        self._sync_pending = False
        nodes: set[str] = set()
        for tracked in self._tracked.values():
            informer = self._namespaces.get(tracked.namespace)
            pods = list(informer.pods.values()) if informer is not None else []
            tracked.selections = {}
            for selector in tracked.selectors():
                matching = [p for p in pods if selector.matches(p.labels)]
                targets = [p for p in matching if p.counts_as_target]
                tracked.selections[selector] = _Selection(
                    frozenset(p.name for p in targets),
                    frozenset(p.node for p in targets if p.node is not None),
                )
                nodes.update(p.node for p in matching if p.occupies_node and p.node is not None)
        wanted: dict[str, str] = {}
        for exporter, informer in self._exporters:
            for pod in informer.pods.values():
                if pod.node in nodes and (url := exporter_url(pod, exporter)) is not None:
                    wanted[url] = pod.node
        if self._sink is not None:
            for url in self._discovered.keys() - wanted.keys():
                if url not in self._settings.static_urls:
                    log.info("exporter %s no longer serves a target node: not scraped", url)
                    self._sink.remove(url)
            for url in wanted.keys() - self._discovered.keys():
                log.info("exporter %s on node %s serves target pods: scraped", url, wanted[url])
                self._sink.add(url)
        self._discovered = wanted
        self.discovered_exporters.set(len(wanted))


@lru_cache(maxsize=1024)
def _pod_selector(text: str) -> Selector:
    # Cached: KEDA sends the same metadata on every call, and check() runs on each of them.
    try:
        selector = parse_selector(text)
    except SelectorError as error:
        raise ConfigError(f"metadata podSelector={text!r} is not a label selector: {error}") from None
    if selector.empty:
        raise ConfigError(f"metadata podSelector={text!r} selects every pod; allowed: a label selector")
    return selector


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
