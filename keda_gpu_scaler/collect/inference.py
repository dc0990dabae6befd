"""Inference-server pages (SPEC §6): which pod each page belongs to, and where a pod's page is.

GPU exporters serve one page per node naming many pods; an inference server serves its own pod's page,
so the pod is known from where the page was fetched, not from its labels. Pages are kept as the pod's
raw samples: how they become a value depends on the trigger (`engine`, `model`, `metric`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from yarl import URL

from keda_gpu_scaler.collect.scrape import PageReader, ScrapeCollector, refuse_unless_levels
from keda_gpu_scaler.collect.wanted import PodPage
from keda_gpu_scaler.core.snapshot import SourceKind
from keda_gpu_scaler.pages.engines import (
    DEMAND_SAMPLE_NAMES,
    ENGINE_SAMPLE_NAMES,
    PodSamples,
    page_counters,
    wrong_types,
)
from keda_gpu_scaler.pages.exposition import Sample

if TYPE_CHECKING:
    from keda_gpu_scaler.core.snapshot import PodEndpoint

log = logging.getLogger(__name__)

# Container port names tried, in order, when the trigger gives no metricsPort (SPEC §6).
DEFAULT_PORT_NAMES = ("metrics", "http")


def pod_page_reader(
    namespace: str, pod: str, url: str = ""
) -> Callable[[Sequence[Sample]], Iterable[PodSamples]]:
    """Reads a pod's own page at `url`: every kept sample is that pod's, whatever its labels say."""

    def read(samples: Sequence[Sample]) -> list[PodSamples]:
        kept = tuple(samples)
        return [PodSamples(namespace, pod, kept, url, page_counters(kept))]

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
    """The URL of a pod's page as the client sends it: yarl removes dot segments and decodes escaped
    unreserved characters (`/x/../%6detrics` goes out as `/metrics`), and a page is claimed, fetched and
    filed under that one spelling."""
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}{URL(f'http://{host}:{port}{path}').raw_path}"


def page_of(endpoint: PodEndpoint, wanted_port: str | None, path: str) -> tuple[int, str] | None:
    """A Ready pod's page at a trigger's `metricsPort` and `metricsPath`: (port, URL); None: not Ready,
    no IP yet, or no such port."""
    if not endpoint.ready or not endpoint.ip:
        return None
    port = metrics_port(endpoint.port_list, wanted_port)
    return None if port is None else (port, pod_url(endpoint.ip, port, path))


# A page declaring a family the engines read as anything but a level (gauge or untyped) is refused.
_DECLARED_AS_LEVELS = refuse_unless_levels(wrong_types, "a gauge is needed")
# What a pod page is parsed for: the gauges, and the counters `metric: demand` takes rates of. Only the
# gauges make a page an inference server's.
POD_PAGE_NAMES = ENGINE_SAMPLE_NAMES | DEMAND_SAMPLE_NAMES


class InferencePages:
    """Pod pages (wanted.PodPage) as sources of the inference collector: each filed under its pod."""

    def __init__(self, collector: ScrapeCollector) -> None:
        self.collector = collector

    def add_page(self, page: PodPage) -> None:
        reader = PageReader(
            POD_PAGE_NAMES,
            pod_page_reader(page.namespace, page.pod, page.url),
            ENGINE_SAMPLE_NAMES,
            "inference-server metrics",
            refuse=_DECLARED_AS_LEVELS,
        )
        self.collector.add(
            page.url,
            reader=reader,
            kind=SourceKind.INFERENCE,
            namespace=page.namespace,
            pod=page.pod,
            interest_key=page,
        )

    def remove(self, url: str) -> None:
        self.collector.remove(url)
