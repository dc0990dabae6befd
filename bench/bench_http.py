"""The exporter HTTP client: the lean fetcher (collect/http.py) against aiohttp, CPU per page fetched.

The lean fetcher stays in the product only while this shows it pays: at the realistic size (1,000
exporters) and at 100, in the same run, against aiohttp as a user would set it up and tuned.
"""

from __future__ import annotations

import asyncio
import resource

import aiohttp

from bench.aiohttp_fetcher import AiohttpFetcher
from bench.harness import Section, median, page_server
from keda_gpu_scaler.collect.http import LeanFetcher

TIMEOUT = 5.0
MAX_BYTES = 16 << 20
IN_FLIGHT = 64  # the scaler's default --scrape-concurrency
CLIENTS = {
    "aiohttp, a default session": "aiohttp",
    "aiohttp tuned (no cookie jar, trust_env=False, one timeout, 256 kB reads)": "tuned",
    "lean keep-alive HTTP/1.1 fetcher (collect/http.py, used)": "lean",
}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(kind: str, urls: list[str], rounds: int) -> float:
    """CPU seconds of this process per page, `rounds` rounds over `urls` after one that opens connections."""
    session = None
    fetcher: AiohttpFetcher | LeanFetcher
    if kind == "lean":
        fetcher = LeanFetcher(timeout=TIMEOUT, max_bytes=MAX_BYTES)
    else:
        tuned = {"cookie_jar": aiohttp.DummyCookieJar(), "trust_env": False, "read_bufsize": 256 * 1024}
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=IN_FLIGHT), **(tuned if kind == "tuned" else {})
        )
        fetcher = AiohttpFetcher(session, TIMEOUT, MAX_BYTES)
    semaphore = asyncio.Semaphore(IN_FLIGHT)

    async def one(url: str) -> bytes:
        async with semaphore:
            return await fetcher.get(url)

    try:
        await asyncio.gather(*(one(u) for u in urls))
        started = _cpu()
        for _ in range(rounds):
            await asyncio.gather(*(one(u) for u in urls))
        return (_cpu() - started) / (rounds * len(urls))
    finally:
        fetcher.close()
        if session is not None:
            await session.close()


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
        best_aiohttp = min(medians["aiohttp"], medians["tuned"])
        ratio = medians["lean"] / best_aiohttp
        tables.append(
            f"""### {targets:,} exporters ({rounds} rounds)

| client | µs of CPU per page, per run | median |
|---|---|---|
{chr(10).join(rows)}

Lean ÷ the better aiohttp: **{ratio:.2f}×**.
"""
        )
        headlines.append(
            (
                f"Exporter HTTP client CPU per page, lean ÷ aiohttp, {targets:,} exporters",
                f"{ratio:.2f}×",
                "< 1× (else aiohttp)",
                ratio < 1,
            )
        )
    body = "\n".join(tables)
    return Section(
        f"""## The exporter HTTP client: lean fetcher against aiohttp

CPU time of the benchmark's own process per exporter page fetched (user + system), for each client,
from loopback exporters served by one page server process (unchanged 8-GPU dcgm-exporter pages, ~70 kB,
keep-alive, {IN_FLIGHT} requests in flight as the scaler's default concurrency), after one round that opens
the connections; nothing is parsed. {repeats} runs per client, interleaved. The aiohttp client is
`bench/aiohttp_fetcher.py`: the same contract (no redirects, the body capped after decompression), as a
user of the usual Python client would write it. The lean fetcher is kept in the product while it costs
less CPU per page than the better aiohttp set-up at 1,000 exporters.

{body}""",
        headlines,
    )
