"""Scrape collector: fetches exporter pages in the background, only while some trigger wants them."""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import xxhash

from keda_gpu_scaler.collect.backoff import JITTER, MAX_BACKOFF_INTERVALS, backoff_delay, jittered
from keda_gpu_scaler.collect.fairshare import FairSlots
from keda_gpu_scaler.collect.http import FetchError, PageRefused
from keda_gpu_scaler.collect.interest import SCRAPE_INTEREST, WantedKeys
from keda_gpu_scaler.collect.page_workers import PAGE_OWNER, in_page_worker
from keda_gpu_scaler.collect.store import Page, Store
from keda_gpu_scaler.collect.supervise import cancel_all, supervised
from keda_gpu_scaler.core.snapshot import Reading, SourceKind
from keda_gpu_scaler.pages import exposition
from keda_gpu_scaler.pages.exposition import ExpositionError, Sample
from keda_gpu_scaler.pages.vendors import SAMPLE_NAMES, readings_from_samples
from keda_gpu_scaler.telemetry import Telemetry

log = logging.getLogger(__name__)

# What one page may contribute: more series of the wanted families than this is a failed scrape. A
# dcgm-exporter page of an 8-GPU node has ~40 of them, an 8-engine vLLM pod a few dozen; 20,000 is far
# beyond any real node or pod. The parse stops at the limit, so a hostile page costs the loop (which
# shares the interpreter with the parsing thread) a bounded time, not the 12 s of 150,000 series.
MAX_SERIES_PER_PAGE = 20_000
# Pages larger than this are hashed and parsed in a worker thread: the event loop answers every RPC. A
# parse costs per series of the wanted families (about 12 µs each), not per byte: 256 kB of short lines
# a tenant's own server prints held the loop 80 ms a page, a dozen such pods over a second for every
# tenant. Under 16 kB (445 series at most, 6 ms) a page is cheaper on the loop than the
# hand-off to a thread; real exporter and engine pages are larger and go to the thread.
PARSE_OFF_LOOP_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class PageReader:
    """What a scraped page is read for: the sample names kept, how they become readings, and which of
    those names make a page one of ours. A page that holds none of `valid_names` is a failed scrape
    ("no {what} on this page"): a wrong port, the scaler's own /metrics or a JSON page must not read
    as a fleet with no pods, which would be a made-up 0."""

    names: frozenset[str]
    # GPU readings for exporter pages; one PodSamples for an inference pod's page (anything with a namespace).
    # None where read_body reads the page instead.
    readings: Callable[[Sequence[Sample]], Iterable[Reading]] | None
    valid_names: frozenset[str]
    what: str
    # Why the page as a whole cannot be used although its samples parse (None: it can), e.g. a family
    # the page declares as a counter where a level is read: the parser skips `# TYPE` lines.
    refuse: Callable[[bytes], str | None] | None = None
    # Readers that read a family of the body themselves (a gateway's queue: 10,000 series summed in one
    # pass): given the body and the samples of `names`, they replace `readings` and decide themselves
    # whether the page is theirs (raising NotOurPage), so `valid_names` is not looked at.
    read_body: Callable[[bytes, Sequence[Sample]], Iterable[Reading]] | None = None

    def __post_init__(self) -> None:
        if (self.readings is None) == (self.read_body is None):
            raise ValueError("a PageReader reads a page either from its samples or from its body, not both")


GPU_EXPORTER_PAGES = PageReader(SAMPLE_NAMES, readings_from_samples, SAMPLE_NAMES, "GPU exporter metrics")


def refuse_unless_levels(
    wrong_types: Callable[[bytes], Mapping[str, str]], needed: str
) -> Callable[[bytes], str | None]:
    """A PageReader.refuse for pages whose families are read as levels: a page declaring one of them as
    anything else (`# TYPE name counter`) is refused naming it. `wrong_types`: page → {family: type}
    of those declared otherwise; `needed`: what the message says the family must be."""

    def refuse(body: bytes) -> str | None:
        wrong = wrong_types(body)
        if not wrong:
            return None
        named = ", ".join(f"{name} is a {kind}" for name, kind in sorted(wrong.items()))
        return f"the page declares {named}; {needed}"

    return refuse


class NotOurPage(PageRefused):
    pass


@dataclass(frozen=True, slots=True)
class ScrapeLimits:
    interval: float
    timeout: float
    max_page_bytes: int
    concurrency: int


class Fetcher(Protocol):
    """GETs exporter pages: the body of a 200 answer, or a FetchError saying why there is none (the
    connections are the session's: its owner, the app, closes them)."""

    async def get(self, url: str) -> bytes: ...


def parse_exposition(page: bytes, names: frozenset[str]) -> list[Sample]:
    """The scrape path's parse: at most MAX_SERIES_PER_PAGE series, conflicting duplicates refused.

    One series printed twice with different values fails the page: either value could be the wrong one,
    and a wrong value can scale a busy workload down; a failed page makes its pods missing (SPEC §4).
    """
    return exposition.parse_exposition(page, names, max_samples=MAX_SERIES_PER_PAGE, reject_conflicts=True)


def read_page(body: bytes, reader: PageReader) -> dict[str, tuple[Reading, ...]]:
    """A page's readings by namespace (runs on the loop or in a worker thread)."""
    # A reader wanting no family from the general parser (a gateway's) skips its pass over the page.
    samples = parse_exposition(body, reader.names) if reader.names else []
    if reader.read_body is None and not any(sample.name in reader.valid_names for sample in samples):
        raise NotOurPage(f"no {reader.what} on this page")
    if reader.refuse is not None and (why := reader.refuse(body)) is not None:
        raise NotOurPage(why)
    if reader.read_body is not None:
        readings = reader.read_body(body, samples)
    else:
        assert reader.readings is not None  # one of the two (PageReader.__post_init__)
        readings = reader.readings(samples)
    grouped: defaultdict[str, list[Reading]] = defaultdict(list)
    for reading in readings:
        grouped[reading.namespace].append(reading)
    exposition.release_in_slices(samples)
    return {ns: tuple(rs) for ns, rs in grouped.items()}


ByNamespace = dict[str, tuple[Reading, ...]]

_DIGEST_SEED = secrets.randbits(64)


def digest_and_read(
    body: bytes,
    previous: tuple[bytes, Page] | None,
    reader: PageReader,
    digest: bytes | None = None,
) -> tuple[bytes, ByNamespace]:
    """The page's digest (`digest` when already worked out) and its readings by namespace."""
    # dcgm-exporter refreshes every 30 s: most scrapes return the very page parsed last time, and then
    # only its age changes. A digest (not the bytes) keeps 1,000 exporters' memory small. XXH3-128, not a
    # cryptographic hash: it only tells a page from the one before it on the same exporter, whose bytes a
    # workload does not choose (its pod name at most), and takes 1.5 µs per 70 kB page where SHA-256 took
    # 46. Seeded per process, so no pair of pages collides in every scaler.
    if digest is None:
        digest = xxhash.xxh3_128_digest(body, _DIGEST_SEED)
    if previous is None:
        return digest, read_page(body, reader)
    old = previous[1].by_namespace
    if digest == previous[0]:
        return digest, old
    # A namespace whose readings did not change keeps the very same tuple: the store's comparison of
    # old and new pages then costs an identity check, not one comparison per GPU.
    new = read_page(body, reader)
    return digest, {ns: old[ns] if old.get(ns) == readings else readings for ns, readings in new.items()}


def _screen(
    body: bytes, reader: PageReader, refused: tuple[bytes, str] | None, accepted: bytes | None = None
) -> tuple[bytes, str | None]:
    """A large page's digest, and why it is refused before it is parsed (None: it is not); `refused`: the
    digest and reason of this source's last refused page, `accepted`: the digest of its last good page
    (the same page again needs no search). Runs in a worker thread."""
    digest = xxhash.xxh3_128_digest(body, _DIGEST_SEED)
    if refused is not None and refused[0] == digest:
        return digest, refused[1]
    if digest == accepted or not reader.names:
        # The page passed before, or is read by a reader of the body itself (read_body), which keeps
        # to the limit as it reads.
        return digest, None
    error = exposition.too_many_samples(body, reader.names, MAX_SERIES_PER_PAGE)
    return digest, None if error is None else str(error)


# Scrapes wake on a grid of slots, SLOTS_PER_INTERVAL per interval: the scrapes due in one slot start in
# one turn of the event loop and their answers tend to arrive together, so 100 exporters at 1 s cost the
# loop ~20 wake-ups a second instead of one per scrape (each turn is an epoll call and a pass over the
# timers). Still spread over the interval, and a wake-up only ever comes earlier than drawn.
SLOTS_PER_INTERVAL = 20


def wake_slot(when: float, interval: float) -> float:
    """The start of the slot `when` falls in (never later than `when`)."""
    slot = interval / SLOTS_PER_INTERVAL
    return math.floor(when / slot) * slot


async def sleep_until(when: float) -> None:
    """Sleep until the event loop's clock reads `when` (at once if it is past).

    Not asyncio.sleep(when - loop.time()): that reads the clock again, so the scrapes of one slot would
    get timers microseconds apart, and sharing a loop turn would hang on the selector's rounding."""
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()
    timer = loop.call_at(when, _wake, woken)
    try:
        await woken
    finally:
        timer.cancel()


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


class ScrapeCollector:
    """One task per exporter URL: scrape, parse only the wanted families, normalise, store."""

    def __init__(
        self,
        *,
        store: Store,
        interest: WantedKeys,
        limits: ScrapeLimits,
        telemetry: Telemetry,
        clock: Callable[[], float],
        fetcher: Fetcher,
        reader: PageReader = GPU_EXPORTER_PAGES,
        interest_key: Hashable = SCRAPE_INTEREST,
    ) -> None:
        self._fetcher = fetcher  # shared by the collectors
        self._store = store
        self._interest = interest
        self._interest_key = interest_key
        self._limits = limits
        self._reader = reader
        self._telemetry = telemetry
        self._clock = clock
        # Fetches in flight, shared fairly between the namespaces the pages are filed under.
        self.slots = FairSlots(limits.concurrency)
        self._namespaces: dict[str, str] = {}  # url → the namespace its page is filed under, where one
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._last: dict[str, tuple[bytes, Page]] = {}  # url → digest of the last good page, and its page
        self._readers: dict[str, PageReader] = {}
        self._keys: dict[str, Hashable] = {}  # url → its own interest key, where not the collector's
        self._failing: dict[str, str] = {}  # url → the failure last logged, while it goes on
        # url → the digest of its last page refused before parsing, and why (until a page is read again)
        self._refused: dict[str, tuple[bytes, str]] = {}
        # A page that is the very same bytes as its source's last good one keeps that page's readings (the
        # unchanged-page digest); off where the reader's readings depend on the page before
        # (collect/gateway_source.py).
        self.reuse_unchanged_pages = True

    def add(
        self,
        url: str,
        *,
        reader: PageReader | None = None,
        kind: SourceKind = SourceKind.SCRAPE,
        namespace: str | None = None,
        pod: str | None = None,
        interest_key: Hashable | None = None,
    ) -> None:
        """Scrape url while wanted. reader: how this URL's page is read (default: the collector's);
        kind, namespace, pod: what the store files it under (an inference server's page is one pod's);
        interest_key: what must be wanted for this URL to be scraped (default: the collector's)."""
        if url in self._tasks:
            return
        if reader is not None:
            self._readers[url] = reader
        if interest_key is not None:
            self._keys[url] = interest_key
        if namespace is not None:
            self._namespaces[url] = namespace
        self._store.add_source(url, kind, namespace, pod)
        # Supervised: a loop that ended on a bug would leave the URL registered but never scraped again.
        # Its failure is the page's, so an answer without its data says why, not only how old it is.
        self._tasks[url] = supervised(
            lambda: self._run(url),
            f"scrape {url}",
            on_restart=lambda reason: self._store.record_failure(url, f"its scrape {reason} (restarted)"),
        )

    def namespace_of(self, url: str) -> str | None:
        """The namespace url's page is filed under, if any."""
        return self._namespaces.get(url)

    def remove(self, url: str) -> None:
        """Stop scraping url and forget its data (discovery: no target pod runs on its node any more)."""
        task = self._tasks.pop(url, None)
        if task is not None:
            task.cancel()
        self._last.pop(url, None)
        self._readers.pop(url, None)
        self._keys.pop(url, None)
        self._namespaces.pop(url, None)
        self._refused.pop(url, None)
        self._failing.pop(url, None)
        # (Its kept connection, if any, is closed by the session once it has been idle a while.)
        self._store.remove_source(url)

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, {}
        await cancel_all(tasks.values())

    async def scrape_once(self, url: str) -> bool:
        """Scrape one exporter now; records the page or the failure in the store. True on success."""
        started = self._clock()
        namespace = self._namespaces.get(url)
        # The page's work in the worker threads (inflating, joining, screening, reading) takes its
        # namespace's turn there, as the fetch does here: one tenant's pages cannot hold it from another's.
        owner = PAGE_OWNER.set(namespace)
        try:
            async with self.slots.slot(namespace):
                body = await self._fetcher.get(url)
            previous = self._last.get(url)
            reused = previous if self.reuse_unchanged_pages else None
            reader = self._readers.get(url, self._reader)
            large = len(body) > PARSE_OFF_LOOP_BYTES
            if large:
                # A page with more series than one page may give is refused before it is parsed, and the
                # very same page again without even a search (a hostile exporter serves it on every retry).
                digest, why = await in_page_worker(
                    _screen, body, reader, self._refused.get(url), previous[0] if previous else None
                )
                if why is not None:
                    self._refused[url] = (digest, why)
                    raise ExpositionError(why)
                # The garbage collector is not paused around the read: freezing what is alive afterwards
                # would keep the cyclic garbage of every call made meanwhile for good. Collections cost
                # pauses, not memory.
                digest, by_namespace = await in_page_worker(digest_and_read, body, reused, reader, digest)
            else:
                digest, by_namespace = digest_and_read(body, reused, reader)
            # The page had the wanted families (else NotOurPage) but named no pod: see Page.unattributed.
            page = Page(url, self._clock(), by_namespace, unattributed=not by_namespace)
            self._last[url] = (digest, page)
        except asyncio.CancelledError:
            raise
        except (FetchError, ExpositionError, NotOurPage) as error:
            message = (
                f"not a valid metrics page: {error}" if isinstance(error, ExpositionError) else str(error)
            )
            self._store.record_failure(url, message)
            self._telemetry.scrape_done(ok=False, seconds=self._clock() - started)
            # Said once per outage (and when its reason changes), not on every retry: a dead exporter
            # must not fill the log; the store and /metrics keep counting.
            if self._failing.get(url) != message:
                log.warning("scrape of %s failed: %s", url, message)
                self._failing[url] = message
            else:
                log.debug("scrape of %s failed again: %s", url, message)
            return False
        finally:
            PAGE_OWNER.reset(owner)
        self._refused.pop(url, None)
        if self._failing.pop(url, None) is not None:
            log.info("scrape of %s answers again", url)
        self._store.record_page(page)
        self._telemetry.scrape_done(ok=True, seconds=self._clock() - started)
        # The replaced page is left as it is: the store may still hold it (as the last page that named
        # pods); it is freed with its last holder.
        return True

    def retry_delay(self, failures: int, refused: bool = False) -> float:
        """Seconds until the next scrape after `failures` consecutive failures (0: after a success);
        refused: the last page was refused for its series before it was parsed."""
        interval = self._limits.interval
        if refused:
            # Such a page is megabytes that cost a read each time, not an outage to notice the end of:
            # the exporter is spared at once, not after a few more of them.
            return MAX_BACKOFF_INTERVALS * interval
        return backoff_delay(failures, first=interval, cap=MAX_BACKOFF_INTERVALS * interval)

    async def _run(self, url: str) -> None:
        loop = asyncio.get_running_loop()
        interval = self._limits.interval
        key = self._keys.get(url, self._interest_key)
        failures = 0
        spread = True
        while True:
            await self._interest.wait_until_wanted(timeout=interval, key=key)
            if not self._interest.wanted(key):
                spread = True
                continue
            ok = await self.scrape_once(url)
            failures = 0 if ok else failures + 1
            # Jitter only shortens the wait: data must never be older than one interval because of it.
            # When interest starts, every exporter is scraped at once (data at once); the wait after that
            # first scrape is drawn from the whole interval, so later rounds are spread out, not bursts.
            delay = jittered(self.retry_delay(failures, url in self._refused), 1.0 if spread else JITTER)
            await sleep_until(wake_slot(loop.time() + delay, interval))
            spread = False
