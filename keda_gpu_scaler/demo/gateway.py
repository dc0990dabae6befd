"""The demo's inference gateway: an endpoint picker (EPP, flow control on) in front of a model server at
zero replicas, whose queue the load control fills, so a newcomer can watch the scaler wake it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aiohttp import web

from keda_gpu_scaler.demo.epp import Queued, epp_page

# Whole requests the load control accepts for one pool (the EPP's own per-band cap is 5,000).
MAX_PENDING = 5_000


@dataclass(frozen=True)
class DemoPool:
    """An InferencePool of the demo: its model, its model server (a Deployment at zero replicas) and the
    EPP replicas (active-active, each with its own queue) that serve its metrics."""

    name: str
    model: str
    workload: str
    epp_replicas: tuple[str, ...]


@dataclass
class _Queue:
    pending: int = 0
    queued_at: float | None = None  # when the queue last went from empty to holding requests


@dataclass
class DemoGateway:
    """The pools and their queues; pages are a function of the queues only."""

    clock: Callable[[], float]
    pools: tuple[DemoPool, ...] = (
        DemoPool(
            "chat-zero-pool",
            "Qwen/Qwen3-8B",
            "vllm-zero",
            ("chat-zero-pool-epp-6f9c7-kx2vq", "chat-zero-pool-epp-6f9c7-p8rzn"),
        ),
    )
    _queues: dict[str, _Queue] = field(default_factory=dict)

    def pool(self, name: str) -> DemoPool:
        found = next((p for p in self.pools if p.name == name), None)
        if found is None:
            raise ValueError(f"unknown pool {name!r}; the demo's InferencePools are: {self.names()}")
        return found

    def names(self) -> str:
        return ", ".join(p.name for p in self.pools)

    def set_pending(self, pool: str, pending: int) -> None:
        """Hold `pending` requests for the pool (spread over its EPP replicas as a load balancer would)."""
        self.pool(pool)
        if isinstance(pending, bool) or not isinstance(pending, int) or not 0 <= pending <= MAX_PENDING:
            raise ValueError(
                f"pending requests for pool {pool!r} must be a whole number from 0 to {MAX_PENDING}"
            )
        queue = self._queues.setdefault(pool, _Queue())
        if queue.pending == 0 and pending > 0:
            queue.queued_at = self.clock()
        queue.pending = pending

    def pending(self, pool: str) -> int:
        queue = self._queues.get(pool)
        return queue.pending if queue else 0

    def queued_at(self, pool: str) -> float | None:
        queue = self._queues.get(pool)
        return queue.queued_at if queue and queue.pending else None

    def replica_share(self, pool: str, replica: str) -> int:
        info = self.pool(pool)
        index = info.epp_replicas.index(replica)
        total, count = self.pending(pool), len(info.epp_replicas)
        return total // count + (1 if index < total % count else 0)

    def render(self, pool: str, replica: str) -> str:
        info = self.pool(pool)
        share = self.replica_share(pool, replica)
        # Once a request was queued the series stays (at 0 when empty), as the EPP's gauge does.
        queue: Mapping[Queued, float] = {Queued(info.model): share} if pool in self._queues else {}
        return epp_page(pool, queue, ready_endpoints=0)

    def page_paths(self) -> list[tuple[str, str, str]]:
        """(pool, replica, path of its metrics page on the control server)."""
        return [(p.name, r, f"/gateways/{p.name}/{r}/metrics") for p in self.pools for r in p.epp_replicas]

    def state(self) -> list[dict[str, object]]:
        return [
            {
                "pool": p.name,
                "model": p.model,
                "workload": p.workload,
                "replicas": 0,
                "pending": self.pending(p.name),
                "epp_replicas": {r: self.replica_share(p.name, r) for r in p.epp_replicas},
            }
            for p in self.pools
        ]

    def load(self, query: Mapping[str, str]) -> str | None:
        """`/load?pool=NAME&pending=N`: None when applied, else the error to answer with."""
        pool = query.get("pool", "")
        allowed = f"pool=NAME (one of: {self.names()}) and pending=N, a whole number from 0 to {MAX_PENDING}"
        if pool not in {p.name for p in self.pools}:
            return f"query parameter 'pool'={pool!r} is unknown; allowed: {allowed}"
        extra = sorted(set(query) - {"pool", "pending"})
        if extra:
            return f"query parameter {extra[0]!r} does not apply to a pool; allowed: {allowed}"
        raw = query.get("pending")
        if raw is None:
            return f"missing query parameter 'pending'; allowed: {allowed}"
        try:
            pending = int(raw.strip())
        except ValueError:
            return f"query parameter 'pending'={raw!r} is not a whole number; allowed: {allowed}"
        if not 0 <= pending <= MAX_PENDING:
            return f"query parameter 'pending'={raw!r} is out of range; allowed: {allowed}"
        self.set_pending(pool, pending)
        return None

    async def handle_page(self, request: web.Request) -> web.Response:
        pool, replica = request.match_info["pool"], request.match_info["replica"]
        info = next((p for p in self.pools if p.name == pool), None)
        if info is None or replica not in info.epp_replicas:
            return web.Response(status=404, text=f"no EPP replica {pool}/{replica}\n")
        return web.Response(
            body=self.render(pool, replica).encode(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )
