"""Gateway pages as store sources: each endpoint-picker replica page scraped by the gateway collector.

The collector is the ScrapeCollector every other page goes through (fetcher, limits, store, failure
rules); what differs is the reader (the gateways' families, filed under the replica's pool). A page is
scraped while its pool wants it (collect/gateway.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from keda_gpu_scaler.collect.scrape import (
    MAX_SERIES_PER_PAGE,
    NotOurPage,
    PageReader,
    ScrapeCollector,
    refuse_unless_levels,
)
from keda_gpu_scaler.collect.wanted import EppPage
from keda_gpu_scaler.core.snapshot import SourceKind
from keda_gpu_scaler.pages.exposition import Sample
from keda_gpu_scaler.pages.gateways import (
    GATEWAY_SAMPLE_NAMES,
    NotAGatewayPage,
    QueueTable,
    queue_table,
    since,
    wrong_types,
)


@dataclass(frozen=True, slots=True)
class ReplicaQueue:
    """One endpoint-picker replica's queue (summed per pool label and model), as one page gave it."""

    namespace: str
    pool: str
    replica: str
    table: QueueTable

    @property
    def pod(self) -> str:
        return self.replica


def replica_reader(
    namespace: str, pool: str, replica: str
) -> Callable[[bytes, Sequence[Sample]], Iterable[ReplicaQueue]]:
    # The previous page's turned-away counters: their growth to this page is a wake (SPEC §7). Only one
    # scrape of a page runs at a time, so this needs no lock.
    previous: list[QueueTable] = []

    def read(body: bytes, samples: Sequence[Sample]) -> list[ReplicaQueue]:
        try:
            table = since(previous[0] if previous else None, queue_table(body, MAX_SERIES_PER_PAGE))
        except NotAGatewayPage as error:
            raise NotOurPage(str(error)) from None
        previous[:] = [table]
        return [ReplicaQueue(namespace, pool, replica, table)]

    return read


# A page declaring the queue as anything but a gauge is refused: a counter is not requests held now.
_DECLARED_AS_LEVELS = refuse_unless_levels(wrong_types, "the flow-control queue is a gauge")


def gateway_reader(namespace: str, pool: str, replica: str) -> PageReader:
    # No family goes through the general parser: queue_table reads the queue itself and only looks up
    # whether the EPP's other families are on the page.
    return PageReader(
        frozenset(),
        None,
        GATEWAY_SAMPLE_NAMES,
        "endpoint-picker (EPP) metrics",
        refuse=_DECLARED_AS_LEVELS,
        read_body=replica_reader(namespace, pool, replica),
    )


class GatewayCollectorSink:
    """GatewayPages' sink in the running scaler: one store source per replica page."""

    def __init__(self, collector: ScrapeCollector) -> None:
        self.collector = collector
        # Every page is read, even the same bytes as the one before: what a page says about requests
        # turned away is its growth since the previous page, which an unchanged page sets back to none.
        collector.reuse_unchanged_pages = False

    def add_page(self, page: EppPage) -> None:
        self.collector.add(
            page.url,
            reader=gateway_reader(page.namespace, page.pool, page.replica),
            kind=SourceKind.GATEWAY,
            namespace=page.namespace,
            pod=page.replica,
            interest_key=page,
        )

    def remove(self, url: str) -> None:
        self.collector.remove(url)
