"""Gateway layer: an inference gateway's page turned into the requests it holds for a pool (pure: no I/O).

The counterpart of engines/ for SPEC §7: one module per gateway that holds requests while a pool has
no endpoint (family names, label rules, `queue_table` and `read`), one registry line each. Fetching
pages, choosing replicas and turning a missing queue into a status are the caller's job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from keda_gpu_scaler.pages import exposition
from keda_gpu_scaler.pages.exposition import Sample
from keda_gpu_scaler.pages.gateways import epp, epp_flow
from keda_gpu_scaler.pages.gateways._common import (
    DEFAULT_GATEWAY_METRICS_PORT,
    OTHER,
    GatewayProblem,
    NotAGatewayPage,
    PoolQueue,
    QueueMissing,
    QueueReading,
    QueueTable,
)

__all__ = [
    "DEFAULT_GATEWAY_METRICS_PORT",
    "GATEWAYS",
    "GATEWAY_SAMPLE_NAMES",
    "MAX_QUEUE_SERIES",
    "OTHER",
    "GatewayModule",
    "GatewayProblem",
    "NotAGatewayPage",
    "PoolQueue",
    "QueueMissing",
    "QueueReading",
    "QueueTable",
    "page_queue",
    "queue_table",
    "read_queue",
    "since",
    "table_from_samples",
    "wrong_types",
]


class GatewayModule(Protocol):
    @property
    def NAME(self) -> str: ...

    @property
    def SAMPLE_NAMES(self) -> frozenset[str]: ...

    @property
    def LEVEL_FAMILIES(self) -> tuple[str, ...]: ...

    def queue_table(self, body: bytes, max_series: int) -> QueueTable: ...

    def table_from_samples(self, samples: Sequence[Sample]) -> QueueTable: ...

    def read(self, table: QueueTable, pool: str, namespace: str, model: str | None) -> QueueReading: ...


# The one registry: a gateway is one module and one line here.
GATEWAYS: tuple[GatewayModule, ...] = (epp,)
# Every family the gateways read (what a Prometheus query asks for); a page's queue is read by queue_table.
GATEWAY_SAMPLE_NAMES: frozenset[str] = frozenset().union(*(g.SAMPLE_NAMES for g in GATEWAYS))
# An EPP at its caps prints 1,000 models × 10 fairness ids; far more is not a real page.
MAX_QUEUE_SERIES = 100_000
_LEVEL_TYPES = frozenset({"gauge", "untyped"})


_BY_NAME: dict[str, GatewayModule] = {gateway.NAME: gateway for gateway in GATEWAYS}


def queue_table(body: bytes, max_series: int = MAX_QUEUE_SERIES) -> QueueTable:
    """A gateway page's queue, read by the first gateway that recognises the page (in GATEWAYS order).
    NotAGatewayPage when none does."""
    refused: NotAGatewayPage | None = None
    for gateway in GATEWAYS:
        try:
            return gateway.queue_table(body, max_series)
        except NotAGatewayPage as error:
            refused = refused or error
    assert refused is not None  # GATEWAYS is never empty
    raise refused


def table_from_samples(samples: Sequence[Sample]) -> QueueTable:
    """The queue of one replica's parsed series (a Prometheus answer's): read by the first gateway whose
    families are among them, else by the first gateway (which says what is missing)."""
    names = {sample.name for sample in samples}
    chosen = next((g for g in GATEWAYS if names & g.SAMPLE_NAMES), GATEWAYS[0])
    return chosen.table_from_samples(samples)


def read_queue(table: QueueTable, pool: str, namespace: str, model: str | None) -> QueueReading:
    """The requests a gateway replica's page says it holds for the pool (read by the gateway that read
    the page)."""
    return _BY_NAME[table.gateway].read(table, pool, namespace, model)


def since(previous: QueueTable | None, table: QueueTable) -> QueueTable:
    """`table` with the requests turned away for want of an endpoint since `previous`, the same replica's
    page before it (None: this is its first page, which only sets the baseline)."""
    grown = epp_flow.growth(previous.turned_away if previous is not None else None, table.turned_away)
    return dataclasses.replace(table, grown=grown) if grown != table.grown else table


def page_queue(page: bytes | str) -> QueueTable:
    """A whole page read as the scrape path reads it (for tools, tests and benchmarks)."""
    body = page.encode() if isinstance(page, str) else page
    return queue_table(body)


def wrong_types(page: bytes) -> dict[str, str]:
    """Queue families a page declares as something other than a level (`# TYPE name counter`): name → type.

    Comment lines are not read for samples, so a counter printed under the queue's name would otherwise
    be read as requests held now."""
    levels = {name for gateway in GATEWAYS for name in gateway.LEVEL_FAMILIES}
    declared = exposition.declared_types(page, levels)
    return {name: kind for name, kind in declared.items() if kind not in _LEVEL_TYPES}
