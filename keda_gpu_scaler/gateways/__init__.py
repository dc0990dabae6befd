"""Gateway layer: an inference gateway's page turned into the requests it holds for a pool (pure: no I/O).

The counterpart of engines/ for SPEC §7: one module per gateway that holds requests while a pool has
no endpoint (family names, label rules and `read`), one registry line each. Fetching pages, choosing
replicas and turning a missing queue into a status are the caller's job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from keda_gpu_scaler.exposition import Sample
from keda_gpu_scaler.gateways import epp
from keda_gpu_scaler.gateways._common import (
    OTHER,
    GatewayProblem,
    PoolQueue,
    QueueMissing,
    QueueReading,
)

__all__ = [
    "GATEWAYS",
    "GATEWAY_SAMPLE_NAMES",
    "OTHER",
    "GatewayModule",
    "GatewayProblem",
    "PoolQueue",
    "QueueMissing",
    "QueueReading",
    "read_queue",
    "wrong_types",
]


class GatewayModule(Protocol):
    @property
    def NAME(self) -> str: ...

    @property
    def SAMPLE_NAMES(self) -> frozenset[str]: ...

    @property
    def LEVEL_FAMILIES(self) -> tuple[str, ...]: ...

    def read(
        self, samples: Sequence[Sample], pool: str, namespace: str, model: str | None
    ) -> QueueReading: ...


# The one registry: a gateway is one module and one line here.
GATEWAYS: tuple[GatewayModule, ...] = (epp,)
GATEWAY_SAMPLE_NAMES: frozenset[str] = frozenset().union(*(g.SAMPLE_NAMES for g in GATEWAYS))
_LEVEL_TYPES = frozenset({"gauge", "untyped"})


def read_queue(samples: Sequence[Sample], pool: str, namespace: str, model: str | None) -> QueueReading:
    """The requests a gateway replica's page says it holds for the pool (only the EPP so far)."""
    return epp.read(samples, pool, namespace, model)


def wrong_types(page: bytes) -> dict[str, str]:
    """Queue families a page declares as something other than a level (`# TYPE name counter`): name → type.

    The sample parser skips comment lines, so a counter printed under the queue's name would otherwise
    be read as requests held now. One substring search per family, never a pass over the lines."""
    found: dict[str, str] = {}
    for gateway in GATEWAYS:
        for name in gateway.LEVEL_FAMILIES:
            marker = f"# TYPE {name} ".encode()
            at = page.find(marker)
            if at < 0:
                continue
            end = page.find(b"\n", at)
            declared = page[at + len(marker) : None if end < 0 else end].decode("utf-8", "replace").strip()
            if declared not in _LEVEL_TYPES:
                found[name] = declared
    return found
