"""The HTTP port under abuse: slow header senders are cut off, repeated errors are logged once per interval."""

from __future__ import annotations

import asyncio
import logging

import pytest

from keda_gpu_scaler import http_endpoints
from keda_gpu_scaler.logs import OncePerInterval


async def test_a_client_trickling_headers_is_disconnected(
    make_scaler, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(http_endpoints, "HTTP_IDLE_SECONDS", 0.5)
    scaler = await make_scaler()
    reader, writer = await asyncio.open_connection("127.0.0.1", scaler.app.http_port)

    async def trickle() -> None:
        # A slowloris: one header byte every 100 ms, never the blank line that ends the headers.
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        while True:
            await asyncio.sleep(0.1)
            writer.write(b"x")
            await writer.drain()

    sender = asyncio.create_task(trickle())
    try:
        # The server closes the connection: read() returns at end of stream instead of waiting forever.
        await asyncio.wait_for(reader.read(), 10)
        assert reader.at_eof()
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        writer.close()


def test_the_same_error_is_printed_once_per_interval_and_counted() -> None:
    now = [0.0]
    limiter = OncePerInterval(interval=10, clock=lambda: now[0])

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, message, None, None)

    printed = [limiter.filter(record("socket.accept() out of system resource")) for _ in range(1000)]
    assert printed.count(True) == 1
    now[0] = 11
    later = record("socket.accept() out of system resource")
    assert limiter.filter(later)
    assert "999 more like it" in str(later.msg)
    assert limiter.filter(record("another error"))
    info = logging.LogRecord(
        "asyncio", logging.INFO, __file__, 1, "socket.accept() out of system resource", None, None
    )
    assert limiter.filter(info)  # below WARNING: never held back
