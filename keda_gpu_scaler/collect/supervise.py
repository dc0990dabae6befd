"""Background tasks that must run for the life of the process: an unexpected end is logged and restarted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from keda_gpu_scaler.collect.backoff import backoff_delay

log = logging.getLogger(__name__)

# A task that keeps dying is restarted after 1 s, 2 s, 4 s … at most this: never a hot loop.
MAX_RESTART_DELAY = 30.0


def supervised(
    make: Callable[[], Coroutine[Any, Any, None]],
    name: str,
    on_restart: Callable[[str], None] | None = None,
) -> asyncio.Task[None]:
    """Run make() as a task; if it returns or raises (other than by cancellation), log it and run it again.

    A collector that ended silently would leave its source registered but never read again: the data
    would go stale and every call would say UNAVAILABLE with no log line saying why.
    """

    async def keep_running() -> None:
        ends = 0
        said = None  # the last end logged with its traceback
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            failure: Exception | None = None
            try:
                await make()
                reason = "ended unexpectedly"
            except asyncio.CancelledError:
                raise
            except Exception as error:
                failure, reason = error, f"failed: {type(error).__name__}: {error}"
            quick = loop.time() - started < MAX_RESTART_DELAY
            if quick and reason == said:
                # Said once per outage, as a failing scrape is: a task failing the same way at every
                # restart logged its traceback every 30 s for as long as it lasted.
                log.debug("background task %s %s again; restarting it", name, reason)
            else:
                log.error("background task %s %s; restarting it", name, reason, exc_info=failure)
                said = reason
            # Only ends in quick succession back off: one that ran for a while starts again after 1 s.
            ends = ends + 1 if quick else 1
            if on_restart is not None:
                on_restart(reason)
            await asyncio.sleep(backoff_delay(ends, first=1.0, cap=MAX_RESTART_DELAY))

    return asyncio.create_task(keep_running(), name=name)


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel every task and wait until each has ended (an error it ended with is not raised again)."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
