"""Types shared by the gateway modules: what one endpoint-picker page says about its pools' queues."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# The EPP's metrics port when the trigger names none (llm-d-router's `--metrics-port` default).
DEFAULT_GATEWAY_METRICS_PORT = 9090

# The value an EPP prints in place of a model name or fairness id past its cardinality cap: any model
# may hide behind it, so it counts for every `model` (a spurious wake costs one replica; a missed one
# loses the requests held).
OTHER = "other"


class NotAGatewayPage(ValueError):
    """A page that cannot be read as a gateway's (not one at all, a queue of the wrong type, a series
    printed twice with different values): the source failed, it is not an empty queue."""


class GatewayProblem(StrEnum):
    """Why a page gives no queue for the pool, so the caller can pick the words and the status."""

    FLOW_CONTROL_OFF = "flow_control_off"  # the page is an EPP's, without any flow-control family
    NO_VALUE = "no_value"  # a queue series of the pool is NaN, infinite or negative
    OTHER_POOL = "other_pool"  # the queue series name other pools only: the page is another pool's EPP


@dataclass(frozen=True, slots=True)
class QueueTable:
    """One gateway page's queue, summed at scrape time per (pool label, model): an EPP at its caps prints
    10,000 series (1,000 models × 10 fairness ids), which no evaluation should walk again.

    A model is the series' `target_model_name`, or where that is empty its `model_name`."""

    gateway: str  # the module that read it (its NAME): the one that reads it for a pool
    family: str | None  # the queue family read; None: the page has none
    flow_control: bool  # the page shows flow control running (a queue family or another of its families)
    totals: tuple[tuple[str, str, float], ...]  # (pool label, model, requests) over usable series
    # (pool label, model, the series as printed) of series whose value cannot be a count: NaN, ±Inf, < 0
    unusable: tuple[tuple[str, str, str], ...] = ()
    # (pool label, series, value) of the counters of requests turned away for want of an endpoint
    turned_away: tuple[tuple[str, str, float], ...] = ()
    # (pool label, requests turned away since this replica's previous page); empty on a first page
    grown: tuple[tuple[str, float], ...] = ()
    # (pool label, stage, value) of the pool's flow-control saturation: shown, never read as load
    saturation: tuple[tuple[str, str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class QueueMissing:
    """No queue for the pool on this page: never a 0."""

    kind: GatewayProblem
    reason: str


@dataclass(frozen=True, slots=True)
class PoolQueue:
    """Requests one gateway replica holds for one pool (summed over fairness ids and priorities)."""

    total: float
    by_model: tuple[tuple[str, float], ...]  # model → requests
    family: str | None  # the family read; None: flow control is on and nothing was ever queued
    other_counted: bool = False  # series folded to `other` counted for the trigger's `model`
    turned_away: float = 0.0  # requests turned away for want of an endpoint since the previous page
    saturation: tuple[tuple[str, float], ...] = ()  # stage → the pool's saturation (never load)


QueueReading = PoolQueue | QueueMissing


# Labels Prometheus gives a series from its scrape target (Kubernetes service discovery, kube-prometheus'
# ServiceMonitors and PodMonitors), never printed by an endpoint picker about its queue: two scrape jobs'
# copies of one series differ only in them.
SCRAPE_TARGET_LABELS = frozenset({"job", "instance", "endpoint", "service", "container", "namespace", "pod"})
