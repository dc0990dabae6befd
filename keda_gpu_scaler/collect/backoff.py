"""Retry delays: one capped exponential backoff for every loop that retries (scrapes, queries, watches)."""

from __future__ import annotations

import random

# Jitter only ever shortens a wait, so data is never older than one interval because of it.
JITTER = 0.1
# A failing page or upstream is retried after 1, 2, then 3 intervals at most: it is spared (no query
# storm at a Prometheus that is down), and a recovery is seen within about two intervals.
MAX_BACKOFF_INTERVALS = 3.0


def backoff_delay(failures: int, *, first: float, cap: float) -> float:
    """Seconds to wait after `failures` consecutive failures: first, 2×first, 4×first … never above cap.

    The exponent is bounded before it is raised, so a source that fails for days neither overflows a
    float (2.0 ** 1025 does) nor waits longer than `cap`. `failures` <= 0 means "no failure": `first`.
    """
    if not first > 0 or not cap > 0:
        raise ValueError(f"backoff needs first > 0 and cap > 0, got first={first!r}, cap={cap!r}")
    doublings = 0
    limit = cap / first
    while doublings < max(failures - 1, 0) and 2.0**doublings < limit:
        doublings += 1
    return min(first * 2.0**doublings, cap)


def jittered(delay: float, spread: float = JITTER) -> float:
    """delay shortened by up to `spread` of itself (spread=1: anywhere in [0, delay])."""
    return delay * random.uniform(1 - spread, 1)
