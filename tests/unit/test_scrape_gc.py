"""Reading large pages off the loop must not keep the process's garbage alive."""

from __future__ import annotations

import gc
import time
import weakref

import pytest
from support import GpuLine, dcgm_page

from keda_gpu_scaler.collect import scrape
from keda_gpu_scaler.collect.store import Store
from keda_gpu_scaler.collect.wanted import WantedSources
from keda_gpu_scaler.telemetry import Telemetry


class _Node:
    partner: object


class _OnePage:
    """A fetcher that always answers the same page (no network needed for what is tested here)."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def get(self, url: str) -> bytes:
        return self.body

    def forget(self, url: str) -> None:
        pass

    def close(self) -> None:
        pass


async def test_cyclic_garbage_made_around_a_large_page_read_is_still_collected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Garbage cycles are made all the time (an aborted call's exception and its traceback, for one).
    # Freezing the collector's generations after large reads kept every one of them for good.
    monkeypatch.setattr(scrape, "PARSE_OFF_LOOP_BYTES", 0)  # every page takes the large-page path
    collector = scrape.ScrapeCollector(
        fetcher=_OnePage(dcgm_page([GpuLine("llm", "vllm-0", 50)]).encode()),
        store=Store(),
        interest=WantedSources(),
        limits=scrape.ScrapeLimits(1.0, 1.0, 1 << 20, 1),
        telemetry=Telemetry(),
        clock=time.monotonic,
    )
    first, second = _Node(), _Node()
    first.partner, second.partner = second, first
    ref = weakref.ref(first)
    del first, second
    try:
        assert await collector.scrape_once("http://127.0.0.1:1/metrics")
        gc.collect()
        assert ref() is None, "a reference cycle that was garbage survived a full collection"
    finally:
        gc.unfreeze()
