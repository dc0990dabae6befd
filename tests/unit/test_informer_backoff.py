"""How long the informer waits before listing or watching again, by what went wrong and what came before.

The waits are recorded (and skipped) rather than timed: each test reads the delays the informer asked for.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from keda_gpu_scaler.collect.backoff import backoff_delay
from keda_gpu_scaler.core.errors import KubeError
from keda_gpu_scaler.kubernetes import informer as informer_module
from keda_gpu_scaler.kubernetes.api import Gone
from keda_gpu_scaler.kubernetes.informer import (
    FIRST_RETRY_SECONDS,
    GONE_FIRST_RETRY_SECONDS,
    MAX_BACKOFF_SECONDS,
    PodInformer,
)

TIMES = 9  # enough failures in a row for a doubling wait from 0.2 s to reach MAX_BACKOFF_SECONDS


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The delays the informer waits before retrying (each made 0, so the test runs at once)."""
    asked: list[float] = []

    def record(delay: float, spread: float = 0.1) -> float:
        asked.append(delay)
        return 0.0

    monkeypatch.setattr(informer_module, "jittered", record)
    return asked


class Api:
    """list_pods answers an empty namespace at resourceVersion 7; `watch` says what each watch does."""

    def __init__(self, watch: Callable[[int], AsyncIterator[dict[str, Any]]]) -> None:
        self.lists = 0
        self.watches = 0
        self.settled = asyncio.Event()
        self._watch = watch

    async def list_pods(self, namespace: str | None, label_selector: str | None) -> dict[str, Any]:
        self.lists += 1
        return {"metadata": {"resourceVersion": "7"}, "items": []}

    async def watch_pods(
        self, *args: Any, on_open: Callable[[], None] = lambda: None, **kwargs: Any
    ) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        on_open()  # the API server accepted the watch (a 410 comes as an ERROR event after the 200)
        async for event in self._watch(self.watches):
            yield event

    async def settle(self) -> None:
        """The last watch: stays open, with nothing to say."""
        self.settled.set()
        await asyncio.Event().wait()


async def run(api: Api) -> PodInformer:
    informer = PodInformer(api, namespace="llm", label_selector=None, on_pod=lambda old, new: None)  # type: ignore[arg-type]
    informer.start()
    try:
        await asyncio.wait_for(api.settled.wait(), 10)
    finally:
        await informer.stop()
    return informer


def bookmark(version: int) -> dict[str, Any]:
    return {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(version)}}}


async def test_410_gone_right_after_every_list_backs_off_instead_of_listing_in_a_tight_loop(
    waits: list[float],
) -> None:
    # A watch cache behind whatever the lists answer (an API server replica just restarted): every
    # watch, even from the version a list has just given, is 410 Gone.
    async def watch(n: int) -> AsyncIterator[dict[str, Any]]:
        if n <= TIMES:
            raise Gone("too old resource version")
        await api.settle()
        yield {}  # pragma: no cover

    api = Api(watch)
    await run(api)
    assert api.lists == TIMES + 1
    # One wait before each new list, doubling from client-go's 0.8 s up to 30 s; it used to list again at
    # once, thousands of times a second.
    assert waits == [
        backoff_delay(n, first=GONE_FIRST_RETRY_SECONDS, cap=MAX_BACKOFF_SECONDS) for n in range(1, TIMES + 1)
    ]
    assert waits[-1] == MAX_BACKOFF_SECONDS


async def test_410_gone_when_resuming_a_watch_that_had_moved_on_lists_again_at_once(
    waits: list[float],
) -> None:
    # Each watch reads a bookmark and is ended by the server; resuming from the bookmark is 410 Gone
    # (history compacted meanwhile): that is no storm, the relist comes at once.
    async def watch(n: int) -> AsyncIterator[dict[str, Any]]:
        if n > 2 * TIMES:
            await api.settle()
        if n % 2 == 0:
            raise Gone("too old resource version")
        yield bookmark(100 + n)

    api = Api(watch)
    await run(api)
    assert api.lists == TIMES + 1
    assert waits == []


async def test_a_healthy_watch_that_drops_is_a_first_failure_however_often_it_happened_before(
    waits: list[float],
) -> None:
    # Each watch is accepted, reads a bookmark (healthy), then loses its connection (a load balancer's
    # idle cut): each drop waits the first, shortest delay. It used to count as one more failure in a
    # row, doubling the wait up to 30 s, with every trigger of the namespace UNAVAILABLE meanwhile.
    async def watch(n: int) -> AsyncIterator[dict[str, Any]]:
        if n > TIMES:
            await api.settle()
        yield bookmark(100 + n)
        raise KubeError("the Kubernetes API server is unreachable (connection reset)")

    api = Api(watch)
    informer = await run(api)
    assert waits == [FIRST_RETRY_SECONDS] * TIMES
    assert api.lists == 1  # each reconnect resumed from the bookmark
    assert informer.error is None


async def test_a_watch_that_fails_before_it_was_healthy_still_backs_off_doubling(waits: list[float]) -> None:
    # Accepted, then cut before any event, again and again: those are failures in a row.
    async def watch(n: int) -> AsyncIterator[dict[str, Any]]:
        if n > TIMES:
            await api.settle()
        raise KubeError("the Kubernetes API server is unreachable (connection reset)")
        yield {}  # pragma: no cover

    api = Api(watch)
    await run(api)
    assert waits == [
        backoff_delay(n, first=FIRST_RETRY_SECONDS, cap=MAX_BACKOFF_SECONDS) for n in range(1, TIMES + 1)
    ]
    assert waits[-1] == MAX_BACKOFF_SECONDS
