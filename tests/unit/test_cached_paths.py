"""The caches against the simple version: whatever happens, a cached path answers what the path without the
cache answers (the caches are switched off through the same seams the caches benchmark uses)."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support import GpuLine, dcgm_page

from keda_gpu_scaler import trigger
from keda_gpu_scaler.collect.http import FetchError
from keda_gpu_scaler.collect.scrape import ScrapeCollector, ScrapeLimits
from keda_gpu_scaler.collect.store import Page, Store
from keda_gpu_scaler.discovery.targets import Targets
from keda_gpu_scaler.errors import ConfigError, NoData
from keda_gpu_scaler.evaluator import Evaluator
from keda_gpu_scaler.metrics import Telemetry
from keda_gpu_scaler.registry import Registry
from keda_gpu_scaler.trigger import TriggerSpec, parse_trigger
from keda_gpu_scaler.vendors import Family, GpuReading
from keda_gpu_scaler.wanted import WantedSources

EXPORTERS = ["http://node-a/metrics", "http://node-b/metrics", "http://node-c/metrics"]
PODS = ["vllm-0", "vllm-1", "vllm-2", "other-0"]
SPECS = [
    parse_trigger({"threshold": "50", "podNamePrefix": "vllm-"}),
    parse_trigger({"threshold": "50", "podNamePrefix": "vllm-", "metric": "memory"}),
]


class FixedTargets:
    """Discovery as the evaluator sees it: the target pods now (changed by the test), or failing."""

    def __init__(self) -> None:
        self.pods: frozenset[str] | None = frozenset(PODS[:3])

    def check(self, spec: TriggerSpec) -> None:
        pass

    def resolve(self, namespace: str, name: str, spec: TriggerSpec) -> Targets:
        if self.pods is None:
            raise NoData("discovery is failing")
        return Targets(self.pods, "AverageValue")

    def forget(self, namespace: str, name: str) -> None:
        pass


def readings(contents: list[tuple[str, int, int]]) -> list[GpuReading]:
    return [
        GpuReading(Family.NVIDIA, "llm", pod, f"GPU-{gpu}", "node", float(value), None, False, float(value))
        for pod, gpu, value in contents
    ]


class Scaler:
    """A store and an evaluator, with every cache of theirs on (the product) or off (the simple version)."""

    def __init__(self, cached: bool, now: list[float], kubernetes: bool) -> None:
        self.store = Store()
        self.evaluator = Evaluator(
            store=self.store,
            telemetry=Telemetry(),
            max_staleness=10.0,
            clock=lambda: now[0],
            targets=FixedTargets() if kubernetes else None,
        )
        if not cached:
            self.store.keep_views = self.store.keep_freshness = False
        self.registry = Registry(ttl=float("inf"), cap=1, clock=lambda: now[0])

    def answer(self, spec: TriggerSpec) -> tuple[Any, ...]:
        try:
            evaluation = self.evaluator.evaluate(self.registry.follow("llm", "chat", spec), spec)
        except NoData as error:
            return ("no data", str(error))
        return (evaluation.value, evaluation.active, evaluation.pod_rows, evaluation.missing_pods)


OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["page", "same page", "unattributed", "fail", "remove", "wait", "targets"]),
        st.sampled_from(EXPORTERS),
        st.lists(
            st.tuples(st.sampled_from(PODS), st.integers(0, 1), st.sampled_from([0, 30, 90])), max_size=3
        ),
        st.floats(0, 12),
        st.booleans(),  # asked right after this step
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(OPERATIONS, st.booleans())
def test_the_cached_evaluations_answer_as_evaluating_every_call(
    operations: list[Any], kubernetes: bool
) -> None:
    """The store's kept views and freshness, against a store that keeps nothing: through pages changing and renewed unchanged, exporters failing, recovering,
    losing their pod labels and going away, target pods coming and going, and time passing."""
    now = [1000.0]
    cached, simple = Scaler(True, now, kubernetes), Scaler(False, now, kubernetes)
    last: dict[str, list[tuple[str, int, int]]] = {}
    for what, source, contents, seconds, ask in operations:
        for scaler in (cached, simple):
            store = scaler.store
            if what == "page":
                store.record_page(Page.from_readings(source, now[0], readings(contents)))
            elif what == "same page":
                store.record_page(Page.from_readings(source, now[0], readings(last.get(source, []))))
            elif what == "unattributed":
                store.record_page(Page.from_readings(source, now[0], (), gpu_series=True))
            elif what == "fail":
                store.record_failure(source, "HTTP 500")
            elif what == "remove":
                store.remove_source(source)
            elif what == "targets" and isinstance(targets := scaler.evaluator._targets, FixedTargets):
                chosen = frozenset(pod for pod, _, _ in contents)
                targets.pods = None if seconds > 10 else chosen
        if what == "page":
            last[source] = contents
        elif what == "wait":
            now[0] += seconds
        if ask:
            for spec in SPECS:
                assert cached.answer(spec) == simple.answer(spec), (what, now[0])


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


def collector(cached: bool, fetcher: ScriptedFetcher, now: list[float]) -> tuple[ScrapeCollector, Store]:
    store = Store()
    scraper = ScrapeCollector(
        store=store,
        interest=WantedSources(),
        limits=ScrapeLimits(interval=5.0, timeout=1.0, max_page_bytes=1 << 20, concurrency=4),
        telemetry=Telemetry(),
        clock=lambda: now[0],
        fetcher=fetcher,
    )
    if not cached:
        scraper.reuse_unchanged_pages = False
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
        cached, cached_store = collector(True, fetcher, now)
        simple, simple_store = collector(False, fetcher, now)
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
            assert await cached.scrape_once(url) == await simple.scrape_once(url)
            for namespace in ("llm", "embed"):
                kept, read = (
                    cached_store.view(namespace, now[0], 10.0),
                    simple_store.view(namespace, now[0], 10.0),
                )
                assert (kept.readings, kept.fresh, kept.recently_seen, kept.problems) == (
                    read.readings,
                    read.fresh,
                    read.recently_seen,
                    read.problems,
                )

    asyncio.run(scenario())


METADATA = st.dictionaries(
    st.sampled_from(
        ["threshold", "activationThreshold", "podNamePrefix", "metric", "aggregation", "vendor", "x"]
    ),
    st.sampled_from(
        ["70", "0", "1e3", "-1", "nan", "sum", "mean", "memory", "nvidia", "vllm-", "", "web-\n"]
    ),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(METADATA, max_size=8))
def test_a_cached_trigger_parse_reads_as_a_new_parse(calls: list[dict[str, str]]) -> None:
    """The parse cache against parsing every call: the same spec, or the same error, for any metadata."""

    def outcome(metadata: dict[str, str]) -> TriggerSpec | str:
        try:
            return parse_trigger(metadata)
        except ConfigError as error:
            return f"ConfigError: {error}"

    cached = [outcome(metadata) for metadata in calls + calls]
    trigger.CACHE_PARSES = False
    try:
        parsed = [outcome(metadata) for metadata in calls + calls]
    finally:
        trigger.CACHE_PARSES = True
    assert cached == parsed
