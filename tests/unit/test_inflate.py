"""Compressed pages: inflated linearly, within the fetch's deadline, in page workers of their own."""

from __future__ import annotations

import asyncio
import gzip
import random
import threading
import time
import zlib
from typing import Any

import aiohttp
import pytest
from support import eventually
from test_page_fetch import raw_server
from test_scrape import PAGE, page_fetcher, session

from keda_gpu_scaler.collect import http
from keda_gpu_scaler.collect.http import MAX_GZIP_MEMBERS, FetchError, inflate

__all__ = ["session"]  # the fixture the fetches here run with (the app's one HTTP session)

# An empty gzip member: 20 bytes that inflate to nothing.
EMPTY_MEMBER = gzip.compress(b"")


def gzip_reply(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def test_inflate_reads_what_zlib_reads() -> None:
    # More than one input step of incompressible bytes, a real page, an empty member: as gzip reads them.
    noise = random.Random(7).randbytes(3 * http.INFLATE_INPUT_STEP)
    members = [noise, PAGE.encode(), b"", PAGE.encode() * 50]
    body = b"".join(gzip.compress(member) for member in members)
    whole = gzip.decompress(body)
    assert inflate(body, "gzip", len(whole)) == whole
    assert inflate(zlib.compress(noise + PAGE.encode()), "deflate", 1 << 20) == noise + PAGE.encode()
    with pytest.raises(FetchError, match="limit of"):
        inflate(body, "gzip", len(whole) - 1)
    with pytest.raises(FetchError, match="truncated"):
        inflate(body[:-5], "gzip", len(whole))
    with pytest.raises(FetchError, match="after the end of the deflate body"):
        inflate(zlib.compress(b"a") + b"x", "deflate", 10)


def test_a_body_of_many_empty_gzip_members_is_refused_after_the_member_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 100,000 empty members (2 MB) once cost 3 s of CPU: each member copied the rest of the body.
    decoders: list[int] = []
    real = zlib.decompressobj

    def counting(*args: Any) -> Any:
        decoders.append(1)
        return real(*args)

    monkeypatch.setattr(http.zlib, "decompressobj", counting)
    assert inflate(EMPTY_MEMBER * MAX_GZIP_MEMBERS, "gzip", 1 << 20) == b""
    decoders.clear()
    with pytest.raises(FetchError, match=f"more than {MAX_GZIP_MEMBERS} gzip members in one body"):
        inflate(EMPTY_MEMBER * 100_000, "gzip", 4 << 20)
    assert len(decoders) == MAX_GZIP_MEMBERS


def test_inflating_stops_at_the_deadline() -> None:
    with pytest.raises(TimeoutError):
        inflate(gzip.compress(PAGE.encode()), "gzip", 1 << 20, deadline=time.monotonic() - 1)


class HeldInflater:
    """http.inflate that waits until released: a hostile page's inflation, running as long as a test needs."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.running = 0
        self._real = http.inflate

    def __call__(self, *args: Any) -> bytes:
        self.running += 1
        self.release.wait(60)
        return self._real(*args)


async def test_the_time_spent_inflating_counts_against_the_fetch_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held = HeldInflater()
    monkeypatch.setattr(http, "inflate", held)

    async def answer(_: bytes, __: int) -> bytes:
        return gzip_reply(gzip.compress(PAGE.encode()))

    server, url, _ = await raw_server(answer)
    try:
        fetch = asyncio.ensure_future(page_fetcher(timeout=0.5).get(url))
        # Failed by its timeout while the inflation still runs, not once it ends.
        with pytest.raises(FetchError, match=r"timed out after 0\.5s"):
            await asyncio.wait_for(fetch, 30)
        assert held.running == 1 and not held.release.is_set()
    finally:
        held.release.set()
        server.close()


async def test_metrics_answer_while_hostile_pages_are_inflating(
    make_scaler, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    # Six pods of one tenant serving bodies of empty gzip members held every thread of the default pool
    # for minutes, and /metrics (rendered there) timed out.
    held = HeldInflater()
    monkeypatch.setattr(http, "inflate", held)
    scaler = await make_scaler()

    async def answer(_: bytes, __: int) -> bytes:
        return gzip_reply(EMPTY_MEMBER * 10_000)

    server, url, _ = await raw_server(answer)
    fetcher = page_fetcher(timeout=60.0)
    hostile = [asyncio.ensure_future(fetcher.get(url)) for _ in range(40)]
    try:

        async def inflating() -> None:
            assert held.running >= 1

        await eventually(inflating)
        # (The bound only ends the test when /metrics never answers.)
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client,
            client.get(f"http://127.0.0.1:{scaler.app.http_port}/metrics") as response,
        ):
            assert response.status == 200
            assert b"# HELP" in await response.read()
        assert not any(fetch.done() for fetch in hostile)
    finally:
        held.release.set()
        results = await asyncio.gather(*hostile, return_exceptions=True)
        server.close()
    assert all("more than 64 gzip members" in str(result) for result in results), results[:1]
