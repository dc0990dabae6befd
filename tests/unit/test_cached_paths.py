"""The unchanged-page digest against the simple version: whatever happens, the
cached path answers what reading every page whole answers (the simple version is the one the caches
benchmark measures: bench/cache_switches.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support import GpuLine, dcgm_page

from bench.cache_switches import switched_off
from keda_gpu_scaler.collect.http import FetchError
from keda_gpu_scaler.collect.scrape import ScrapeCollector, ScrapeLimits
from keda_gpu_scaler.collect.store import Store
from keda_gpu_scaler.collect.wanted import WantedSources
from keda_gpu_scaler.telemetry import Telemetry


class ScriptedFetcher:
    """Answers each URL with the body the test last set for it (None: the exporter fails)."""

    def __init__(self) -> None:
        self.bodies: dict[str, bytes | None] = {}

    async def get(self, url: str) -> bytes:
        body = self.bodies.get(url)
        if body is None:
            raise FetchError("connection refused")
        return body

    def forget(self, url: str) -> None:
        pass

    def close(self) -> None:
        pass


def collector(fetcher: ScriptedFetcher, now: list[float]) -> tuple[ScrapeCollector, Store]:
    store = Store()
    scraper = ScrapeCollector(
        store=store,
        interest=WantedSources(),
        limits=ScrapeLimits(interval=5.0, timeout=1.0, max_page_bytes=1 << 20, concurrency=4),
        telemetry=Telemetry(),
        clock=lambda: now[0],
        fetcher=fetcher,
    )
    return scraper, store


# One node's page: its GPUs' pods (a GPU without one is idle) and values; or no pod labels at all.
GPU_LINES = st.lists(
    st.builds(
        GpuLine,
        namespace=st.sampled_from(["llm", "embed"]),
        pod=st.sampled_from(["vllm-0", "vllm-1", "tei-0", ""]),
        util=st.sampled_from([0.0, 35.0, 90.0]),
        gpu=st.integers(0, 2),
        fb_used=st.sampled_from([1000, 40000]),
    ),
    max_size=4,
)
SCRAPES = st.lists(
    st.tuples(
        st.sampled_from(["http://node-a/metrics", "http://node-b/metrics"]),
        st.sampled_from(["page", "same again", "fails", "not a metrics page", "removed"]),
        GPU_LINES,
    ),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(SCRAPES)
def test_pages_read_through_the_unchanged_page_digest_read_as_read_whole_every_time(
    scrapes: list[Any],
) -> None:
    """The unchanged-page digest against a collector that reads every page whole: through pages changing their values, their pods and their GPUs, the very same
    page again, exporters failing, answering something that is not a metrics page and going away."""
    now = [1000.0]

    async def scenario() -> None:
        fetcher = ScriptedFetcher()
        cached, cached_store = collector(fetcher, now)
        simple, simple_store = collector(fetcher, now)
        for url, what, gpus in scrapes:
            now[0] += 1
            if what == "page":
                fetcher.bodies[url] = dcgm_page(gpus, host=url).encode()
            elif what == "fails":
                fetcher.bodies[url] = None
            elif what == "not a metrics page":
                fetcher.bodies[url] = b'{"status": "ok"}'
            if what == "removed":
                cached.remove(url)
                simple.remove(url)
                continue
            with switched_off("unchanged-page digest"):
                read_whole = await simple.scrape_once(url)
            assert await cached.scrape_once(url) == read_whole
            for namespace in ("llm", "embed"):
                kept, read = (
                    cached_store.view(namespace, now[0], 10.0),
                    simple_store.view(namespace, now[0], 10.0),
                )
                assert (kept.readings, kept.fresh, kept.recently_seen, kept.problems, kept.pod_problems) == (
                    read.readings,
                    read.fresh,
                    read.recently_seen,
                    read.problems,
                    read.pod_problems,
                )

    asyncio.run(scenario())
