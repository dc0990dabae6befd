"""Exporter discovery: which GPU exporter pages serve the nodes where target pods run.

Triggers want the nodes their target pods occupy (wanted.ExporterNode, from their subscriptions);
here each wanted node wants the pages of the exporter pods running on it (wanted.ExporterPage), kept
current from a watch of the exporter pods: one change at a time, as exporters come and go.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from prometheus_client import Gauge

from keda_gpu_scaler.collect.wanted import ExporterNode, ExporterPage, WantedSources
from keda_gpu_scaler.core.errors import NoData
from keda_gpu_scaler.core.selectors import ExporterSelector
from keda_gpu_scaler.kubernetes.api import KubeApi
from keda_gpu_scaler.kubernetes.informer import PodInformer
from keda_gpu_scaler.kubernetes.pods import PodInfo, exporter_url

log = logging.getLogger(__name__)


class ExporterDiscovery:
    def __init__(
        self,
        selectors: tuple[ExporterSelector, ...],
        static: bool,
        gauge: Gauge,
        wanted: WantedSources,
        namespaces: frozenset[str] | None = None,
    ) -> None:
        self._selectors = selectors
        # Where exporter pods are read from (None: any). The watch is cluster-wide, but a pod elsewhere
        # is never an exporter: a tenant's pod labelled like one, on a node it shares with another tenant,
        # would serve that tenant's GPU values (SPEC §3: where data comes from is the operator's choice).
        self._namespaces = namespaces
        # --exporter-url given: it replaces the discovery of exporter pods. Their cluster-wide watch never
        # starts (narrow RBAC, rbac.exporterDiscovery off, refuses it) and the given pages are scraped.
        self._static = static
        self._gauge = gauge
        self._wanted = wanted
        self._informers: list[tuple[ExporterSelector, PodInformer]] = []
        self._api: KubeApi | None = None
        self._on_restart: Callable[[str], None] = lambda reason: None
        self._nodes: set[str] = set()  # the wanted nodes
        # node → {(exporter selector index, exporter pod key): URL}
        self._by_node: dict[str, dict[tuple[int, str], str]] = {}
        self.version = 0  # moves on whenever the set of nodes with an exporter changes
        wanted.handle(ExporterNode, self._node_wanted, self._node_unwanted)

    # --- watching the exporter pods -------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return bool(self._informers)

    def connect(self, api: KubeApi, on_restart: Callable[[str], None]) -> None:
        """The API to watch exporter pods through, from the first node a trigger scrapes on. Only then:
        triggers read through Prometheus or inference pages need no exporter pod. Never with --exporter-url,
        which replaces discovery (and whose namespaced RBAC, rbac.exporterDiscovery off, refuses the watch)."""
        self._api, self._on_restart = api, on_restart
        if self._nodes:
            self.started()

    def started(self) -> None:
        """Watch exporter pods from now on, if connected (a trigger scrapes exporters)."""
        if not self.running and self._api is not None:
            self.start(self._api, self._on_restart)

    def start(self, api: KubeApi, on_restart: Callable[[str], None]) -> None:
        if self._informers or self._static:
            return
        for index, exporter in enumerate(self._selectors):

            def on_pod(old: PodInfo | None, new: PodInfo | None, index: int = index) -> None:
                self._exporter_pod(index, old, new)

            informer = PodInformer(
                api,
                namespace=None,
                label_selector=str(exporter.selector),
                on_pod=on_pod,
                on_restart=on_restart,
            )
            self._informers.append((exporter, informer))
            informer.start()

    def close(self) -> None:
        """Stop watching exporter pods and stop scraping what was discovered (nothing is followed any more)."""
        for _, informer in self._informers:
            informer.close()
        self._informers = []
        self._by_node.clear()
        for node in self._nodes:
            self._want(node)
        self.version += 1

    async def stop(self) -> None:
        informers, self._informers = self._informers, []
        for _, informer in informers:
            await informer.stop()

    # --- the pages each wanted node wants -----------------------------------------------------------

    def _node_wanted(self, source: ExporterNode) -> None:
        self._nodes.add(source.node)
        self.started()
        self._want(source.node)

    def _node_unwanted(self, source: ExporterNode) -> None:
        self._nodes.discard(source.node)
        self._wanted.release(source)
        self._count()

    def _want(self, node: str) -> None:
        if node not in self._nodes:
            return
        owner = ExporterNode(node)
        before = self._wanted.of_owner(owner)
        pages = {ExporterPage(url) for url in self._by_node.get(node, {}).values()}
        if pages == before:
            return
        for page in pages - before:
            log.info("exporter %s on node %s serves target pods: scraped", page.url, node)
        for gone in before - pages:
            log.info(
                "exporter %s no longer serves a target node (%s): not scraped",
                getattr(gone, "url", gone),
                node,
            )
        self._wanted.want(owner, pages)
        self._count()

    def _count(self) -> None:
        self._gauge.set(len({url for node in self._nodes for url in self._by_node.get(node, {}).values()}))

    def _exporter_pod(self, index: int, old: PodInfo | None, new: PodInfo | None) -> None:
        if self._namespaces is not None and (old or new).namespace not in self._namespaces:  # type: ignore[union-attr]
            return
        key = (index, (new or old).key)  # type: ignore[union-attr]
        exporter = self._selectors[index]
        if old is not None and new is not None and old.node == new.node and new.node is not None:
            url = exporter_url(new, exporter)
            if url is not None and self._by_node.get(new.node, {}).get(key) == url:
                # Same node, same URL (a readiness flip, a label edit): giving the URL up and taking it back
                # would remove the exporter's source and its data until the next scrape.
                return
        if old is not None and old.node is not None:
            urls = self._by_node.get(old.node)
            if urls is not None:
                urls.pop(key, None)
            if urls is not None and not urls:
                del self._by_node[old.node]
                self.version += 1
        if new is not None and new.node is not None:
            url = exporter_url(new, exporter)
            if url is not None:
                urls = self._by_node.setdefault(new.node, {})
                if not urls:
                    self.version += 1
                urls[key] = url
                self._want(new.node)
        if old is not None and old.node is not None:
            self._want(old.node)

    @property
    def discovered(self) -> Mapping[str, str]:
        """URL → node of the exporters read because a target pod runs on their node."""
        return {url: node for node in self._nodes for url in self._by_node.get(node, {}).values()}

    # --- answering ------------------------------------------------------------------------------------

    def check(self, nodes: Mapping[str, int], covered: bool | None = None) -> bool:
        """Raise NoData unless an exporter serves at least one of the target pods' nodes (or URLs are static).

        `covered`: the answer of an earlier call for the same nodes and the same `version`, if known;
        returns the answer, for the caller to keep.
        """
        if self._static:
            return True  # --exporter-url: the pages are given, no exporter pod is looked for
        failing = [i.error for _, i in self._informers if i.error is not None]
        if failing and len(failing) == len(self._informers):
            raise NoData(f"cannot find the GPU exporters: {failing[0]}")
        if covered is None:
            covered = any(node in self._by_node for node in nodes)
        if covered:
            return True
        if any(not i.synced for _, i in self._informers):
            raise NoData("listing the GPU exporter pods (first list)")
        selectors = ", ".join(repr(str(s)) for s, _ in self._informers)
        where = "any namespace" if self._namespaces is None else ", ".join(sorted(self._namespaces))
        raise NoData(
            f"no GPU exporter pod runs on the target pods' nodes ({', '.join(sorted(nodes))}); exporters are"
            f" found by --exporter-selector {selectors} in --exporter-namespaces {where}"
        )
