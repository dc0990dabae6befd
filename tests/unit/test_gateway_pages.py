"""GatewayPages: which EPP replica pages are scraped for which InferencePool, and why there are none."""

from __future__ import annotations

import asyncio

from keda_gpu_scaler.collect.gateway import GatewayPages, GatewayPool
from keda_gpu_scaler.collect.interest import Interest


class Sink:
    def __init__(self) -> None:
        self.pages: dict[str, tuple[str, str, str]] = {}
        self.added: list[str] = []

    def add_replica_page(self, url: str, namespace: str, pool: str, replica: str) -> None:
        assert url not in self.pages
        self.pages[url] = (namespace, pool, replica)
        self.added.append(url)

    def remove(self, url: str) -> None:
        del self.pages[url]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make() -> tuple[GatewayPages, Sink, Interest, Clock]:
    clock = Clock()
    interest = Interest(ttl=600, clock=clock)
    pages = GatewayPages(interest)
    sink = Sink()
    pages.start(sink)
    return pages, sink, interest, clock


def test_replicas_replace_whole_and_repeated_calls_change_nothing() -> None:
    pages, sink, _, _ = make()
    pages.set_replicas("llm", "chat", {"epp-a": "http://10.0.0.1:9090/metrics"})
    pages.set_replicas("llm", "chat", {"epp-a": "http://10.0.0.1:9090/metrics"})
    assert sink.added == ["http://10.0.0.1:9090/metrics"]
    pages.set_replicas(
        "llm", "chat", {"epp-b": "http://10.0.0.2:9090/metrics", "epp-a": "http://10.0.0.1:9090/metrics"}
    )
    assert [r.name for r in pages.replicas("llm", "chat")] == ["epp-a", "epp-b"]
    pages.set_replicas("llm", "chat", {"epp-b": "http://10.0.0.2:9090/metrics"})
    assert sink.pages == {"http://10.0.0.2:9090/metrics": ("llm", "chat", "epp-b")}
    assert pages.problem("llm", "chat") is None


def test_a_problem_drops_the_replicas_and_replicas_clear_it() -> None:
    pages, sink, _, _ = make()
    pages.set_replicas("llm", "chat", {"epp-a": "http://10.0.0.1:9090/metrics"})
    pages.set_problem("llm", "chat", "InferencePool llm/chat does not exist")
    assert sink.pages == {}
    assert pages.replicas("llm", "chat") == ()
    assert pages.problem("llm", "chat") == "InferencePool llm/chat does not exist"
    pages.set_replicas("llm", "chat", {"epp-a": "http://10.0.0.1:9090/metrics"})
    assert pages.problem("llm", "chat") is None
    pages.forget("llm", "chat")
    assert sink.pages == {} and pages.replicas("llm", "chat") == () and pages.problem("llm", "chat") is None


def test_static_pages_given_before_start_reach_the_collector_and_stay() -> None:
    clock = Clock()
    pages = GatewayPages(Interest(ttl=600, clock=clock))
    pages.add_static("llm", "chat", "http://epp:9090/metrics")
    pages.add_static("llm", "chat", "http://epp:9090/metrics")
    sink = Sink()
    pages.start(sink)
    assert sink.pages == {"http://epp:9090/metrics": ("llm", "chat", "http://epp:9090/metrics")}
    pages.forget("llm", "chat")
    assert [r.url for r in pages.replicas("llm", "chat")] == ["http://epp:9090/metrics"]


def test_a_page_named_by_two_pools_is_read_for_one_at_a_time() -> None:
    pages, sink, _, _ = make()
    url = "http://10.0.0.1:9090/metrics"
    pages.set_replicas("llm", "a", {"epp": url})
    pages.set_replicas("llm", "b", {"epp": url})
    assert len(sink.added) == 1
    assert pages.replicas("llm", "b") == ()
    pages.forget("llm", "a")
    assert sink.pages == {url: ("llm", "a", "epp")}  # still scraped: pool b names it
    assert [r.url for r in pages.replicas("llm", "b")] == [url]
    pages.forget("llm", "b")
    assert sink.pages == {}


def test_wanted_pools_follow_interest_with_their_port() -> None:
    pages, _, interest, clock = make()
    assert pages.wanted() == {}
    interest.touch(GatewayPool("llm", "chat", 9091))
    interest.touch(GatewayPool("llm", "chat", 9090))
    interest.touch("scrape")
    assert pages.wanted() == {("llm", "chat"): 9090}
    assert pages.is_wanted(("llm", "chat"))
    clock.now += 601
    assert pages.wanted() == {}


async def test_a_watcher_wakes_when_a_pool_becomes_wanted() -> None:
    pages, _, interest, _ = make()
    waiter = asyncio.ensure_future(pages.wait_for_wanted(timeout=30))
    await asyncio.sleep(0)
    assert not waiter.done()
    interest.touch(GatewayPool("llm", "chat"))
    await asyncio.wait_for(waiter, timeout=5)
    assert pages.wanted() == {("llm", "chat"): 9090}
