"""Gateway layer: an inference gateway's page turned into the requests it holds for a pool (pure: no I/O).

The counterpart of engines/ for SPEC §7. One gateway holds requests while a pool has no endpoint: the
endpoint picker of llm-d's router and the Gateway API Inference Extension (epp.py: its families, label
rules and queue; epp_flow.py: its flow-control signals), read through the functions here. Fetching
pages, choosing replicas and turning a missing queue into a status are the caller's job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from keda_gpu_scaler.pages import exposition
from keda_gpu_scaler.pages.exposition import Sample
from keda_gpu_scaler.pages.gateways import epp, epp_flow
from keda_gpu_scaler.pages.gateways._common import (
    DEFAULT_GATEWAY_METRICS_PORT,
    OTHER,
    SCRAPE_TARGET_LABELS,
    GatewayProblem,
    NotAGatewayPage,
    PoolQueue,
    QueueMissing,
    QueueReading,
    QueueTable,
)

__all__ = [
    "DEFAULT_GATEWAY_METRICS_PORT",
    "GATEWAY_SAMPLE_NAMES",
    "MAX_QUEUE_SERIES",
    "OTHER",
    "SCRAPE_TARGET_LABELS",
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


# Every family the endpoint picker's page is read for (what a Prometheus query asks for).
GATEWAY_SAMPLE_NAMES: frozenset[str] = epp.SAMPLE_NAMES
# An EPP at its caps prints 1,000 models × 10 fairness ids; far more is not a real page.
MAX_QUEUE_SERIES = 100_000
_LEVEL_TYPES = frozenset({"gauge", "untyped"})


def queue_table(body: bytes, max_series: int = MAX_QUEUE_SERIES) -> QueueTable:
    """A gateway page's queue; NotAGatewayPage when it is not an endpoint picker's page."""
    return epp.queue_table(body, max_series)


def table_from_samples(samples: Sequence[Sample]) -> QueueTable:
    """The queue of one replica's parsed series (a Prometheus answer's)."""
    return epp.table_from_samples(samples)


def read_queue(table: QueueTable, pool: str, namespace: str, model: str | None) -> QueueReading:
    """The requests a gateway replica's page says it holds for the pool."""
    return epp.read(table, pool, namespace, model)


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
    declared = exposition.declared_types(page, set(epp.LEVEL_FAMILIES))
    return {name: kind for name, kind in declared.items() if kind not in _LEVEL_TYPES}
