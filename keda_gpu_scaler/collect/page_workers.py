"""The worker threads of the pages' own work (joining, inflating, screening and reading large bodies),
shared fairly between the pages' owners: one job per namespace at a time, namespaces in turn."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any, TypeVar

_T = TypeVar("_T")

# Whose page the work at hand is for: the namespace its source is filed under (ScrapeCollector.scrape_once
# sets it around each scrape), None for pages of no namespace (GPU exporters) and Prometheus answers.
PAGE_OWNER: contextvars.ContextVar[Hashable] = contextvars.ContextVar("PAGE_OWNER", default=None)


class PageWorkers:
    """The worker threads of the pages' own work (joining, inflating, screening and reading large bodies),
    shared fairly between the pages' owners (PAGE_OWNER).

    Not asyncio's default pool: a tenant's pods choose how much of this work there is, and /metrics,
    Kubernetes lists and Prometheus answers, which use the default pool, must not wait behind it. Nor one
    FIFO queue: a tenant's six 15 MB pages queued 3 s of parsing (1 s each) in front of another tenant's
    GPU exporter page, whose data then went stale. So:

    - an owner runs one job at a time: parsing (most of the work) holds the GIL, so a second thread adds
      nothing to one owner's pages (6 pages of 20,000 series: 2.4 s on one thread, 2.9 s on two) and is kept for others;
    - a free thread takes the next owner in turn (round robin) that has a job waiting and none running.

    So a job waits behind its own owner's earlier jobs, and behind each other owner for at most one of
    theirs (a page's limits bound a job: about 1 s at 20,000 series); with one busy tenant, the other
    thread is always free for everyone else. FairSlots shares the fetches, this the work on what they
    fetched.
    """

    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._started = 0
        self._lock = threading.Condition()
        # owner → its jobs in order; owners in turn order (dicts keep insertion order)
        self._waiting: dict[Hashable, deque[tuple[Callable[[], Any], Future[Any]]]] = {}
        self._running: set[Hashable] = set()

    def submit(self, owner: Hashable, job: Callable[[], _T]) -> Future[_T]:
        future: Future[_T] = Future()
        with self._lock:
            self._waiting.setdefault(owner, deque()).append((job, future))
            if self._started < self._threads:
                # Started on first use, as a ThreadPoolExecutor does; daemons: a job is never waited for
                # at exit (a cancelled wait leaves it to end on its own, as it would in an executor).
                self._started += 1
                threading.Thread(target=self._work, name=f"page-work-{self._started}", daemon=True).start()
            self._lock.notify()
        return future

    def _next(self) -> tuple[Hashable, Callable[[], Any], Future[Any]] | None:
        """The next job in turn of an owner with none running (under the lock)."""
        for owner, jobs in self._waiting.items():
            if owner in self._running:
                continue
            job, future = jobs.popleft()
            del self._waiting[owner]
            if jobs:
                self._waiting[owner] = jobs  # to the end of the turn order
            self._running.add(owner)
            return owner, job, future
        return None

    def _work(self) -> None:
        done: tuple[Hashable] | None = None  # (the owner of the job this thread just ran)
        while True:
            with self._lock:
                if done is not None:
                    # Its next job, if any, is this thread's to take (in turn): no other thread to wake.
                    self._running.discard(done[0])
                while (picked := self._next()) is None:
                    self._lock.wait()
            done = (picked[0],)
            _run(*picked[1:])
            # An idle thread holds nothing: the job's input (a page's pieces) and its future (with the
            # page) would stay alive until its next job.
            del picked


def _run(job: Callable[[], Any], future: Future[Any]) -> None:
    # False: the caller stopped waiting (cancelled) before the job started.
    if future.set_running_or_notify_cancel():
        try:
            future.set_result(job())
        except BaseException as error:  # the caller's to see, as in a ThreadPoolExecutor
            future.set_exception(error)


_PAGE_WORKERS = PageWorkers(threads=2)


async def in_page_worker(func: Callable[..., _T], *args: object) -> _T:
    """func(*args) in a page worker thread, in the turn of its PAGE_OWNER (see PageWorkers)."""
    return await asyncio.wrap_future(_PAGE_WORKERS.submit(PAGE_OWNER.get(), functools.partial(func, *args)))


# Prometheus answers of more series than this are worked through (stamped, grouped, read) in the page
# workers, in their namespace's turn, as scraped pages over scrape.PARSE_OFF_LOOP_BYTES are: about 10 µs a
# series on the loop (200: 2 ms), and a tenant's pods choose how many series there are (19,000 held every
# tenant's RPCs 0.3 s a round).
OFF_LOOP_SERIES = 200


async def worked_for_answer(series: int, func: Callable[..., _T], *args: object) -> _T:
    """func(*args) for a Prometheus answer of `series` series: in a page worker when there are many."""
    return await in_page_worker(func, *args) if series > OFF_LOOP_SERIES else func(*args)
