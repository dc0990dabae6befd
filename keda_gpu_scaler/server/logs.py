"""Logging: text or JSON lines, and repeated errors counted rather than printed again and again."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable

from aiohttp.http_exceptions import HttpProcessingError

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


class NonHttpClients(OncePerInterval):
    """aiohttp's traceback for a request it cannot parse → one WARNING per client address per interval.

    A gRPC client (HTTP/2 prior knowledge) or a TLS ClientHello on the HTTP port is a client pointed at
    the wrong port, not a fault of the scaler; a traceback per connection would bury the log. Installed
    on aiohttp's `aiohttp.server` logger (quiet_non_http_clients); its other records pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        address = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg = (
            f"a client at {address} sent what is not HTTP/1.1 to the HTTP port (answered 400): a gRPC, HTTP/2"
            f" or TLS client pointed at it by mistake? Said once per address per {self._interval / 60:g}"
            " minutes"
        )
        record.args, record.exc_info, record.exc_text = None, None, None
        return super().filter(record)


def quiet_non_http_clients() -> None:
    """Install NonHttpClients (10 minutes per address) on aiohttp's server logger, once per process."""
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, NonHttpClients) for f in logger.filters):
        logger.addFilter(NonHttpClients(interval=600.0))


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
