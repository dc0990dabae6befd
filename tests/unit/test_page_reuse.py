"""A source's next page never changes what the store still holds of its last one."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from support import GpuLine, dcgm_page

from keda_gpu_scaler.collect.http import PageFetcher, client_session
from keda_gpu_scaler.collect.scrape import PARSE_OFF_LOOP_BYTES, ScrapeCollector, ScrapeLimits
from keda_gpu_scaler.collect.store import Store
from keda_gpu_scaler.collect.wanted import WantedSources
from keda_gpu_scaler.telemetry import Telemetry

LABELLED = dcgm_page([GpuLine("llm", "llm-0", 90), GpuLine("llm", "llm-1", 90, gpu=1)])
# The same GPUs with no pod labels: dcgm-exporter lost the kubelet's pod-resources socket.
UNLABELLED = dcgm_page([GpuLine("llm", "", 90), GpuLine("llm", "", 90, gpu=1)])
# Lines of a family nobody reads make a page large enough to be read in a worker thread.
PADDING = "".join(f'unread_family{{i="{i}"}} 1\n' for i in range(PARSE_OFF_LOOP_BYTES // 20))


class SwitchablePage:
    def __init__(self) -> None:
        self.body = ""

    async def handle(self, _: web.Request) -> web.Response:
        return web.Response(text=self.body, content_type="text/plain")


@pytest.fixture
async def exporter() -> AsyncIterator[tuple[SwitchablePage, str]]:
    page = SwitchablePage()
    app = web.Application()
    app.router.add_get("/metrics", page.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield page, f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    await runner.cleanup()


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (LABELLED + PADDING, UNLABELLED),
        (LABELLED, UNLABELLED + PADDING),
        (LABELLED + PADDING, UNLABELLED + PADDING),
    ],
    ids=["large-then-small", "small-then-large", "large-then-large"],
)
async def test_pods_of_the_last_labelled_page_stay_missing_pods_after_an_attribution_outage(
    exporter: tuple[SwitchablePage, str], first: str, second: str
) -> None:
    page, url = exporter
    store = Store()
    interest = WantedSources()
    limits = ScrapeLimits(interval=1.0, timeout=2.0, max_page_bytes=16 << 20, concurrency=1)
    session = client_session()
    fetcher = PageFetcher(session, timeout=limits.timeout, max_bytes=limits.max_page_bytes)
    collector = ScrapeCollector(
        store=store,
        interest=interest,
        limits=limits,
        telemetry=Telemetry(),
        clock=time.monotonic,
        fetcher=fetcher,
    )
    collector.add(url)
    try:
        page.body = first
        assert await collector.scrape_once(url)
        before = store.view("llm", time.monotonic(), 60.0)
        assert sorted(r.pod for r in before.readings) == ["llm-0", "llm-1"]

        page.body = second
        assert await collector.scrape_once(url)
        after = store.view("llm", time.monotonic(), 60.0)
        # The GPUs are still busy; their pods are unknown for now: missing pods, never a fleet of none.
        assert after.readings == ()
        assert sorted(after.recently_seen) == ["llm-0", "llm-1"]
    finally:
        await collector.stop()
        await session.close()


def test_a_large_page_the_same_as_the_last_good_one_is_not_searched_again() -> None:
    from keda_gpu_scaler.collect import scrape

    lines = "".join(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}"}} 1\n' for i in range(scrape.MAX_SERIES_PER_PAGE + 1))
    body = lines.encode()
    digest, why = scrape._screen(body, scrape.GPU_EXPORTER_PAGES, None)
    assert why is not None and "more than" in why  # searched: over the limit
    # Given as the last good page's digest, the search is skipped (it passed it then).
    assert scrape._screen(body, scrape.GPU_EXPORTER_PAGES, None, accepted=digest) == (digest, None)
