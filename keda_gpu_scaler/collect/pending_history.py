"""The gateway's pending requests over time, for `demand` with `inferencePool` (SPEC §6): their growth.

The rate at which requests pile up at the gateway is taken over the times its pages were READ, never over
the times KEDA happened to call (two calls a moment apart around one new page would make any queue look
like a flood). This module listens to the store (Store.page_listeners / removal_listeners) and keeps, per
(namespace, pool, model) some trigger asked about, each endpoint-picker replica's pending total at each
of its page times. Replicas are kept apart (each page has its own clock); the pool's growth is the sum of
theirs, and a replica that leaves takes its points with it, never a step. Each trigger reads its own
window: points are kept over the longest window asked for recently, so a short window never trims a long
one. Bounded: only pools asked about, at most MAX_POINTS points a replica, and a pool nobody asked about
for `forget_after` seconds is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from keda_gpu_scaler.collect.demand_history import MAX_POINTS, SWEEP_EVERY
from keda_gpu_scaler.collect.gateway_source import ReplicaQueue
from keda_gpu_scaler.collect.store import Page
from keda_gpu_scaler.core.demand import growth_per_second
from keda_gpu_scaler.core.snapshot import SourceKind
from keda_gpu_scaler.pages.gateways import PoolQueue, read_queue

PendingKey = tuple[str, str, str | None]
"""(namespace, InferencePool, model): the pending requests one trigger reads."""
_GATEWAY_KINDS = frozenset({SourceKind.GATEWAY, SourceKind.PROMETHEUS_GATEWAY})


@dataclass(slots=True)
class _Pool:
    """One (namespace, pool, model): each replica's (page time, pending) points, oldest first."""

    windows: dict[float, float]  # each window asked for → when it was last asked for
    replicas: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    # demandUnit tokens: the weighted tokens per request the pool's pods measured last, per prefillWeight
    # (two triggers weighing prompt tokens differently size the same requests differently), and when it
    # was last asked for: forgotten as windows are, so made-up weights cannot grow it while a pool is read.
    sizes: dict[float, tuple[float, float]] = field(default_factory=dict)

    def kept_window(self, now: float, forget_after: float) -> float:
        for window in [w for w, asked in self.windows.items() if now - asked > forget_after]:
            del self.windows[window]
        for weight in [w for w, (_, asked) in self.sizes.items() if now - asked > forget_after]:
            del self.sizes[weight]
        _keep_newest(self.windows, lambda asked: asked)
        _keep_newest(self.sizes, lambda size: size[1])
        return max(self.windows, default=0.0)


# The windows and prefillWeights a pool keeps, most recently asked for first: more than the triggers one
# pool is really read by, far fewer than a caller sending new metadata on every call would make.
MAX_ASKED = 64


def _keep_newest(asked: dict[float, Any], when: Callable[[Any], float]) -> None:
    while len(asked) > MAX_ASKED:
        del asked[min(asked, key=lambda key: when(asked[key]))]


class PendingHistory:
    """Per (namespace, pool, model) asked about, each replica's pending totals at its page times."""

    def __init__(self, *, forget_after: float) -> None:
        self._forget_after = forget_after
        self._pools: dict[PendingKey, _Pool] = {}
        # The newest queue of each replica page, by reference (the store holds it): a pool asked about for
        # the first time starts with one point, not none.
        self._newest: dict[tuple[str, str, str], tuple[float, ReplicaQueue]] = {}
        # The replicas each page source's last page held: through Prometheus one page holds every replica
        # of a pool, and one that leaves it (a rollout's old picker pod) is gone.
        self._on_source: dict[str, set[tuple[str, str, str]]] = {}
        self._swept_at = float("-inf")

    def __len__(self) -> int:
        """How many pools are kept (for tests and the bound)."""
        return len(self._pools)

    def replicas_kept(self) -> int:
        """How many replica pages have points or a newest queue kept (for tests and the bound)."""
        kept = {(key[0], key[1], name) for key, pool in self._pools.items() for name in pool.replicas}
        return len(kept | self._newest.keys())

    def want(self, key: PendingKey, window: float, now: float) -> None:
        """Keep the pool's points over `window` from now on (each evaluation says so before it reads the
        gateway, so the pages read while the pool cannot be answered yet count too)."""
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool({window: now})
            for (namespace, name, _), (at, queue) in list(self._newest.items()):
                if (namespace, name) == key[:2]:
                    self._add(key, pool, at, queue)
        pool.windows[window] = now
        _keep_newest(pool.windows, lambda asked: asked)
        if now - self._swept_at >= SWEEP_EVERY:
            # Here too, not only as gateway pages come: forgotten triggers' pools stayed for good once
            # their pages stopped, while new ones kept being asked about. (Not the one asked for now: what
            # it remembers is pruned once its evaluation has asked for it, at the next page.)
            self._sweep(now, keep=key)

    def growth(self, key: PendingKey, replicas: Collection[str], window: float, now: float) -> float:
        """The pool's pending requests' growth per second over `window` (page times), summed over the
        `replicas` read now. 0 until some replica has two pages."""
        self.want(key, window, now)
        pool = self._pools[key]
        return sum(growth_per_second(_over(pool.replicas.get(name, []), window)) for name in replicas)

    def remember_size(
        self, key: PendingKey, prefill_weight: float, tokens_per_request: float | None, now: float
    ) -> float | None:
        """demandUnit tokens: the pods' tokens per request at this prefillWeight now, else the last measured
        at it (None: never)."""
        pool = self._pools.get(key)
        if pool is None:
            return tokens_per_request
        if tokens_per_request is None:
            kept = pool.sizes.get(prefill_weight)
            if kept is None:
                return None
            tokens_per_request = kept[0]
        pool.sizes[prefill_weight] = (tokens_per_request, now)
        _keep_newest(pool.sizes, lambda size: size[1])
        return tokens_per_request

    def on_page(self, kind: SourceKind, page: Page) -> None:
        """Store listener: a page was recorded."""
        if kind not in _GATEWAY_KINDS:
            return
        held: set[tuple[str, str, str]] = set()
        for queue in page.readings_of(ReplicaQueue):
            held.add((queue.namespace, queue.pool, queue.replica))
            self._newest[(queue.namespace, queue.pool, queue.replica)] = (page.collected_at, queue)
            for key, pool in self._pools.items():
                if key[:2] == (queue.namespace, queue.pool):
                    self._add(key, pool, page.collected_at, queue)
        self._forget(self._on_source.get(page.source, set()) - held)
        self._on_source[page.source] = held
        if page.collected_at - self._swept_at >= SWEEP_EVERY:
            self._sweep(page.collected_at)

    def on_removed(self, kind: SourceKind, page: Page) -> None:
        """Store listener: a replica page is gone: its points go too."""
        if kind not in _GATEWAY_KINDS:
            return
        self._on_source.pop(page.source, None)
        self._forget({(q.namespace, q.pool, q.replica) for q in page.readings_of(ReplicaQueue)})

    def _forget(self, replicas: set[tuple[str, str, str]]) -> None:
        for namespace, name, replica in replicas:
            self._newest.pop((namespace, name, replica), None)
            for key, pool in self._pools.items():
                if key[:2] == (namespace, name):
                    pool.replicas.pop(replica, None)

    def _add(self, key: PendingKey, pool: _Pool, at: float, queue: ReplicaQueue) -> None:
        points = pool.replicas.setdefault(queue.replica, [])
        if points and at <= points[-1][0]:
            return  # the same page again
        read = read_queue(queue.table, key[1], key[0], key[2])
        if not isinstance(read, PoolQueue):
            return  # no usable queue on this page: the evaluation says why; no point is made up
        points.append((at, read.total))
        keep = _over(points, pool.kept_window(at, self._forget_after))
        if len(keep) < len(points) or len(points) > MAX_POINTS:
            pool.replicas[queue.replica] = keep[-MAX_POINTS:]

    def _sweep(self, now: float, keep: PendingKey | None = None) -> None:
        self._swept_at = now
        gone = [
            k
            for k, pool in self._pools.items()
            if k != keep and not pool.kept_window(now, self._forget_after)
        ]
        for key in gone:
            del self._pools[key]


def _over(points: list[tuple[float, float]], window: float) -> list[tuple[float, float]]:
    """The newest point back to the newest one at least `window` before it (else back to the oldest)."""
    if not points:
        return points
    boundary = points[-1][0] - window
    for index in range(len(points) - 1, -1, -1):
        if points[index][0] <= boundary:
            return points[index:]
    return points
