"""The endpoint picker's flow-control signals beside its queue: requests turned away for want of an endpoint
(a wake the queue never shows) and the pool's saturation (shown, never read as load). Pure: no I/O.

An EPP whose pool has no endpoint holds a request at most `noEndpointRequestTTL`, and refuses one outright
when its bounded queue is full: either way the request is gone from the queue, and a scrape that came
between may never have seen it queued. What remains is a counter,
`…_flow_control_requests_total{outcome="RejectedNoEndpoints"|"EvictedNoEndpoints"}`: its growth from one
page to the next is a wake exactly like a queue above the threshold (SPEC §7).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from keda_gpu_scaler.pages.exposition import Sample
from keda_gpu_scaler.pages.gateways._common import SCRAPE_TARGET_LABELS

# llm-d-router docs/metrics.md: a counter labelled outcome, priority, inference_pool; the Inference
# Extension's EPPs printed it under their own prefix. A page with both counts once, the current preferred.
REQUESTS_TOTAL = "llm_d_epp_flow_control_requests_total"
REQUESTS_TOTAL_OLD = "inference_extension_flow_control_requests_total"
# A gauge labelled inference_pool (and `stage` — prefill, decode, effective — on newer EPPs). It reads 1.0
# for a pool with no endpoint at all (nothing can take a request), so it is never read as load.
SATURATION = "llm_d_epp_flow_control_pool_saturation"
SATURATION_OLD = "inference_extension_flow_control_pool_saturation"
FAMILIES = (REQUESTS_TOTAL, REQUESTS_TOTAL_OLD, SATURATION, SATURATION_OLD)

# The outcomes of a request the EPP could not hold or place because the pool had no endpoint: refused at
# the queue's bound, or evicted after waiting out noEndpointRequestTTL. Both answered 503.
NO_ENDPOINT_OUTCOMES = frozenset({"RejectedNoEndpoints", "EvictedNoEndpoints"})
POOL_LABEL = "inference_pool"
STAGE_LABEL = "stage"

Counter = tuple[str, str, float]
"""(pool label, the series' whole label set as printed, value): one turned-away counter series."""
Saturation = tuple[str, str, float]
"""(pool label, stage — empty on EPPs without the label, value)."""
Growth = tuple[str, float]
"""(pool label, requests turned away since the previous page)."""


def series_text(labels: dict[str, str]) -> str:
    """A label set as the text format prints it, sorted by name (for messages and as a series' key)."""
    return ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))


def _preferred(samples: Sequence[Sample], current: str, old: str) -> list[Sample]:
    names = {sample.name for sample in samples}
    family = current if current in names else old
    return [sample for sample in samples if sample.name == family]


def turned_away(samples: Sequence[Sample]) -> tuple[Counter, ...]:
    """The page's counters of requests turned away for want of an endpoint, one per series.

    A value that cannot be a counter (NaN, infinite, negative) is left out: it can tell no growth. A series
    is keyed without the labels a Prometheus scrape target adds: read through Prometheus, the copy kept of
    a replica scraped by two jobs may be either job's, and it is the same counter."""
    found = {
        (s.labels.get(POOL_LABEL, ""), series_text(_printed(s.labels)), s.value)
        for s in _preferred(samples, REQUESTS_TOTAL, REQUESTS_TOTAL_OLD)
        if s.labels.get("outcome") in NO_ENDPOINT_OUTCOMES and 0 <= s.value < math.inf
    }
    return tuple(sorted(found))


def _printed(labels: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in labels.items() if name not in SCRAPE_TARGET_LABELS}


def saturation(samples: Sequence[Sample]) -> tuple[Saturation, ...]:
    """The page's saturation per pool and stage (for /explain: it is never load)."""
    return tuple(
        sorted(
            {
                (s.labels.get(POOL_LABEL, ""), s.labels.get(STAGE_LABEL, ""), s.value)
                for s in _preferred(samples, SATURATION, SATURATION_OLD)
            }
        )
    )


def growth(previous: Sequence[Counter] | None, current: Sequence[Counter]) -> tuple[Growth, ...]:
    """Requests turned away per pool between two pages of one EPP replica.

    No previous page: nothing is known to have grown (the first page only sets the baseline). A series
    first seen on this page grew from 0 (client_golang creates a series on its first increment). A pool
    one of whose series went down is an EPP that restarted (its counters began again): not a wake, and
    this page is the new baseline."""
    if previous is None:
        return ()
    before = {(pool, series): value for pool, series, value in previous}
    grown: dict[str, float] = {}
    restarted: set[str] = set()
    for pool, series, value in current:
        old = before.get((pool, series), 0.0)
        if value < old:
            restarted.add(pool)
        elif value > old:
            grown[pool] = grown.get(pool, 0.0) + (value - old)
    # A series gone from the page is an EPP that restarted too (a counter is never deleted while it runs).
    now = {(pool, series) for pool, series, _ in current}
    restarted |= {pool for (pool, series) in before if (pool, series) not in now}
    return tuple(sorted((pool, count) for pool, count in grown.items() if pool not in restarted))
