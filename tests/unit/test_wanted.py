"""The one registry of wanted sources: counted owners, one handler per kind, one page per URL."""

from __future__ import annotations

import asyncio

from keda_gpu_scaler.collect.inference import pod_url
from keda_gpu_scaler.collect.wanted import (
    EppPool,
    PageBindings,
    PodPage,
    WantedSources,
    owning_pod,
    pod_page_bindings,
)

URL = "http://10.0.0.7:8000/metrics"


class Recording:
    """A kind's handler: what it was told, in order."""

    def __init__(self, wanted: WantedSources, kind: type) -> None:
        self.calls: list[str] = []
        wanted.handle(kind, lambda s: self.calls.append(f"+{s}"), lambda s: self.calls.append(f"-{s}"))


def test_a_source_is_handed_over_once_while_any_owner_wants_it() -> None:
    wanted = WantedSources()
    pools = Recording(wanted, EppPool)
    pool = EppPool("llm", "chat", 9090)
    wanted.want("trigger a", [pool])
    wanted.want("trigger b", [pool])
    assert pools.calls == [f"+{pool}"]
    wanted.release("trigger a")
    assert pools.calls == [f"+{pool}"] and wanted.wanted(pool)
    wanted.want("trigger b", [])
    assert pools.calls == [f"+{pool}", f"-{pool}"] and not wanted.wanted(pool)
    assert len(wanted) == 0


def test_each_trigger_s_port_is_a_source_of_its_own() -> None:
    """Two triggers on one pool with different ports: each reads its own, one's typo never the other's."""
    wanted = WantedSources()
    wanted.want("good", [EppPool("llm", "chat", 9090)])
    wanted.want("typo", [EppPool("llm", "chat", 9)])
    assert sorted(p.port for p in wanted.of_kind(EppPool)) == [9, 9090]
    wanted.release("typo")
    assert wanted.of_kind(EppPool) == [EppPool("llm", "chat", 9090)]


def test_sources_wanted_before_a_handler_exists_are_handed_to_it() -> None:
    wanted = WantedSources()
    wanted.want("trigger", [EppPool("llm", "chat", 9090)])
    pools = Recording(wanted, EppPool)
    assert pools.calls == ["+EppPool(namespace='llm', pool='chat', port=9090)"]


async def test_a_collector_waiting_wakes_when_a_source_becomes_wanted() -> None:
    wanted = WantedSources()
    waiter = asyncio.ensure_future(wanted.wait_until_wanted(30, "not this one"))
    await asyncio.sleep(0)
    assert not waiter.done()
    wanted.want("trigger", [EppPool("llm", "chat", 9090)])
    await asyncio.wait_for(waiter, timeout=5)


class Sink:
    def __init__(self) -> None:
        self.pages: dict[str, tuple[str, str]] = {}
        self.calls: list[str] = []

    def bind(self, page: PodPage) -> None:
        assert page.url not in self.pages, "added twice without a removal"
        self.pages[page.url] = (page.namespace, page.pod)
        self.calls.append(f"add {page.url} {page.namespace}/{page.pod}")

    def unbind(self, url: str) -> None:
        del self.pages[url]
        self.calls.append(f"remove {url}")


def pod_pages() -> tuple[WantedSources, Sink, PageBindings[PodPage]]:
    wanted, sink = WantedSources(), Sink()
    bindings = PageBindings(sink.bind, sink.unbind, owning_pod)
    wanted.handle(PodPage, bindings.added, bindings.removed)
    return wanted, sink, bindings


def test_an_address_claimed_for_two_pods_is_read_for_neither_until_one_claim_goes() -> None:
    wanted, sink, bindings = pod_pages()
    wanted.want("team-a", [PodPage(URL, "team-a", "chat-0")])
    # chat-0 is gone and its IP now belongs to a pod of another namespace, which team-a does not know yet.
    wanted.want("team-b", [PodPage(URL, "team-b", "web-3")])
    assert sink.pages == {}, "never read for either: it may be either pod's"
    assert bindings.bound(URL) is None
    assert sink.calls[-1] == f"remove {URL}"
    wanted.want("team-a", [])
    assert sink.pages == {URL: ("team-b", "web-3")}
    wanted.release("team-b")
    assert sink.pages == {}


def test_a_shared_address_belongs_to_the_pod_that_declares_its_port_whoever_names_it_last() -> None:
    wanted, sink, _ = pod_pages()
    # hostNetwork pods share their node's IP: team-a's server declares port 8000.
    wanted.want("team-a", [PodPage(URL, "team-a", "chat-0", declared=True)])
    # team-b names 8000 as metricsPort for its own pod on the same node, which does not declare it.
    wanted.want("team-b", [PodPage(URL, "team-b", "web-3", declared=False)])
    assert sink.pages == {URL: ("team-a", "chat-0")}
    assert sink.calls == [f"add {URL} team-a/chat-0"], "team-a's page was never dropped or re-filed"
    wanted.release("team-b")
    assert sink.pages == {URL: ("team-a", "chat-0")}
    # In the other order too: the last to name it does not take it.
    wanted.want("team-b", [PodPage(URL, "team-b", "web-3", declared=False)])
    wanted.release("team-a")
    wanted.want("team-a", [PodPage(URL, "team-a", "chat-0", declared=True)])
    assert sink.pages == {URL: ("team-a", "chat-0")}


def test_the_same_owner_rebinding_an_address_is_read_again_under_the_new_pod() -> None:
    wanted, sink, _ = pod_pages()
    wanted.want("a", [PodPage(URL, "llm", "chat-0")])
    wanted.want("a", [PodPage(URL, "llm", "chat-9")])
    assert sink.pages == {URL: ("llm", "chat-9")}
    assert sink.calls == [f"add {URL} llm/chat-0", f"remove {URL}", f"add {URL} llm/chat-9"]
    wanted.release("a")
    assert sink.pages == {}


def test_every_path_at_a_shared_address_is_read_only_for_the_pod_that_owns_it() -> None:
    """The server at an address answers whatever path it likes (vLLM serves its page at every path starting
    with /metrics): naming another path there never reads it for another pod."""
    wanted, sink = WantedSources(), Sink()
    bindings = pod_page_bindings(sink.bind, sink.unbind, pod_ips=True)
    wanted.handle(PodPage, bindings.added, bindings.removed)
    other_path, own_second = "http://10.0.0.7:8000/metrics/", "http://10.0.0.7:8000/engine_metrics"
    wanted.want("team-a", [PodPage(URL, "team-a", "chat-0", declared=True)])
    wanted.want("team-b", [PodPage(other_path, "team-b", "web-3", declared=False)])
    assert sink.pages == {URL: ("team-a", "chat-0")} and bindings.bound(other_path) is None
    # In the other order too.
    wanted.release("team-a")
    wanted.want("team-a", [PodPage(URL, "team-a", "chat-0", declared=True)])
    assert sink.pages == {URL: ("team-a", "chat-0")}
    # The owning pod reads every page it names there (one trigger per path).
    wanted.want("team-a second", [PodPage(own_second, "team-a", "chat-0", declared=True)])
    assert sink.pages == {URL: ("team-a", "chat-0"), own_second: ("team-a", "chat-0")}
    wanted.release("team-a second")
    assert sink.pages == {URL: ("team-a", "chat-0")}
    # Another port of the shared IP is another address.
    wanted.want("team-b", [PodPage("http://10.0.0.7:9000/metrics", "team-b", "web-3", declared=True)])
    assert sink.pages == {URL: ("team-a", "chat-0"), "http://10.0.0.7:9000/metrics": ("team-b", "web-3")}


def test_without_pod_ips_each_url_of_the_operator_is_its_own() -> None:
    """--inference-url: two pages behind one address (a proxy) are read for the pods the operator named."""
    wanted, sink = WantedSources(), Sink()
    bindings = pod_page_bindings(sink.bind, sink.unbind, pod_ips=False)
    wanted.handle(PodPage, bindings.added, bindings.removed)
    first, second = "http://proxy:9000/a/metrics", "http://proxy:9000/b/metrics"
    wanted.want("flags", [PodPage(first, "team-a", "chat-0"), PodPage(second, "team-b", "web-3")])
    assert sink.pages == {first: ("team-a", "chat-0"), second: ("team-b", "web-3")}


def test_a_pod_page_is_keyed_on_the_url_as_it_is_fetched() -> None:
    """The HTTP client removes dot segments and decodes escaped letters before it sends a path: the claim on
    a page is on the URL as it goes out, so another spelling is never another page."""
    for path in ("/metrics", "/x/../metrics", "/./metrics", "/%6detrics"):
        assert pod_url("10.0.0.7", 8000, path) == URL, path
    assert pod_url("fd00::7", 8000, "/a/./b") == "http://[fd00::7]:8000/a/b"
