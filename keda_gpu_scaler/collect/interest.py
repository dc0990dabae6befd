"""What a collector asks of the wanted sources (wanted.WantedSources): is a source wanted, and wait until it may be."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

# The key of a collector's sources when none is given for a page (a test's or a tool's lone collector).
SCRAPE_INTEREST = "scrape"


class WantedKeys(Protocol):
    """What a collector asks of interest: is its key wanted, and wait until it may be."""

    def wanted(self, key: Hashable) -> bool: ...

    async def wait_until_wanted(self, timeout: float, key: Hashable) -> None: ...
