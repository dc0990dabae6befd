"""Interest: which kinds of data some trigger asked for recently; collectors run only while it is recent."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Hashable
from typing import Protocol

# Interest key of the exporters scraped directly (per-namespace keys serve the Prometheus source).
SCRAPE_INTEREST = "scrape"


class WantedKeys(Protocol):
    """What a collector asks of interest: is its key wanted, and wait until it may be."""

    def wanted(self, key: Hashable = SCRAPE_INTEREST) -> bool: ...

    async def wait_until_wanted(self, timeout: float, key: Hashable = SCRAPE_INTEREST) -> None: ...


class Interest:
    """Remembers when each key was last touched; a key is wanted for `ttl` seconds after that.

    Keys are opaque (any hashable): whoever decides what is wanted (the calls, a registry of ScaledObjects)
    touches them, collectors ask wanted() / wait_until_wanted() and otherwise stay idle.
    """

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._clock = clock
        self._last_touch: dict[Hashable, float] = {}
        self._woken = asyncio.Event()

    def touch(self, key: Hashable = SCRAPE_INTEREST) -> None:
        first = not self.wanted(key)
        self._last_touch[key] = self._clock()
        if first:
            # Start collecting at once rather than at the next idle check.
            woken, self._woken = self._woken, asyncio.Event()
            woken.set()

    def wanted(self, key: Hashable = SCRAPE_INTEREST) -> bool:
        touched = self._last_touch.get(key)
        return touched is not None and self._clock() - touched < self._ttl

    def wanted_keys(self) -> list[Hashable]:
        now = self._clock()
        expired = [k for k, t in self._last_touch.items() if now - t >= self._ttl]
        for key in expired:
            del self._last_touch[key]
        return list(self._last_touch)

    async def wait_until_wanted(self, timeout: float, key: Hashable = SCRAPE_INTEREST) -> None:
        """Return once `key` is wanted, when any key becomes newly wanted, or after `timeout`."""
        if self.wanted(key):
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._woken.wait(), timeout)
