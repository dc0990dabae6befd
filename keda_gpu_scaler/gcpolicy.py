"""Garbage-collector policy for a long-running server: full collections look at new objects only.

CPython's full collection walks every tracked object of the process while holding the GIL: with 5,000
pods and 500 ScaledObjects followed that is 70-100 ms in which no RPC is answered, once every few tens
of seconds, and the calls queued behind it make the RPC tail (p99 15 ms instead of 4 ms). Almost all of
those objects live as long as the process or change slowly: discovery's pod caches, the registry, the
store's pages. So every full collection that ends freezes what it found alive (gc.freeze: later
collections skip those objects), and the next full collection walks only what was made since.

A frozen object that later becomes part of an unreachable reference cycle is never freed, since no
collection looks at it; objects that die without a cycle are freed by reference counting as always. To
keep that bounded the frozen objects are handed back (gc.unfreeze), and the next full collection walks
everything once and frees such cycles, once every `rescan_every` seconds (one long pause an hour) and
whenever the frozen objects have grown by half since the last such walk: calls that live long enough
to be frozen and then end (a client opening and dropping streams) cannot pile up more than that.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

RESCAN_SECONDS = 3600.0
RESCAN_GROWTH = 1.5  # frozen objects grew this many times since the last walk of everything: walk again


class FreezeAfterFullCollections:
    """A gc callback (gc.callbacks) carrying out the policy above; install() and remove() it."""

    def __init__(
        self,
        rescan_every: float = RESCAN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        growth: float = RESCAN_GROWTH,
    ):
        self._rescan_every = rescan_every
        self._clock = clock
        self._growth = growth
        self._next_rescan = clock() + rescan_every
        self._walked: int | None = None  # frozen objects right after the last walk of everything
        self.freezes = 0
        self.rescans = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info.get("generation") != 2:
            return
        now = self._clock()
        grown = self._walked is not None and gc.get_freeze_count() > self._growth * self._walked
        if now >= self._next_rescan or grown:
            self._next_rescan = now + self._rescan_every
            self._walked = None
            gc.unfreeze()  # the next full collection walks everything, frozen cycles included
            self.rescans += 1
            return
        gc.freeze()  # what this full collection found alive
        self.freezes += 1
        if self._walked is None:
            self._walked = gc.get_freeze_count()

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
