"""The sources' HTTP client (collect/http.py over aiohttp): CPU per page fetched, and what its limits add.

Every page GET goes through `PageFetcher` over the app's one aiohttp session. Measured against the same
session used as a user of aiohttp would (`session.get`, `read()`): the difference is what the limits
(the size cap counted after decompression, no redirects, the final-newline check, the error mapping) cost.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Awaitable, Callable

import aiohttp

from bench.harness import Section, median, page_server
from keda_gpu_scaler.collect.http import PAGE_HEADERS, PageFetcher, client_session

TIMEOUT = 5.0
MAX_BYTES = 16 << 20
IN_FLIGHT = 64  # the scaler's default --scrape-concurrency
CLIENTS = {
    "the scaler's fetcher (collect/http.py: PageFetcher, used)": "product",
    "the same session, `session.get` and `read()` (no limits)": "bare",
}
# What the limits may add to the fetch of a page, at most.
GOAL = 1.1


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _getter(kind: str, session: aiohttp.ClientSession) -> Callable[[str], Awaitable[bytes]]:
    if kind == "product":
        return PageFetcher(session, timeout=TIMEOUT, max_bytes=MAX_BYTES).get
    timeout = aiohttp.ClientTimeout(total=TIMEOUT)

    async def bare(url: str) -> bytes:
        async with session.get(url, headers=PAGE_HEADERS, timeout=timeout) as response:
            return await response.read()

    return bare


async def measure(kind: str, urls: list[str], rounds: int) -> float:
    """CPU seconds of this process per page, `rounds` rounds over `urls` after one that opens connections."""
    semaphore = asyncio.Semaphore(IN_FLIGHT)
    async with client_session() as session:
        get = _getter(kind, session)

        async def one(url: str) -> bytes:
            async with semaphore:
                return await get(url)

        await asyncio.gather(*(one(u) for u in urls))
        started = _cpu()
        for _ in range(rounds):
            await asyncio.gather(*(one(u) for u in urls))
        return (_cpu() - started) / (rounds * len(urls))


async def run(quick: bool = False) -> Section:
    sizes = (100, 1000) if not quick else (20,)
    repeats = 3 if not quick else 1
    pages_per_run = 10_000 if not quick else 200
    tables = []
    headlines: list[tuple[str, str, str, bool | None]] = []
    for targets in sizes:
        rounds = max(1, pages_per_run // targets)
        medians: dict[str, float] = {}
        rows = []
        async with page_server(targets) as pages:
            urls = [pages.url(i) for i in range(targets)]
            runs: dict[str, list[float]] = {kind: [] for kind in CLIENTS.values()}
            for _ in range(repeats):  # interleaved: a drift of the machine touches every client alike
                for kind in CLIENTS.values():
                    runs[kind].append(await measure(kind, urls, rounds))
        for label, kind in CLIENTS.items():
            medians[kind] = median(runs[kind])
            cells = ", ".join(f"{1e6 * r:.0f}" for r in runs[kind])
            rows.append(f"| {label} | {cells} | **{1e6 * medians[kind]:.0f}** |")
        ratio = medians["product"] / medians["bare"]
        tables.append(
            f"""### {targets:,} exporters ({rounds} rounds)

| client | µs of CPU per page, per run | median |
|---|---|---|
{chr(10).join(rows)}

The scaler's fetcher ÷ the bare session: **{ratio:.2f}×**.
"""
        )
        headlines.append(
            (
                f"Exporter HTTP client CPU per page, the scaler's fetcher ÷ bare aiohttp, {targets:,} exporters",
                f"{ratio:.2f}× ({1e6 * medians['product']:.0f} µs)",
                f"≤ {GOAL:g}×",
                ratio <= GOAL,
            )
        )
    body = "\n".join(tables)
    return Section(
        f"""## The sources' HTTP client

CPU time of the benchmark's own process per exporter page fetched (user + system), from loopback
exporters served by one page server process (unchanged 8-GPU dcgm-exporter pages, ~70 kB, keep-alive,
{IN_FLIGHT} requests in flight as the scaler's default concurrency), after one round that opens the
connections; nothing is parsed. {repeats} runs per client, interleaved. Both clients use the session the
scaler makes (`client_session()`); the bare one reads the body with `session.get` and `read()`, without
the limits the scaler's `PageFetcher` applies (the size cap after decompression, no redirects, a page
that does not end its last line refused, every failure one `FetchError`).

{body}""",
        headlines,
    )
