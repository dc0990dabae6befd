"""KubeDiscovery: the TargetResolver for Kubernetes, kept current in the background so that RPCs never wait."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from keda_gpu_scaler.collect.backoff import backoff_delay, jittered
from keda_gpu_scaler.collect.supervise import cancel_all, supervised
from keda_gpu_scaler.collect.wanted import WantedSources
from keda_gpu_scaler.core.errors import ConfigError, KubeError, NoData
from keda_gpu_scaler.core.selectors import (
    DEFAULT_EXPORTER_NAMESPACES,
    ExporterSelector,
    Selector,
    SelectorError,
    parse_selector,
    pod_selector_metadata,
)
from keda_gpu_scaler.core.snapshot import Targets
from keda_gpu_scaler.core.trigger import TriggerSpec
from keda_gpu_scaler.kubernetes.api import SCALED_OBJECTS, KubeApi, connect
from keda_gpu_scaler.kubernetes.exporters import ExporterDiscovery
from keda_gpu_scaler.kubernetes.followed import Followed, WatchedNamespace
from keda_gpu_scaler.kubernetes.gateway import GatewayBook, GatewayDiscovery
from keda_gpu_scaler.kubernetes.informer import ObjectInformer, PodInformer
from keda_gpu_scaler.kubernetes.kinds import ScaleKinds
from keda_gpu_scaler.kubernetes.pods import PodInfo
from keda_gpu_scaler.kubernetes.scaledobject import (
    ScaledObjectError,
    ScaledObjectInfo,
    parse_scaled_object,
)
from keda_gpu_scaler.kubernetes.targets import NamespaceIndex, Selection
from keda_gpu_scaler.telemetry import PREFIX, Telemetry

__all__ = ["DiscoveryConfig", "KubeDiscovery", "Targets"]

log = logging.getLogger(__name__)

FIRST_RETRY_SECONDS = 0.5


@dataclass(frozen=True, slots=True)
class DiscoveryConfig:
    kubeconfig: str | None  # None: the in-cluster service account
    exporter_selectors: tuple[ExporterSelector, ...]
    refresh_interval: float  # seconds between re-reads of a ScaledObject and its /scale
    static_urls: frozenset[str] = frozenset()  # --exporter-url: never removed by discovery
    # --exporter-namespaces: where exporter pods are read from; None: any namespace
    exporter_namespaces: frozenset[str] | None = frozenset(DEFAULT_EXPORTER_NAMESPACES)


class KubeDiscovery:
    """ScaledObject → scaleTargetRef → /scale selector → pods; trigger metricType; exporters on those nodes.

    Every ScaledObject asked about is read from the API in the background (track); its namespace's pods
    are watched only once it was read, has an external trigger, and a followed trigger of it selects
    pods (select). Pod events update the target sets of the selectors they touch, as they arrive;
    resolve() only reads. forget() drops everything at once.
    """

    def __init__(
        self,
        settings: DiscoveryConfig,
        telemetry: Telemetry,
        wanted: WantedSources,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._api: KubeApi | None = None
        self._tracked: dict[tuple[str, str], Followed] = {}
        self._namespaces: dict[str, WatchedNamespace] = {}
        self._kinds = ScaleKinds(clock)
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
        self._exporters = ExporterDiscovery(
            settings.exporter_selectors,
            bool(settings.static_urls),
            self.discovered_exporters,
            wanted,
            settings.exporter_namespaces,
        )
        self._gateway_book: GatewayBook | None = None
        self._gateways: GatewayDiscovery | None = None
        self._gateway_pools_due = False
        # Told the namespace whenever the targets of its followed selectors may have changed (pod events,
        # selectors followed or dropped, a relist applied whole): what is collected for them follows.
        self.on_change: Callable[[str], None] = lambda namespace: None

    async def start(self, gateways: GatewayBook | None = None) -> None:
        """Load credentials (raises api.ConnectError); nothing is read from the API until a call asks.

        `gateways`: the gateway source, whose wanted InferencePools (those `pending` triggers read) get
        their endpoint picker pages from here, in namespaces of followed ScaledObjects only.
        """
        self._api = KubeApi(await connect(self._settings.kubeconfig))
        self._exporters.connect(self._api, self._restarted)
        if gateways is not None:
            self._gateway_book = gateways
            self._gateways = GatewayDiscovery(self._api, gateways, on_restart=self._restarted)
            gateways.on_pools = self._gateway_pools_changed
            self._follow_gateway_pools()

    async def stop(self) -> None:
        if self._gateways is not None:
            await self._gateways.stop()
            self._gateways = None
        await cancel_all(t.task for t in self._tracked.values() if t.task is not None)
        self._tracked.clear()
        namespaces, self._namespaces = self._namespaces, {}
        for space in namespaces.values():
            if space.informer is not None:
                await space.informer.stop()
            await space.objects.stop()
        await self._exporters.stop()
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
            pod_selector_metadata(spec.pod_selector)

    def track(self, namespace: str, name: str) -> None:
        """Start following a ScaledObject (or note that it is still wanted), without waiting for anything."""
        key = (namespace, name)
        tracked = self._tracked.get(key)
        if tracked is None:
            tracked = Followed(namespace, name)
            self._tracked[key] = tracked
            self.tracked_scaled_objects.set(len(self._tracked))
        if tracked.task is None and self._api is not None:
            tracked.task = supervised(lambda: self._follow(tracked), f"follow ScaledObject {tracked.ref}")

    def select(self, namespace: str, name: str, specs: Iterable[TriggerSpec]) -> None:
        """The followed triggers of a ScaledObject that read its pods (or pods of their podSelector), as
        its subscriptions say; what no trigger selects any more is no longer followed."""
        tracked = self._tracked.get((namespace, name))
        if tracked is None:
            return
        if tracked.select(specs):
            self._register(tracked)

    def forget(self, namespace: str, name: str) -> None:
        """Drop everything discovery keeps for this ScaledObject, at once (its owner evicted it)."""
        tracked = self._tracked.pop((namespace, name), None)
        if tracked is None:
            return
        if tracked.task is not None:
            tracked.task.cancel()
            tracked.task = None
        self._release(tracked)
        self.tracked_scaled_objects.set(len(self._tracked))

    def is_current(self, namespace: str, name: str, spec: TriggerSpec) -> bool | None:
        """Whether spec is one of the ScaledObject's external triggers as last read (None: not read yet)."""
        tracked = self._tracked.get((namespace, name))
        if tracked is None or tracked.info is None:
            return None
        return any(trigger.matches(spec) for trigger in tracked.info.triggers)

    def resolve(self, namespace: str, name: str, spec: TriggerSpec, exporters: bool = True) -> Targets:
        """The trigger's target pods now, with a GPU exporter found on their nodes where one is read
        (`exporters`: its GPU pages are scraped from the exporters, not read through Prometheus)."""
        tracked, selector, selection = self._selection(namespace, name, spec)
        targets = selection.targets(tracked.metric_type(spec))
        if not selection.has_pods:
            targets = dataclasses.replace(targets, replicas=tracked.replicas_since(selection.emptied_at))
        # Inference metrics read the pods' own pages (SPEC §6): no GPU exporter is needed or scraped.
        if exporters and targets.pods and not spec.metric.inference:
            self._exporters.started()  # again after every watch was dropped (all forgotten) and a call came
            # Whether an exporter serves the target nodes only changes with them or with the exporters.
            versions = (selection.version, self._exporters.version)
            known = True if tracked.covered.get(selector) == versions else None
            if self._exporters.check(selection.target_nodes, known):
                tracked.covered[selector] = versions
        return targets

    def selected(self, namespace: str, name: str, spec: TriggerSpec) -> Targets:
        """The pods the trigger selects now (for what is collected for it; resolve() also checks exporters)."""
        tracked, _, selection = self._selection(namespace, name, spec)
        return selection.targets(tracked.metric_type(spec))

    def _selection(
        self, namespace: str, name: str, spec: TriggerSpec
    ) -> tuple[Followed, Selector, Selection]:
        """The trigger's selection; raises NoData while it is not known."""
        tracked = self._tracked.get((namespace, name))
        if tracked is None:
            raise NoData(f"ScaledObject {namespace}/{name} is not followed")
        if self._api is None:
            raise NoData("Kubernetes discovery is not connected")
        selector = tracked.selector_for(spec)
        space = self._namespaces.get(namespace)
        if space is None:
            raise NoData(f"starting to watch the pods in namespace {namespace!r}")
        selection = space.synced_selection(tracked, selector)
        return tracked, selector, selection

    # --- internals ------------------------------------------------------------------------------------

    def _hold(self, tracked: Followed) -> None:
        """The ScaledObject exists and is ours to serve: watch its namespace's ScaledObjects (and its pods
        once a trigger selects some)."""
        if tracked.holds_namespace or self._api is None:
            return
        space = self._namespaces.get(tracked.namespace)
        if space is None:
            objects = ObjectInformer(
                self._api,
                SCALED_OBJECTS,
                tracked.namespace,
                self._object_handler(tracked.namespace),
                on_restart=self._restarted,
            )
            space = WatchedNamespace(NamespaceIndex(tracked.namespace), objects)
            self._namespaces[tracked.namespace] = space
            objects.start()
            self._follow_gateway_pools()
        space.holders.add((tracked.namespace, tracked.name))
        tracked.holds_namespace = True
        self._register(tracked)

    def _watch_pods(self, space: WatchedNamespace) -> PodInformer:
        """Start watching a namespace's pods (and the GPU exporters) for the selections made there."""
        assert self._api is not None
        index = space.index
        informer = PodInformer(
            self._api,
            namespace=index.namespace,
            label_selector=None,
            on_pod=self._pod_handler(index),
            on_restart=self._restarted,
            on_relist=self._relist_handler(index),
            # A first list, a failure or a recovery with no pod changed: subscriptions look again.
            on_status=self._status_handler(index.namespace),
        )
        space.informer = informer
        informer.start()
        return informer

    def _unwatch_pods(self, space: WatchedNamespace) -> None:
        """No selection is left in the namespace: its pod watch ends (and the exporters' when none is left)."""
        if space.informer is None:
            return
        space.informer.close()
        space.informer = None
        space.index.release_all()
        if all(s.informer is None for s in self._namespaces.values()):
            self._exporters.close()

    def _release(self, tracked: Followed) -> None:
        """The ScaledObject is gone or forgotten: its selections go, and the watch when nobody else needs it."""
        if not tracked.holds_namespace:
            return
        tracked.holds_namespace = False
        self._register(tracked)
        space = self._namespaces.get(tracked.namespace)
        if space is None:
            return
        space.holders.discard((tracked.namespace, tracked.name))
        if not space.holders:
            del self._namespaces[tracked.namespace]
            space.objects.close()
            self._unwatch_pods(space)
            self._follow_gateway_pools()

    def _pod_handler(self, index: NamespaceIndex) -> Callable[[PodInfo | None, PodInfo | None], None]:
        def on_pod(old: PodInfo | None, new: PodInfo | None) -> None:
            for emptied in index.on_pod(old, new):
                # Its last pod went: read /scale now, so that a target left with replicas but no pod is
                # told from one scaled to zero within a round trip (SPEC §4).
                for user in emptied.users:
                    if isinstance(user, Followed):
                        user.wake.set()
            self.on_change(index.namespace)

        return on_pod

    def _status_handler(self, namespace: str) -> Callable[[], None]:
        def on_status() -> None:
            self.on_change(namespace)

        return on_status

    def _relist_handler(self, index: NamespaceIndex) -> Callable[[bool], None]:
        def on_relist(applying: bool) -> None:
            index.hold(applying)
            if not applying:
                self.on_change(index.namespace)

        return on_relist

    def _register(self, tracked: Followed) -> None:
        """Make the namespace follow exactly the selectors this ScaledObject needs now; its pods are
        watched while some selection is made there."""
        space = self._namespaces.get(tracked.namespace)
        wanted = tracked.selectors() if tracked.holds_namespace and space is not None else set()
        changed = False
        for selector in [s for s in tracked.selections if s not in wanted]:
            del tracked.selections[selector]
            tracked.covered.pop(selector, None)
            changed = True
            if space is not None:
                space.index.release(selector, tracked)
        if space is not None:
            for selector in wanted:
                if selector not in tracked.selections:
                    informer = space.informer or self._watch_pods(space)
                    tracked.selections[selector] = space.index.acquire(selector, tracked, informer.pods)
                    changed = True
            if not space.index.selections:
                self._unwatch_pods(space)
        if changed:
            self.on_change(tracked.namespace)

    def _gateway_pools_changed(self) -> None:
        """Coalesced to one look per loop turn: a subscription replaced whole (one pool released, another
        wanted) must not close and reopen its namespace's InferencePool watch in between."""
        if not self._gateway_pools_due:
            self._gateway_pools_due = True
            asyncio.get_running_loop().call_soon(self._follow_gateway_pools)

    def _follow_gateway_pools(self) -> None:
        """Watch the InferencePools that triggers want, of namespaces that hold a followed ScaledObject.

        A pool's namespace is always its trigger's ScaledObject's (the key comes from the call's
        ScaledObjectRef); and, as for pods, nothing is watched in a namespace until a ScaledObject there
        was read from the API, so calls naming objects that do not exist open no watch.
        """
        self._gateway_pools_due = False
        if self._gateways is None or self._gateway_book is None:
            return
        self._gateways.set_wanted([p for p in self._gateway_book.pools() if p.namespace in self._namespaces])

    def _restarted(self, reason: str) -> None:
        self.watch_restarts.labels(reason).inc()

    async def _follow(self, tracked: Followed) -> None:
        """Keep the ScaledObject and its target's selector current for as long as it is tracked.

        While the namespace's ScaledObjects are not watched (the object was never found, or has no
        external trigger), it is read with a GET every --discovery-interval; once it is held, the watch
        tells every edit at once. The target's /scale is read when the ScaledObject changes and every
        --discovery-interval after that. forget() ends this.
        """
        failures = 0
        while True:
            tracked.wake.clear()
            try:
                ok = await self._refresh(tracked)
            except Exception:
                # A bug must not stop following the object silently: say so, answer NoData, retry.
                log.exception("ScaledObject %s: discovery failed", tracked.ref)
                tracked.object_error = f"discovery of ScaledObject {tracked.ref} failed; see the scaler's log"
                ok = False
            failures = 0 if ok else failures + 1
            interval = self._settings.refresh_interval
            delay = interval if ok else backoff_delay(failures, first=FIRST_RETRY_SECONDS, cap=interval)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tracked.wake.wait(), jittered(delay))

    async def _refresh(self, tracked: Followed) -> bool:
        space = self._namespaces.get(tracked.namespace)
        if space is not None and space.objects.synced:
            # The namespace's watch holds it (or knows it is not there): no GET needed.
            self._object_handler(tracked.namespace)(tracked.name, space.objects.spec(tracked.name))
        elif not await self._read_object(tracked):
            return False
        if tracked.info is None or not tracked.info.triggers:
            return True
        return await self._read_scale(tracked)

    async def _read_object(self, tracked: Followed) -> bool:
        assert self._api is not None
        try:
            info = parse_scaled_object(await self._api.scaled_object(tracked.namespace, tracked.name))
        except (KubeError, ScaledObjectError) as error:
            gone = not isinstance(error, KubeError) or error.status == 404
            if not gone and tracked.info is not None:
                # The API server is unreachable or busy for a moment: the ScaledObject last read is still
                # the one KEDA acts on (client-go's informers keep theirs through such errors too).
                tracked.note(
                    f"re-reading ScaledObject {tracked.ref} failed, the last one read stays in use: {error}",
                )
                return False
            tracked.object_error = f"cannot read ScaledObject {tracked.ref}: {error}"
            if gone:
                # Gone, or not one this scaler can follow: stop watching for it. Other failures (the API
                # server unreachable, RBAC) keep the watch: the object is still there.
                self._release(tracked)
            return False
        self._apply(tracked, info)
        return True

    def _apply(self, tracked: Followed, info: ScaledObjectInfo) -> None:
        """A ScaledObject as just read (by a GET or from the watch)."""
        if info != tracked.info:
            tracked.metric_types.clear()
            # Its subscriptions look again: a trigger edited away is no longer collected for.
            self.on_change(tracked.namespace)
            if tracked.selector_of is not None and info.target != tracked.selector_of:
                tracked.another_target()  # edited, or deleted and created again: read anew
                self._register(tracked)
        tracked.info = info
        tracked.object_error = None
        if not info.triggers:
            self._release(tracked)  # no external trigger: KEDA never asks this scaler about it
            tracked.note(None)
            return
        self._hold(tracked)

    def _object_handler(self, namespace: str) -> Callable[[str, Mapping[str, Any] | None], None]:
        def on_object(name: str, spec: Mapping[str, Any] | None) -> None:
            tracked = self._tracked.get((namespace, name))
            if tracked is None:
                return  # a ScaledObject of the namespace nobody asked about
            before = tracked.info
            if spec is None:
                tracked.info = None
                tracked.object_error = f"cannot read ScaledObject {tracked.ref}: not found"
                self._release(tracked)
            else:
                try:
                    info = parse_scaled_object({"spec": spec})
                except ScaledObjectError as error:
                    tracked.info = None
                    tracked.object_error = f"cannot read ScaledObject {tracked.ref}: {error}"
                    self._release(tracked)
                else:
                    self._apply(tracked, info)
            info_changed = tracked.info != before
            if info_changed:
                tracked.wake.set()  # its /scale is read again now (another target, perhaps)

        return on_object

    async def _read_scale(self, tracked: Followed) -> bool:
        assert self._api is not None and tracked.info is not None
        target = tracked.info.target
        began = time.monotonic()
        try:
            plural = await self._kinds.plural(self._api, target)
            scale = await self._api.scale(
                target.group, target.version, tracked.namespace, plural, target.name
            )
            if tracked.info is None or tracked.info.target != target:
                return False  # the ScaledObject changed its target meanwhile: this answer is another's
            tracked.read_replicas(scale, began)
            selector = parse_selector((scale.get("status") or {}).get("selector") or "")
            if selector.empty:
                raise KubeError(
                    "its /scale subresource has no status.selector; give podSelector in the trigger metadata"
                )
            if tracked.scale_error is not None:
                tracked.scale_error = None
                self.on_change(tracked.namespace)  # resolvable again: subscriptions look again
            if tracked.read_selector(selector, target):
                self._register(tracked)
            tracked.note(None)
            return True
        except (KubeError, SelectorError) as error:
            message = f"cannot read the pod selector of {target} for ScaledObject {tracked.ref}: {error}"
            if isinstance(error, KubeError) and error.status != 404 and tracked.selector is not None:
                # A blip: the last selector read stays in use, for the targets and for exporter discovery.
                tracked.scale_blip(f"{message}; the last one read stays in use")
                return False
            tracked.scale_error = message
            return False
