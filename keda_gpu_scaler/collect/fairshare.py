"""A collector's fetches in flight, shared fairly between namespaces: one's hanging sources spend its own share.

All pages of a kind share one collector. With one plain semaphore, 300 endpoint-picker replicas of one
tenant that hang until the scrape timeout held every slot, and another tenant's page waited behind
them for seconds (its `pending` trigger then UNAVAILABLE 80 % of the time). Here each namespace has
slots of its own that nobody else can take, and a fair part of a common pool on top:

- a namespace with fewer than `own` fetches in flight starts the next at once, whatever the others do;
- beyond that it takes a free slot of the common pool (`shared` slots, --scrape-concurrency): any while
  no other namespace has a fetch in flight or waiting, else only while it holds fewer than `shared // 2`
  of them; else its fetch waits in its namespace's own queue;
- a freed common slot goes to the waiting namespaces in turn (round robin), a freed own slot to a fetch
  of its own namespace. A namespace that took the whole pool while alone gives back every common slot
  it frees while another waits, until it holds half.

So at most `shared + own × namespaces with a fetch in flight` fetches run at once: the namespaces are
those of followed ScaledObjects, bounded by --max-scaledobjects. Sources without a namespace (GPU
exporters, a node's page naming many namespaces) share the key None.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager

# Fetches of one namespace that never wait on another's: a few pages (a pool's EPP replicas, a small
# workload's pods) are fetched at once; more go on one after the other when the common pool is taken.
OWN_SLOTS = 2


class FairSlots:
    """Slots for fetches, per namespace (see the module docstring). Use `async with slots.slot(ns):`."""

    def __init__(self, shared: int, own: int = OWN_SLOTS) -> None:
        self._shared = shared
        self._own = own
        self._most = own + max(1, shared // 2)  # most one namespace holds while another wants a slot
        self._in_flight: dict[Hashable, int] = {}
        self._shared_used = 0
        self._waiting: dict[Hashable, deque[asyncio.Future[None]]] = {}  # in turn order (round robin)

    @property
    def in_flight(self) -> int:
        return sum(self._in_flight.values())

    @property
    def waiting(self) -> int:
        """Fetches waiting for a slot (cancelled ones not yet passed over included)."""
        return sum(len(queue) for queue in self._waiting.values())

    def held(self, namespace: Hashable) -> int:
        return self._in_flight.get(namespace, 0)

    @asynccontextmanager
    async def slot(self, namespace: Hashable) -> AsyncIterator[None]:
        await self._acquire(namespace)
        try:
            yield
        finally:
            self._release(namespace)

    async def _acquire(self, namespace: Hashable) -> None:
        if namespace not in self._waiting and self._can_take(namespace):
            self._take(namespace)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(namespace, deque()).append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(namespace)  # granted, then cancelled before it could run: give it back
            else:
                self._forget_waiter(namespace, waiter)
            raise

    def _forget_waiter(self, namespace: Hashable, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(namespace)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._waiting[namespace]

    def _can_take(self, namespace: Hashable) -> bool:
        held = self._in_flight.get(namespace, 0)
        if held < self._own:
            return True
        if self._shared_used >= self._shared:
            return False
        if held < self._most:
            return True
        # Past its half only while it is alone: the GPU exporters (one key) keep the whole pool.
        return all(other == namespace for other in self._in_flight) and all(
            other == namespace for other in self._waiting
        )

    def _take(self, namespace: Hashable) -> None:
        held = self._in_flight.get(namespace, 0)
        if held >= self._own:
            self._shared_used += 1
        self._in_flight[namespace] = held + 1

    def _release(self, namespace: Hashable) -> None:
        held = self._in_flight[namespace] - 1
        if held >= self._own:
            self._shared_used -= 1
        if held:
            self._in_flight[namespace] = held
        else:
            del self._in_flight[namespace]
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand free slots to waiting fetches, one namespace at a time in turn."""
        granted = True
        while granted and self._waiting:
            granted = False
            for namespace in list(self._waiting):
                if not self._can_take(namespace):
                    continue
                queue = self._waiting.pop(namespace)
                # Waiters cancelled while waiting (their tasks have not run yet) get nothing.
                while queue and queue[0].done():
                    queue.popleft()
                if not queue:
                    continue
                waiter = queue.popleft()
                if queue:
                    self._waiting[namespace] = queue  # to the end of the turn order
                self._take(namespace)
                waiter.set_result(None)
                granted = True
