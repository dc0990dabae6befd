"""Exporter discovery: scrape exactly the GPU exporters that run on nodes where target pods run.

Kept by counting, one change at a time: how many followed selections occupy each node, and which
exporter URLs each node has. A URL is handed to the scrape collector when its node becomes wanted or
its exporter pod appears on a wanted node, and taken back when either stops.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from prometheus_client import Gauge

from keda_gpu_scaler.discovery.api import KubeApi
from keda_gpu_scaler.discovery.informer import PodInformer
from keda_gpu_scaler.discovery.pods import PodInfo, exporter_url
from keda_gpu_scaler.discovery.selectors import ExporterSelector
from keda_gpu_scaler.errors import NoData

log = logging.getLogger(__name__)


class ExporterSink(Protocol):
    """Where discovered exporter URLs go (the scrape collector)."""

    def add(self, url: str) -> None: ...

    def remove(self, url: str) -> None: ...


class ExporterDiscovery:
    def __init__(
        self,
        selectors: tuple[ExporterSelector, ...],
        static_urls: Collection[str],
        gauge: Gauge,
    ) -> None:
        self._selectors = selectors
        self._static = frozenset(static_urls)
        self._gauge = gauge
        self.sink: ExporterSink | None = None
        self._informers: list[tuple[ExporterSelector, PodInformer]] = []
        self._node_refs: Counter[str] = Counter()  # node → selections with pods there
        # node → {(exporter selector index, exporter pod key): URL}
        self._by_node: dict[str, dict[tuple[int, str], str]] = {}
        self._url_refs: Counter[str] = Counter()  # URLs of exporters on wanted nodes (a URL may repeat)
        self._url_nodes: dict[str, str] = {}
        self.version = 0  # moves on whenever the set of nodes with an exporter changes

    # --- watching the exporter pods -------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return bool(self._informers)

    def start(self, api: KubeApi, on_restart: Callable[[str], None]) -> None:
        if self._informers:
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
        for url in list(self._url_refs):
            self._drop_url(url, "discovery follows no ScaledObject")
        self._url_refs.clear()
        self._by_node.clear()
        self._node_refs.clear()
        self.version += 1
        self._gauge.set(0)

    async def stop(self) -> None:
        informers, self._informers = self._informers, []
        for _, informer in informers:
            await informer.stop()

    # --- counting -------------------------------------------------------------------------------------

    def node(self, node: str, delta: int) -> None:
        """A selection started (+1) or stopped (-1) having pods that occupy node."""
        self._node_refs[node] += delta
        count = self._node_refs[node]
        if count == 1 and delta > 0:
            for url in self._by_node.get(node, {}).values():
                self._take_url(url, node)
        elif count <= 0:
            del self._node_refs[node]
            for url in self._by_node.get(node, {}).values():
                self._give_url(url)

    def _exporter_pod(self, index: int, old: PodInfo | None, new: PodInfo | None) -> None:
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
            url = urls.pop(key, None) if urls is not None else None
            if urls is not None and not urls:
                del self._by_node[old.node]
                self.version += 1
            if url is not None and old.node in self._node_refs:
                self._give_url(url)
        if new is not None and new.node is not None:
            url = exporter_url(new, exporter)
            if url is not None:
                urls = self._by_node.setdefault(new.node, {})
                if not urls:
                    self.version += 1
                urls[key] = url
                if new.node in self._node_refs:
                    self._take_url(url, new.node)

    def _take_url(self, url: str, node: str) -> None:
        self._url_refs[url] += 1
        if self._url_refs[url] == 1:
            self._url_nodes[url] = node
            self._gauge.set(len(self._url_refs))
            log.info("exporter %s on node %s serves target pods: scraped", url, node)
            if self.sink is not None:
                self.sink.add(url)

    def _give_url(self, url: str) -> None:
        self._url_refs[url] -= 1
        if self._url_refs[url] <= 0:
            del self._url_refs[url]
            self._drop_url(url, "no longer serves a target node")
            self._gauge.set(len(self._url_refs))

    def _drop_url(self, url: str, why: str) -> None:
        self._url_nodes.pop(url, None)
        if url in self._static:
            return
        log.info("exporter %s %s: not scraped", url, why)
        if self.sink is not None:
            self.sink.remove(url)

    @property
    def discovered(self) -> Mapping[str, str]:
        """URL → node of the exporters being scraped because of discovery."""
        return self._url_nodes

    # --- answering ------------------------------------------------------------------------------------

    def check(self, nodes: Mapping[str, int], covered: bool | None = None) -> bool:
        """Raise NoData unless an exporter serves at least one of the target pods' nodes (or URLs are static).

        `covered`: the answer of an earlier call for the same nodes and the same `version`, if known;
        returns the answer, for the caller to keep.
        """
        failing = [i.error for _, i in self._informers if i.error is not None]
        if failing and len(failing) == len(self._informers):
            raise NoData(f"cannot find the GPU exporters: {failing[0]}")
        if self._static:
            return True
        if covered is None:
            covered = any(node in self._by_node for node in nodes)
        if covered:
            return True
        if any(not i.synced for _, i in self._informers):
            raise NoData("listing the GPU exporter pods (first list)")
        selectors = ", ".join(repr(str(s)) for s, _ in self._informers)
        raise NoData(
            f"no GPU exporter pod runs on the target pods' nodes ({', '.join(sorted(nodes))}); exporters are"
            f" found by --exporter-selector {selectors}"
        )
