"""Logging: text or JSON lines, and repeated errors counted rather than printed again and again."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable

# The same error logged again within this many seconds is counted, not printed (see OncePerInterval).
REPEATED_ERROR_SECONDS = 10.0


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class OncePerInterval(logging.Filter):
    """Lets one record of each message through per interval; says how many were held back.

    When file descriptors run out, asyncio logs every failed accept() with a traceback, thousands a
    second: the log would bury everything else and cost CPU that the gRPC answers need.
    """

    def __init__(self, interval: float = REPEATED_ERROR_SECONDS, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self._interval = interval
        self._clock = clock
        self._last: dict[str, tuple[float, int]] = {}  # message → (last printed, held back since)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = str(record.msg)[:200]
        now = self._clock()
        printed, held = self._last.get(key, (float("-inf"), 0))
        if now - printed < self._interval:
            self._last[key] = (printed, held + 1)
            return False
        if len(self._last) > 1000:
            self._last.clear()
        self._last[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} (and {held} more like it in the last {now - printed:.0f}s)"
        return True


def configure_logging(level: str, fmt: str) -> None:
    # asyncio's own errors (accept() failing when descriptors run out) repeat at machine speed.
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, OncePerInterval) for f in asyncio_log.filters):
        asyncio_log.addFilter(OncePerInterval())
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
