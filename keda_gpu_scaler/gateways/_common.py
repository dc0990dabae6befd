"""Types shared by the gateway modules: what one endpoint-picker page says about one pool's queue."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from keda_gpu_scaler.exposition import Sample

# The value an EPP prints in place of a model name or fairness id past its cardinality cap: any model
# may hide behind it, so it counts for every `model` (a spurious wake costs one replica; a missed one
# loses the requests held).
OTHER = "other"


class GatewayProblem(StrEnum):
    """Why a page gives no queue for the pool, so the caller can pick the words and the status."""

    FLOW_CONTROL_OFF = "flow_control_off"  # the page is an EPP's, without any flow-control family
    NO_VALUE = "no_value"  # a queue series of the pool is NaN, infinite or negative
    OTHER_POOL = "other_pool"  # the queue series name other pools only: the page is another pool's EPP


@dataclass(frozen=True, slots=True)
class QueueMissing:
    """No queue for the pool on this page: never a 0."""

    kind: GatewayProblem
    reason: str


@dataclass(frozen=True, slots=True)
class PoolQueue:
    """Requests one EPP replica holds for one pool (summed over fairness ids and priorities)."""

    total: float
    by_model: tuple[tuple[str, float], ...]  # model (target_model_name, else model_name) → requests
    family: str | None  # the family read; None: flow control is on and nothing was ever queued
    other_counted: bool = False  # series folded to `other` counted for the trigger's `model`


QueueReading = PoolQueue | QueueMissing


def usable(value: float) -> bool:
    """A queue size is a count: finite and not negative, or no reading at all (never clamped to 0)."""
    return math.isfinite(value) and value >= 0


def names_of(samples: Iterable[Sample]) -> frozenset[str]:
    return frozenset(sample.name for sample in samples)
