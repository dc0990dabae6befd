"""Scrape collector: fetches exporter pages in the background, only while some trigger wants them."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import aiohttp

from keda_gpu_scaler.collect.store import Page, Store
from keda_gpu_scaler.exposition import ExpositionError, parse_exposition
from keda_gpu_scaler.telemetry import Telemetry
from keda_gpu_scaler.vendors import SAMPLE_NAMES, readings_from_samples

log = logging.getLogger(__name__)

# Failures back off exponentially up to this, so a dead exporter is not hammered every interval.
MAX_BACKOFF_SECONDS = 60.0
JITTER = 0.1


class PageTooLarge(Exception):
    pass


# Interest key of the exporters scraped directly (per namespace keys serve the Prometheus source).
SCRAPE_INTEREST = "scrape"


class Interest:
    """Remembers when triggers last asked for each kind of data; collection runs only while that is recent."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._clock = clock
        self._last_touch: dict[Hashable, float] = {}
        self._woken = asyncio.Event()

    def touch(self, key: Hashable = SCRAPE_INTEREST) -> None:
        first = not self.wanted(key)
        self._last_touch[key] = self._clock()
        if first:
            # Start collecting at once rather than at the next idle check.
            woken, self._woken = self._woken, asyncio.Event()
            woken.set()

    def wanted(self, key: Hashable = SCRAPE_INTEREST) -> bool:
        touched = self._last_touch.get(key)
        return touched is not None and self._clock() - touched < self._ttl

    def wanted_keys(self) -> list[Hashable]:
        now = self._clock()
        expired = [k for k, t in self._last_touch.items() if now - t >= self._ttl]
        for key in expired:
            del self._last_touch[key]
        return list(self._last_touch)

    async def wait_until_wanted(self, timeout: float, key: Hashable = SCRAPE_INTEREST) -> None:
        if self.wanted(key):
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._woken.wait(), timeout)


@dataclass(frozen=True, slots=True)
class ScrapeLimits:
    interval: float
    timeout: float
    max_page_bytes: int
    concurrency: int


async def fetch_page(session: aiohttp.ClientSession, url: str, timeout: float, max_bytes: int) -> bytes:
    """GET an exporter page; errors are exceptions whose text says what went wrong."""
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
        if response.status != 200:
            raise aiohttp.ClientResponseError(
                response.request_info, (), status=response.status, message=response.reason or ""
            )
        return await read_limited(response, max_bytes)


async def read_limited(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body, refused once it exceeds max_bytes, so a hostile or broken server cannot fill memory."""
    length = response.content_length
    if length is not None:
        if length > max_bytes:
            raise PageTooLarge(f"{length} bytes; the limit is {max_bytes} (--max-page-bytes)")
        # The length is known and allowed: one read (aiohttp stops at Content-Length).
        return await response.read()
    body = bytearray()
    async for chunk in response.content.iter_chunked(65536):
        body += chunk
        if len(body) > max_bytes:
            raise PageTooLarge(f"more than the limit of {max_bytes} bytes (--max-page-bytes)")
    return bytes(body)


def describe_error(error: BaseException, timeout: float) -> str:
    if isinstance(error, ExpositionError):
        return f"not a valid metrics page: {error}"
    if isinstance(error, TimeoutError):
        return f"timed out after {timeout:g}s"
    if isinstance(error, aiohttp.ClientResponseError):
        return f"HTTP {error.status} {error.message}".strip()
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


class ScrapeCollector:
    """One task per exporter URL: scrape, parse only the wanted families, normalise, store."""

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        store: Store,
        interest: Interest,
        limits: ScrapeLimits,
        telemetry: Telemetry,
        clock: Callable[[], float],
    ) -> None:
        self._session = session
        self._store = store
        self._interest = interest
        self._limits = limits
        self._telemetry = telemetry
        self._clock = clock
        self._semaphore = asyncio.Semaphore(limits.concurrency)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._last: dict[str, tuple[bytes, Page]] = {}  # url → digest of the last good page, and its page

    def add(self, url: str) -> None:
        if url in self._tasks:
            return
        self._store.add_source(url)
        self._tasks[url] = asyncio.create_task(self._run(url), name=f"scrape {url}")

    def remove(self, url: str) -> None:
        """Stop scraping url and forget its data (discovery: no target pod runs on its node any more)."""
        task = self._tasks.pop(url, None)
        if task is not None:
            task.cancel()
        self._last.pop(url, None)
        self._store.remove_source(url)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def scrape_once(self, url: str) -> bool:
        """Scrape one exporter now; records the page or the failure in the store. True on success."""
        started = self._clock()
        try:
            async with self._semaphore:
                body = await fetch_page(self._session, url, self._limits.timeout, self._limits.max_page_bytes)
            # dcgm-exporter refreshes every 30 s: most scrapes return the very page parsed last time, and
            # then only its age changes. A digest (not the bytes) keeps 1,000 exporters' memory small;
            # SHA-256 because CPUs hash it in hardware (about 2x faster than BLAKE2 here).
            digest = hashlib.sha256(body).digest()
            previous = self._last.get(url)
            if previous is not None and previous[0] == digest:
                page = Page(url, self._clock(), previous[1].by_namespace)
            else:
                samples = parse_exposition(body, SAMPLE_NAMES)
                page = Page.from_readings(url, self._clock(), readings_from_samples(samples))
            self._last[url] = (digest, page)
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError, PageTooLarge, ExpositionError) as error:
            message = describe_error(error, self._limits.timeout)
            self._store.record_failure(url, message)
            self._telemetry.scrape_done(ok=False, seconds=self._clock() - started)
            log.warning("scrape of %s failed: %s", url, message)
            return False
        self._store.record_page(page)
        self._telemetry.scrape_done(ok=True, seconds=self._clock() - started)
        return True

    async def _run(self, url: str) -> None:
        interval = self._limits.interval
        failures = 0
        spread = True
        while True:
            await self._interest.wait_until_wanted(timeout=interval)
            if not self._interest.wanted():
                spread = True
                continue
            ok = await self.scrape_once(url)
            failures = 0 if ok else failures + 1
            delay = (
                interval if ok else min(interval * 2 ** (failures - 1), max(MAX_BACKOFF_SECONDS, interval))
            )
            # Jitter only shortens the wait: data must never be older than one interval because of it.
            # When interest starts, every exporter is scraped at once (data at once); the wait after that
            # first scrape is drawn from the whole interval, so later rounds are spread out, not bursts.
            await asyncio.sleep(delay * random.uniform(0 if spread else 1 - JITTER, 1))
            spread = False
