"""Inference-server pages (SPEC §6): which pod each page belongs to, which pages are wanted, and why.

GPU exporters serve one page per node naming many pods; an inference server serves its own pod's page,
so the pod is known from where the page was fetched, not from its labels. Pages are kept as the pod's
raw samples: how they become a value depends on the trigger (`engine`, `model`, `metric`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Protocol

from keda_gpu_scaler.collect.scrape import PageReader, ScrapeCollector, refuse_unless_levels
from keda_gpu_scaler.collect.store import SourceKind
from keda_gpu_scaler.engines import DEMAND_SAMPLE_NAMES, ENGINE_SAMPLE_NAMES, PodSamples, wrong_types
from keda_gpu_scaler.exposition import Sample

log = logging.getLogger(__name__)

# Interest key of inference-server pages scraped directly (pods' own endpoints or --inference-url).
INFERENCE_INTEREST = "inference"


# Container port names tried, in order, when the trigger gives no metricsPort (SPEC §6).
DEFAULT_PORT_NAMES = ("metrics", "http")


def pod_page_reader(namespace: str, pod: str) -> Callable[[Sequence[Sample]], Iterable[PodSamples]]:
    """Reads a pod's own page: every kept sample is that pod's, whatever its labels say."""

    def read(samples: Sequence[Sample]) -> list[PodSamples]:
        return [PodSamples(namespace, pod, tuple(samples))]

    return read


def metrics_port(ports: Sequence[tuple[str | None, int]], wanted: str | None) -> int | None:
    """The port of a pod's metrics page: `metricsPort` (a number or a port name), else the container port
    named `metrics`, else `http`, else the first one. None when the pod has no such port."""
    if wanted is not None:
        if wanted.isdigit():
            return int(wanted)
        return next((number for name, number in ports if name == wanted), None)
    for preferred in DEFAULT_PORT_NAMES:
        found = next((number for name, number in ports if name == preferred), None)
        if found is not None:
            return found
    return ports[0][1] if ports else None


def pod_url(ip: str, port: int, path: str) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}{path}"


# A page declaring a family the engines read as anything but a level (gauge or untyped) is refused.
_DECLARED_AS_LEVELS = refuse_unless_levels(wrong_types, "a gauge is needed")
# What a pod page is parsed for: the gauges, and the counters `metric: demand` takes rates of. Only the
# gauges make a page an inference server's.
POD_PAGE_NAMES = ENGINE_SAMPLE_NAMES | DEMAND_SAMPLE_NAMES


class PageSink(Protocol):
    """Where wanted pages go: the inference scrape collector (add/remove a URL with the pod it names)."""

    def add_pod_page(self, url: str, namespace: str, pod: str) -> None: ...

    def remove(self, url: str) -> None: ...


class InferencePages:
    """The PageSink of the running scaler: each pod page becomes a source of its own in the store."""

    def __init__(self) -> None:
        self.collector: ScrapeCollector | None = None  # set once the HTTP session exists (App.start)

    def add_pod_page(self, url: str, namespace: str, pod: str) -> None:
        assert self.collector is not None, "pages are wanted only once the scaler has started"
        reader = PageReader(
            POD_PAGE_NAMES,
            pod_page_reader(namespace, pod),
            ENGINE_SAMPLE_NAMES,
            "inference-server metrics",
            refuse=_DECLARED_AS_LEVELS,
        )
        self.collector.add(url, reader=reader, kind=SourceKind.INFERENCE, namespace=namespace, pod=pod)

    def remove(self, url: str) -> None:
        if self.collector is not None:
            self.collector.remove(url)


class WantedPages:
    """Which pod pages followed ScaledObjects want: a page is scraped while at least one wants it.

    Each owner (a followed ScaledObject's trigger) says which pages it wants now; pages it no longer
    names (a pod gone in a rollout) are released at once, and all of them when the owner is forgotten.

    A page is filed under the pod that owns its address at that port. Pod IPs are shared (hostNetwork
    pods share their node's) and reused (across namespaces too), so two owners may name one URL for two
    different pods: the page then belongs to the one pod among them that declares that container port,
    and when none or several do, to nobody until one claim goes — never to whoever named it last, which
    let a tenant naming another's port as metricsPort read that tenant's load and blind it for good.
    """

    def __init__(self, sink: PageSink) -> None:
        self._sink = sink
        self._by_owner: dict[object, dict[str, tuple[str, str]]] = {}
        # url → owner → (the pod it files the page under, whether that pod declares the page's port)
        self._claims: dict[str, dict[object, tuple[tuple[str, str], bool]]] = {}
        self._bound: dict[str, tuple[str, str]] = {}  # url → the (namespace, pod) its page is filed under

    def want(
        self, owner: object, pages: Mapping[str, tuple[str, str]], declared: Collection[str] = ()
    ) -> None:
        """pages: url → (namespace, pod). Replaces what `owner` wanted before. declared: the URLs whose
        port the pod declares as a container port (it owns the address at that port)."""
        before = self._by_owner.get(owner, {})
        for url, binding in pages.items():
            claims = self._claims.setdefault(url, {})
            claim = (binding, url in declared)
            if claims.get(owner) != claim:
                claims[owner] = claim
                self._settle(url)
        for url in before.keys() - pages.keys():
            self._unclaim(owner, url)
        if pages:
            self._by_owner[owner] = dict(pages)
        else:
            self._by_owner.pop(owner, None)

    def release(self, owner: object) -> None:
        for url in self._by_owner.pop(owner, {}):
            self._unclaim(owner, url)

    def filed_under(self, url: str) -> tuple[str, str] | None:
        """The pod a wanted page is filed under; None when it is not read (not wanted, or claimed for
        several pods of which not exactly one declares its port)."""
        return self._bound.get(url)

    def __len__(self) -> int:
        return len(self._claims)

    def _unclaim(self, owner: object, url: str) -> None:
        claims = self._claims.get(url, {})
        claims.pop(owner, None)
        if not claims:
            self._claims.pop(url, None)
        self._settle(url)

    def _settle(self, url: str) -> None:
        """File the page under the pod that owns it now (see the class docstring), or stop reading it."""
        claims = self._claims.get(url, {})
        pods = {binding for binding, _ in claims.values()}
        if len(pods) > 1:
            pods = {binding for binding, declares in claims.values() if declares}
        owner = next(iter(pods)) if len(pods) == 1 else None
        if self._bound.get(url) == owner:
            return
        if url in self._bound:
            # Never left filed under the pod that had it before: its address may be another pod's now.
            self._sink.remove(url)
            del self._bound[url]
        if owner is not None:
            self._bound[url] = owner
            self._sink.add_pod_page(url, *owner)
