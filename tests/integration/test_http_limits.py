"""The HTTP port under abuse: slow header senders are cut off, repeated errors are logged once per interval."""

from __future__ import annotations

import asyncio
import logging
import ssl

import pytest

from keda_gpu_scaler.server import http_endpoints
from keda_gpu_scaler.server.logs import OncePerInterval


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


def tls_client_hello() -> bytes:
    """The first bytes a TLS client sends (its ClientHello), made by Python's own TLS stack."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="scaler")
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


async def test_grpc_and_tls_clients_on_the_http_port_get_one_warning_per_address_and_no_traceback(
    make_scaler, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler()
    caplog.set_level(logging.DEBUG)
    h2_preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")  # + SETTINGS
    for opening in [h2_preface] * 100 + [tls_client_hello()] * 100:
        reader, writer = await asyncio.open_connection("127.0.0.1", scaler.app.http_port)
        writer.write(opening)
        await writer.drain()
        await asyncio.wait_for(reader.read(), 10)  # the server answers 400 and closes: end of stream
        writer.close()
    # The same port still serves HTTP/1.1.
    reader, writer = await asyncio.open_connection("127.0.0.1", scaler.app.http_port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.1 200")
    writer.close()
    server = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert not [r for r in caplog.records if r.exc_info or r.exc_text], server[:2]
    warnings = [r.getMessage() for r in server if r.levelno == logging.WARNING]
    # At most one: the filter is the process's, and an earlier test may have had it say so already.
    assert len(warnings) <= 1 and all("127.0.0.1" in w for w in warnings), warnings
