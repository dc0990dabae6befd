"""Keeps what each followed trigger needs collected in step with discovery, so evaluation only reads.

A trigger's subscription wants, in the one registry of wanted sources (wanted.py), exactly what its
spec reads now: the GPU exporters on its target pods' nodes (and any --exporter-url), its target pods'
own inference-server pages (SPEC §6), its InferencePool's endpoint pickers at its port (SPEC §7), or
its namespace's Prometheus series. Worked out when the subscription starts, when discovery says the
pods or the ScaledObjects of its namespace changed, and never by an evaluation. A trigger edited away
(discovery no longer finds it in its ScaledObject, while another of its triggers is there) wants
nothing; a dropped subscription (its ScaledObject forgotten, its TTL past) releases everything at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Protocol

from keda_gpu_scaler.collect.inference import page_of
from keda_gpu_scaler.collect.prometheus_sources import GATEWAY_SERIES, GPU_SERIES, INFERENCE_SERIES
from keda_gpu_scaler.collect.wanted import (
    EppPool,
    ExporterNode,
    ExporterPage,
    PodPage,
    PrometheusQuery,
    WantedSources,
)
from keda_gpu_scaler.core.errors import NoData
from keda_gpu_scaler.core.snapshot import SourceKind, Targets
from keda_gpu_scaler.core.trigger import POOL_OPTIONAL, TriggerSpec
from keda_gpu_scaler.server.registry import Followed, Subscription

log = logging.getLogger(__name__)

# Source kinds that read the target's pods (their pages, the exporters on their nodes, or their series in
# Prometheus): they need discovery's pods. Only `pending` reads the pool's endpoint pickers instead.
_READS_PODS = frozenset(
    {SourceKind.SCRAPE, SourceKind.INFERENCE, SourceKind.PROMETHEUS, SourceKind.PROMETHEUS_INFERENCE}
)


class Discovery(Protocol):
    """What subscriptions ask of Kubernetes discovery."""

    def select(self, namespace: str, name: str, specs: Iterable[TriggerSpec]) -> None: ...

    def selected(self, namespace: str, name: str, spec: TriggerSpec) -> Targets: ...

    def is_current(self, namespace: str, name: str, spec: TriggerSpec) -> bool | None: ...


class Subscriptions:
    """Each followed trigger's wanted sources, kept current (see the module docstring)."""

    def __init__(
        self,
        *,
        wanted: WantedSources,
        kind_of: Callable[[TriggerSpec], SourceKind],
        followed_in: Callable[[str], Iterable[Followed]],
        discovery: Discovery | None = None,
        exporter_urls: Sequence[str] = (),
        inference_urls: Sequence[tuple[str, str, str]] = (),
    ) -> None:
        self._wanted = wanted
        self._kind_of = kind_of
        self._followed_in = followed_in
        self._discovery = discovery
        self._exporters = tuple(ExporterPage(url) for url in exporter_urls)
        self._inference = tuple(PodPage(url, namespace, pod) for namespace, pod, url in inference_urls)
        self._due: set[str] = set()  # namespaces whose refresh is scheduled for the next loop turn
        # The pod a page is filed under (the inference collector's bindings, set once they exist).
        self.filed_under: Callable[[str], PodPage | None] | None = None

    def changed(self, namespace: str) -> None:
        """Discovery: the pods, selectors or ScaledObjects of a namespace changed. Coalesced: one pod
        event or a relist of thousands costs one refresh per loop turn."""
        if namespace in self._due:
            return
        self._due.add(namespace)
        asyncio.get_running_loop().call_soon(self._refresh_due, namespace)

    def subscribed(self, followed: Followed, subscription: Subscription) -> None:
        """A new trigger is followed: what it reads is wanted at once (its pods' pages once known)."""
        self._refresh(followed)

    def dropped(self, followed: Followed, subscription: Subscription) -> None:
        self._wanted.release(_owner(followed, subscription))
        subscription.sources_from = None
        self._select(followed, self._edited_away(followed))

    def _refresh_due(self, namespace: str) -> None:
        self._due.discard(namespace)
        for followed in self._followed_in(namespace):
            self._refresh(followed)

    def _refresh(self, followed: Followed) -> None:
        away = self._edited_away(followed)
        self._select(followed, away)
        for subscription in followed.triggers.values():
            if subscription.spec in away:
                subscription.sources_from = None
                self._wanted.release(_owner(followed, subscription))
            else:
                self._refresh_one(followed, subscription)

    def _select(self, followed: Followed, away: set[TriggerSpec]) -> None:
        """Tell discovery which triggers read pods, so that it follows exactly their selectors."""
        if self._discovery is not None:
            specs = [s for s in followed.triggers if s not in away and self._kind_of(s) in _READS_PODS]
            self._discovery.select(followed.namespace, followed.name, specs)

    def _edited_away(self, followed: Followed) -> set[TriggerSpec]:
        """The triggers discovery read the ScaledObject without, when another followed one of it is there
        (the edit's new trigger: until KEDA calls it, the old one keeps what it collects)."""
        if self._discovery is None:
            return set()
        current = {
            spec: self._discovery.is_current(followed.namespace, followed.name, spec)
            for spec in followed.triggers
        }
        if not any(current.values()):
            return set()
        return {spec for spec, is_current in current.items() if is_current is False}

    def _refresh_one(self, followed: Followed, subscription: Subscription) -> None:
        spec = subscription.spec
        namespace = followed.namespace
        kind = self._kind_of(spec)
        sources: list[Hashable] = []
        if kind is SourceKind.GATEWAY:
            assert spec.inference_pool is not None
            sources.append(EppPool(namespace, spec.inference_pool, spec.gateway_metrics_port))
        elif kind is SourceKind.PROMETHEUS_GATEWAY:
            sources.append(PrometheusQuery(GATEWAY_SERIES, namespace, spec.inference_pool))
        elif kind is SourceKind.PROMETHEUS_INFERENCE:
            sources.append(PrometheusQuery(INFERENCE_SERIES, namespace))
        elif kind is SourceKind.PROMETHEUS:
            sources.append(PrometheusQuery(GPU_SERIES, namespace))
        elif self._discovery is None:
            if kind is SourceKind.SCRAPE:
                sources.extend(self._exporters)
            else:
                sources.extend(page for page in self._inference if page.namespace == namespace)
        else:
            try:
                targets = self._discovery.selected(namespace, followed.name, spec)
            except NoData:
                # Discovery does not know (yet, or for now): what was wanted so far stays wanted.
                sources.extend(self._wanted.of_owner(_owner(followed, subscription)))
            else:
                before = subscription.sources_from
                if before is not None and before.endpoints is targets.endpoints:
                    return  # one endpoints mapping per snapshot of the selection: the same pods and pages
                subscription.sources_from = targets
                if kind is SourceKind.SCRAPE:
                    sources.extend(self._exporters)
                    sources.extend(ExporterNode(node) for node in targets.nodes)
                else:
                    sources.extend(self._pod_pages(followed, spec, targets))
        if spec.inference_pool is not None and spec.metric in POOL_OPTIONAL:
            # `demand` with `inferencePool` adds the requests the pool's endpoint pickers hold (SPEC §6);
            # the `requests` guard acts while they hold any.
            sources.append(EppPool(namespace, spec.inference_pool, spec.gateway_metrics_port))
        self._wanted.want(_owner(followed, subscription), sources)
        self._note_unread(followed, sources)

    def _pod_pages(self, followed: Followed, spec: TriggerSpec, targets: Targets) -> list[PodPage]:
        pages: list[PodPage] = []
        for pod in targets.pods:
            endpoint = targets.endpoints.get(pod)
            if endpoint is None or not endpoint.ready or not endpoint.ip:
                continue
            page = page_of(endpoint, spec.metrics_port, spec.metrics_path)
            if page is None:
                followed.log_once(
                    f"pod {pod} has no container port {spec.metrics_port or 'named metrics or http, nor any'}:"
                    " its inference-server page cannot be read (set metricsPort)"
                )
                continue
            port, url = page
            declared = any(number == port for _, number in endpoint.port_list)
            pages.append(PodPage(url, followed.namespace, pod, declared))
        return pages

    def _note_unread(self, followed: Followed, sources: Iterable[Hashable]) -> None:
        if self.filed_under is None:
            return
        for page in sources:
            if isinstance(page, PodPage) and self.filed_under(page.url) != page:
                followed.log_once(
                    f"pod {page.pod}: {page.url} is not read for it: another pod at the same address (e.g."
                    " hostNetwork pods sharing a node's IP) is named for a page at that port too, and the pages"
                    " at an address are read only for the one pod among them that declares its port as a"
                    " container port"
                )


def _owner(followed: Followed, subscription: Subscription) -> tuple[str, str, TriggerSpec]:
    return (followed.namespace, followed.name, subscription.spec)
