"""The page fetcher over aiohttp against raw loopback servers: framing, keep-alive, cut bodies, failures."""

from __future__ import annotations

import asyncio
import gc
import gzip
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable

import pytest
from support import GpuLine, dcgm_page, eventually
from test_scrape import PAGE, TRUNCATED_GZIP, Rig, page_fetcher, session

from keda_gpu_scaler.collect import http
from keda_gpu_scaler.collect.http import FetchError

__all__ = ["session"]  # the fixture every test here runs with (the app's one HTTP session)


async def raw_server(
    answer: Callable[[bytes, int], Awaitable[bytes | None]], *, close_after_reply: bool = False
) -> tuple[asyncio.Server, str, list[int]]:
    """A TCP server answering each request with answer(request, its index on the connection) bytes
    (None: close the connection instead; close_after_reply: close it after each reply)."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            for index in range(1_000_000):
                request = await reader.readuntil(b"\r\n\r\n")
                reply = await answer(request, index)
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
                if close_after_reply:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/metrics", connections


def chunked(body: bytes, size: int = 1000) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-Trailer: 1\r\n\r\n"


async def test_the_fetcher_reads_chunked_gzip_and_deflate_and_keeps_the_connection() -> None:
    body = PAGE.encode()
    replies = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(body),
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunked(gzip.compress(body), 7),
        b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: %d\r\n\r\n"
        % len(zlib.compress(body))
        + zlib.compress(body),
        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body,
    ]

    async def answer(_: bytes, __: int) -> bytes:
        return replies.pop(0)

    server, url, connections = await raw_server(answer)
    fetcher = page_fetcher()
    try:
        for _ in range(4):
            assert await fetcher.get(url) == body
        assert len(connections) == 1, "one kept-alive connection for every scrape"
    finally:
        server.close()


async def test_idle_kept_connections_hold_no_page() -> None:
    # Each kept connection once held its last page twice: 70 MB each way for 1,000 exporters of 70 kB
    # pages. The HTTP client holds at most the page just returned, not one per kept connection.
    body = b"x" * ((2 << 20) - 1) + b"\n"

    async def answer(_: bytes, __: int) -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    servers = [await raw_server(answer) for _ in range(4)]
    fetcher = page_fetcher(timeout=5.0, max_bytes=8 << 20)
    tracemalloc.start()
    try:
        for _, url, _ in servers:
            page = await fetcher.get(url)
            assert len(page) == len(body)
            del page
        gc.collect()
        held = sum(
            stat.size
            for stat in tracemalloc.take_snapshot().statistics("filename")
            if stat.traceback[0].filename.endswith("collect/http.py")
            or "site-packages/aiohttp/" in stat.traceback[0].filename
        )
        for _, url, _ in servers:  # the kept connections are used again
            assert len(await fetcher.get(url)) == len(body)
        assert all(len(connections) == 1 for _, _, connections in servers), "the connections are kept"
        assert held < 1.5 * len(body), f"{held:,} bytes still held by the HTTP client and its connections"
    finally:
        tracemalloc.stop()
        for server, _, _ in servers:
            server.close()


async def test_a_large_body_is_joined_off_the_loop(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # 15 MiB of fresh memory filled on the loop held every RPC for ~10 ms (its page faults).
    joined_off_loop: list[int] = []
    real = http.in_page_worker

    async def recording(func, *args):  # type: ignore[no-untyped-def]
        if func == b"".join:
            joined_off_loop.append(sum(len(piece) for piece in args[0]))
        return await real(func, *args)

    monkeypatch.setattr(http, "in_page_worker", recording)
    small, large = PAGE.encode(), b"x" * http.JOIN_OFF_LOOP_BYTES + b"\n"

    async def answer(_: bytes, index: int) -> bytes:
        body = small if index == 0 else large
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    server, url, _ = await raw_server(answer)
    fetcher = page_fetcher(timeout=5.0, max_bytes=4 << 20)
    try:
        assert await fetcher.get(url) == small
        assert await fetcher.get(url) == large
        assert joined_off_loop == [len(large)]
    finally:
        server.close()


async def test_the_fetcher_asks_again_when_the_server_closed_the_kept_connection() -> None:
    body = PAGE.encode()

    async def answer(_: bytes, index: int) -> bytes | None:
        # Each connection answers its first request; a second one finds it closed (an idle timeout).
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body if index == 0 else None

    server, url, connections = await raw_server(answer)
    fetcher = page_fetcher()
    try:
        assert await fetcher.get(url) == body
        assert await fetcher.get(url) == body
        assert len(connections) == 2
    finally:
        server.close()


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\nabc", "received 3 of 100000 bytes"),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not a valid HTTP/1.x answer"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 1\r\n\r\nx",
            "unsupported Content-Encoding",
        ),
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", "HTTP 404 Not Found"),
        (
            b"HTTP/1.1 301 Moved\r\nLocation: http://elsewhere/\r\nContent-Length: 0\r\n\r\n",
            "http://elsewhere/",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n", "limit is 1048576"),
        # str.isdigit() is true for "²": the status and the length must be ASCII digits.
        ("HTTP/1.1 2²0 OK\r\nContent-Length: 0\r\n\r\n".encode("latin-1"), "Invalid status code"),
        ("HTTP/1.1 200 OK\r\nContent-Length: ²\r\n\r\n".encode("latin-1"), "Content-Length"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 12\r\n\r\nnot gzip at all"[:-3],
            "not valid gzip",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: 9\r\n\r\nnot zlib!",
            "not valid deflate",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
            % (len(TRUNCATED_GZIP), TRUNCATED_GZIP),
            "gzip body ends before its end of stream (truncated)",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nConnection: close\r\n\r\n" + TRUNCATED_GZIP,
            "gzip body ends before its end of stream (truncated)",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\xd9\xa1\r\nx\r\n0\r\n\r\n",
            "chunk size",
        ),
    ],
    ids=[
        "cut short",
        "not http",
        "bad chunk",
        "brotli",
        "404",
        "redirect",
        "too long",
        "status with a superscript digit",
        "length with a superscript digit",
        "gzip that is not gzip",
        "deflate that is not deflate",
        "gzip cut short within its length",
        "gzip cut short by the close",
        "chunk size in arabic-indic digits",
    ],
)
async def test_fetch_failures_name_the_reason(reply: bytes, reason: str) -> None:
    async def answer(_: bytes, index: int) -> bytes | None:
        return reply if index == 0 else None  # then the connection is closed

    server, url, _ = await raw_server(answer, close_after_reply=True)
    rig = Rig()
    try:
        assert not await rig.collector.scrape_once(url)
        error = rig.error(url)
        assert error is not None and reason in error, error
    finally:
        server.close()


# ---- issue 31 item 6: a page that does not end its last line was cut short -----------------------------

# vllm-1's utilisation is 12 %; the body ends inside "12", with no final newline.
CUT_PAGE = dcgm_page([GpuLine("llm", "vllm-0", 30), GpuLine("llm", "vllm-1", 12, gpu=1)]).encode()
CUT_PAGE = CUT_PAGE[: CUT_PAGE.index(b'pod="vllm-1"} 12') + len(b'pod="vllm-1"} 1')]


@pytest.mark.parametrize(
    "framing",
    [
        b"Connection: close\r\n\r\n" + CUT_PAGE,  # read to the close: nothing else tells it was cut
        b"Content-Length: %d\r\n\r\n" % len(CUT_PAGE) + CUT_PAGE,
        b"Transfer-Encoding: chunked\r\n\r\n" + chunked(CUT_PAGE),
    ],
    ids=["read to the close", "content-length", "chunked"],
)
async def test_a_page_cut_inside_a_number_is_a_failed_source_not_a_smaller_number(framing: bytes) -> None:
    async def answer(_: bytes, __: int) -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" + framing

    server, url, _ = await raw_server(answer, close_after_reply=True)
    rig = Rig()
    try:
        assert not await rig.collector.scrape_once(url)
        error = rig.error(url)
        assert error is not None and "truncated" in error, error
        (state,) = rig.store.sources()
        assert state.last_page is None
    finally:
        server.close()


async def test_a_malformed_answer_is_recorded_and_the_fixed_exporter_is_read_at_the_next_scrape(
    caplog,
) -> None:  # type: ignore[no-untyped-def]
    import logging

    body = PAGE.encode()
    good = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    current = {"reply": "HTTP/1.1 200 OK\r\nContent-Length: ²\r\n\r\n".encode("latin-1")}

    async def answer(_: bytes, __: int) -> bytes:
        return current["reply"]

    server, url, _ = await raw_server(answer, close_after_reply=True)
    rig = Rig()
    caplog.set_level(logging.ERROR, logger="keda_gpu_scaler.collect.supervise")
    rig.collector.add(url)
    task = rig.collector._tasks[url]
    try:

        async def failure_recorded() -> None:
            assert "Invalid character in Content-Length" in (rig.error(url) or "")

        await eventually(failure_recorded)
        current["reply"] = good

        async def read_again() -> None:
            assert rig.error(url) is None
            assert rig.pods(url) == {"vllm-0", "vllm-1"}

        await eventually(read_again)
        # The scrape loop went on: no restart, whose backoff would have delayed the recovery.
        assert rig.collector._tasks[url] is task and not task.done()
        assert not [r for r in caplog.records if "restarting" in r.getMessage()]
    finally:
        await rig.collector.stop()
        server.close()


async def test_a_fetch_times_out_and_the_next_one_is_answered() -> None:
    body = PAGE.encode()
    requests: list[int] = []

    async def answer(_: bytes, __: int) -> bytes | None:
        requests.append(1)
        if len(requests) == 1:
            await asyncio.sleep(5)  # past the timeout: the connection is given up
            return None
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    server, url, connections = await raw_server(answer)
    fetcher = page_fetcher(timeout=0.2)
    try:
        with pytest.raises(FetchError, match=r"timed out after 0\.2s"):
            await fetcher.get(url)
        assert await fetcher.get(url) == body
        assert len(connections) == 2, "the connection that timed out is never used again"
    finally:
        server.close()


async def test_a_gzip_page_cut_short_is_a_failed_source_not_a_lower_value() -> None:
    # The stream ends right after the "9" of vllm-1's 97 % and is flushed up to there: inflated, it reads
    # as a valid page with vllm-1 at 9 %. Only the missing end of the gzip stream tells it was cut.
    page = dcgm_page([GpuLine("llm", "vllm-0", 37), GpuLine("llm", "vllm-1", 97, gpu=1)]).encode()
    cut = page.index(b'pod="vllm-1"} 97') + len(b'pod="vllm-1"} 9')
    compressor = zlib.compressobj(wbits=31)
    body = compressor.compress(page[:cut]) + compressor.flush(zlib.Z_SYNC_FLUSH)
    assert zlib.decompressobj(31).decompress(body) == page[:cut]

    async def answer(_: bytes, __: int) -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    server, url, _ = await raw_server(answer)
    rig = Rig()
    try:
        assert not await rig.collector.scrape_once(url)
        error = rig.error(url)
        assert error is not None and "truncated" in error, error
        (state,) = rig.store.sources()
        assert state.last_page is None
    finally:
        server.close()


# ---- a body in pieces of a few bytes: each piece costs the event loop a parser call and a read ----------


async def test_a_body_of_endless_one_byte_chunks_is_refused_for_its_pieces_not_read_to_the_limit() -> None:
    # 1-byte chunks cost 6 bytes on the wire each: the body stays under --max-page-bytes for the whole
    # timeout while every chunk costs the loop as much as a 4 KiB one.
    sent: list[int] = []
    limit = 1 << 20

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            while sum(sent) <= 2 * limit:  # without a refusal, the page would end too large
                writer.write(b"1\r\nx\r\n" * 10_000)
                sent.append(10_000)
                await writer.drain()
            await reader.read()  # until the client closes
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"
    try:
        with pytest.raises(FetchError) as refused:
            await page_fetcher(timeout=30.0, max_bytes=limit).get(url)
        assert "pieces" in str(refused.value), refused.value
        assert sum(sent) < limit, "refused long before the body reached the size limit"
    finally:
        server.close()


@pytest.mark.parametrize(
    ("body", "size"),
    [
        # A server that sends each line as a chunk of its own (a streaming response per line).
        (dcgm_page([GpuLine("llm", f"vllm-{i}", 50, gpu=i % 8) for i in range(3000)]).encode(), 0),
        # 15 MiB in chunks of 4 KiB, as Go's net/http sends a page.
        (b"DCGM_FI_DEV_GPU_UTIL 1\n" * (15 * (1 << 20) // 23), 4096),
    ],
    ids=["a chunk per line", "15 MiB in 4 KiB chunks"],
)
async def test_pages_in_chunks_of_real_servers_are_read(body: bytes, size: int) -> None:
    if size:
        framed = chunked(body, size)
    else:
        lines = body.splitlines(keepends=True)
        framed = b"".join(b"%x\r\n%s\r\n" % (len(line), line) for line in lines) + b"0\r\n\r\n"

    async def answer(_: bytes, __: int) -> bytes:
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + framed

    server, url, _ = await raw_server(answer)
    try:
        assert await page_fetcher(timeout=30.0, max_bytes=16 << 20).get(url) == body
    finally:
        server.close()


async def test_answers_without_a_body_read_empty_every_time(session) -> None:  # type: ignore[no-untyped-def]
    # aiohttp gives every answer without a body one shared empty stream, which after its first read says
    # "end of a chunk" for ever: reading piece by piece must still end.
    async def answer(_: bytes, __: int) -> bytes:
        return b"HTTP/1.1 204 No Content\r\n\r\n"

    server, url, _ = await raw_server(answer)
    try:
        for _ in range(3):
            answered = await http.request(session, url, timeout=5.0, max_bytes=100)
            assert (answered.status, answered.body) == (204, b"")
    finally:
        server.close()
