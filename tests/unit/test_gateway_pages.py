"""GatewayPages: which EPP replica pages are scraped for which InferencePool and port, and why none."""

from __future__ import annotations

from keda_gpu_scaler.collect.gateway import GatewayPages
from keda_gpu_scaler.collect.gateway_source import gateway_reader
from keda_gpu_scaler.collect.scrape import read_page
from keda_gpu_scaler.collect.snapshot import Snapshots
from keda_gpu_scaler.collect.store import Page, Store
from keda_gpu_scaler.collect.wanted import EppPage, EppPool, WantedSources
from keda_gpu_scaler.core.decide import decide
from keda_gpu_scaler.core.errors import NoData
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.demo.epp import epp_page

CHAT = EppPool("llm", "chat", 9090)


class Sink:
    def __init__(self) -> None:
        self.pages: dict[str, tuple[str, str, str]] = {}
        self.added: list[str] = []

    def add_page(self, page: EppPage) -> None:
        assert page.url not in self.pages
        self.pages[page.url] = (page.namespace, page.pool, page.replica)
        self.added.append(page.url)

    def remove(self, url: str) -> None:
        del self.pages[url]


def make(*pools: EppPool) -> tuple[GatewayPages, Sink, WantedSources]:
    wanted = WantedSources()
    pages = GatewayPages(wanted)
    sink = Sink()
    pages.start(sink)
    wanted.want("triggers", pools or (CHAT,))
    return pages, sink, wanted


def test_replicas_replace_whole_and_repeated_calls_change_nothing() -> None:
    pages, sink, _ = make()
    pages.set_replicas(CHAT, {"epp-a": "http://10.0.0.1:9090/metrics"})
    pages.set_replicas(CHAT, {"epp-a": "http://10.0.0.1:9090/metrics"})
    assert sink.added == ["http://10.0.0.1:9090/metrics"]
    pages.set_replicas(
        CHAT, {"epp-b": "http://10.0.0.2:9090/metrics", "epp-a": "http://10.0.0.1:9090/metrics"}
    )
    assert [r.name for r in pages.replicas(CHAT)] == ["epp-a", "epp-b"]
    pages.set_replicas(CHAT, {"epp-b": "http://10.0.0.2:9090/metrics"})
    assert sink.pages == {"http://10.0.0.2:9090/metrics": ("llm", "chat", "epp-b")}
    assert pages.problem(CHAT) is None


def test_a_problem_drops_the_replicas_and_replicas_clear_it() -> None:
    pages, sink, _ = make()
    pages.set_replicas(CHAT, {"epp-a": "http://10.0.0.1:9090/metrics"})
    pages.set_problem(CHAT, "InferencePool llm/chat does not exist")
    assert sink.pages == {}
    assert pages.replicas(CHAT) == ()
    assert pages.problem(CHAT) == "InferencePool llm/chat does not exist"
    pages.set_replicas(CHAT, {"epp-a": "http://10.0.0.1:9090/metrics"})
    assert pages.problem(CHAT) is None
    pages.forget(CHAT)
    assert sink.pages == {} and pages.replicas(CHAT) == () and pages.problem(CHAT) is None


def test_static_pages_are_read_while_a_trigger_wants_their_pool_at_any_port() -> None:
    wanted = WantedSources()
    pages = GatewayPages(wanted)
    pages.add_static("llm", "chat", "http://epp:9090/metrics")
    pages.add_static("llm", "chat", "http://epp:9090/metrics")
    sink = Sink()
    pages.start(sink)
    assert sink.pages == {}  # no trigger reads the pool
    wanted.want("a", [CHAT])
    wanted.want("b", [EppPool("llm", "chat", 9191)])
    assert sink.pages == {"http://epp:9090/metrics": ("llm", "chat", "http://epp:9090/metrics")}
    pages.forget(CHAT)
    assert [r.url for r in pages.replicas(CHAT)] == ["http://epp:9090/metrics"]
    wanted.release("a")
    assert list(sink.pages) == ["http://epp:9090/metrics"]  # pool b still reads it
    wanted.release("b")
    assert sink.pages == {}


def test_a_page_named_by_two_pools_is_read_for_one_at_a_time() -> None:
    a, b = EppPool("llm", "a", 9090), EppPool("llm", "b", 9090)
    pages, sink, _ = make(a, b)
    url = "http://10.0.0.1:9090/metrics"
    pages.set_replicas(a, {"epp": url})
    pages.set_replicas(b, {"epp": url})
    assert len(sink.added) == 1
    assert pages.replicas(b) == ()
    pages.forget(a)
    assert sink.pages == {url: ("llm", "b", "epp")}  # still scraped: pool b names it, filed under b now
    assert [r.url for r in pages.replicas(b)] == [url]
    pages.forget(b)
    assert sink.pages == {}


def test_two_ports_of_one_pool_each_have_their_own_replicas_and_problem() -> None:
    typo = EppPool("llm", "chat", 9)
    pages, sink, wanted = make(CHAT, typo)
    pages.set_replicas(CHAT, {"epp-a": "http://10.0.0.1:9090/metrics"})
    pages.set_problem(typo, "endpoint picker pods not reachable on metrics port 9 yet")
    assert [r.url for r in pages.replicas(CHAT)] == ["http://10.0.0.1:9090/metrics"]
    assert pages.problem(CHAT) is None and pages.replicas(typo) == ()
    assert set(pages.pools()) == {CHAT, typo}
    wanted.want("triggers", [CHAT])  # the typo edited away
    assert pages.pools() == [CHAT] and pages.problem(typo) is None
    assert list(sink.pages) == ["http://10.0.0.1:9090/metrics"]


def test_a_late_word_about_a_pool_no_longer_wanted_keeps_nothing() -> None:
    pages, sink, wanted = make()
    wanted.release("triggers")
    pages.set_replicas(CHAT, {"epp-a": "http://10.0.0.1:9090/metrics"})
    assert sink.pages == {} and pages.replicas(CHAT) == ()


def test_a_replica_read_for_another_pool_or_for_none_is_unread_never_left_out() -> None:
    # Pool llm/chat has two replicas; epp-1's address is named by a pool of another namespace too (read for
    # neither), then by another pool of its own namespace (read for that one). It may hold every request
    # the pool queues: the pool reads it as a replica that cannot be read, never as one it does not have.
    victim, tenant, other = CHAT, EppPool("tenant", "chat", 9090), EppPool("llm", "code", 9090)
    pages, _, _ = make(victim, tenant, other)
    epp0, epp1 = "http://10.0.0.1:9090/metrics", "http://10.0.0.2:9090/metrics"
    pages.set_replicas(victim, {"epp-0": epp0, "epp-1": epp1})
    pages.set_replicas(tenant, {"old-epp": epp1})
    assert [r.name for r in pages.replicas(victim)] == ["epp-0"]
    assert "also named by a pool of namespace tenant" in pages.read_elsewhere(victim)["epp-1"]
    pages.set_replicas(tenant, {})
    pages.set_replicas(victim, {"epp-0": epp0})
    pages.set_replicas(other, {"epp-c": epp1})
    pages.set_replicas(victim, {"epp-0": epp0, "epp-1": epp1})
    assert pages.read_elsewhere(victim) == {
        "epp-1": f"the endpoint-picker address {epp1} of InferencePool llm/chat is read for InferencePool"
        " llm/code, which names it too"
    }
    assert pages.read_elsewhere(other) == {}

    store = Store()
    reader = gateway_reader("llm", "chat", "epp-0")
    store.record_page(Page(epp0, 1000.0, read_page(epp_page("chat", {}).encode(), reader)))
    snapshots = Snapshots(store=store, max_staleness=5.0, clock=lambda: 1000.0, gateway_pages=pages)
    spec = parse_trigger({"metric": "pending", "threshold": "4", "inferencePool": "chat"})
    decision = decide(spec, snapshots.take("llm", "chat", spec))
    # epp-0 holds nothing: without epp-1 that read 0 and inactive.
    assert isinstance(decision.error, NoData) and "epp-1" in str(decision.error), decision


class _Discovery:
    """Stands for Kubernetes discovery (a gateway trigger never asks it about pods)."""


def test_a_picker_port_is_refused_where_prometheus_reads_the_pool_instead() -> None:
    # `pending` through Prometheus never fetches the pickers' pages: a typo'd gatewayMetricsPort went unnoticed.
    import pytest

    from keda_gpu_scaler.core.errors import ConfigError

    snapshots = Snapshots(
        store=Store(),
        max_staleness=15.0,
        clock=lambda: 0.0,
        targets=_Discovery(),
        prometheus_enabled=True,  # type: ignore[arg-type]
    )
    pending = {"metric": "pending", "threshold": "1", "inferencePool": "chat", "gatewayMetricsPort": "9443"}
    with pytest.raises(ConfigError, match="gatewayMetricsPort=9443 is not read with source=prometheus"):
        snapshots.check(parse_trigger({**pending, "source": "prometheus"}))
    snapshots.check(parse_trigger(pending))  # its pickers' pages, read on that port
