"""Which pod pages are scraped, and under which pod each is filed, as followed triggers want them."""

from __future__ import annotations

from keda_gpu_scaler.collect.inference import WantedPages

URL = "http://10.0.0.7:8000/metrics"


class RecordingSink:
    def __init__(self) -> None:
        self.pages: dict[str, tuple[str, str]] = {}
        self.calls: list[str] = []

    def add_pod_page(self, url: str, namespace: str, pod: str) -> None:
        assert url not in self.pages, "added twice without a removal"
        self.pages[url] = (namespace, pod)
        self.calls.append(f"add {url} {namespace}/{pod}")

    def remove(self, url: str) -> None:
        self.pages.pop(url, None)
        self.calls.append(f"remove {url}")


def test_a_page_is_scraped_while_any_owner_wants_it() -> None:
    sink = RecordingSink()
    wanted = WantedPages(sink)
    wanted.want("a", {URL: ("llm", "chat-0")})
    wanted.want("b", {URL: ("llm", "chat-0")})
    wanted.release("a")
    assert sink.pages == {URL: ("llm", "chat-0")}
    wanted.want("b", {})
    assert sink.pages == {}


def test_an_address_claimed_for_two_pods_is_read_for_neither_until_one_claim_goes() -> None:
    sink = RecordingSink()
    wanted = WantedPages(sink)
    wanted.want("team-a", {URL: ("team-a", "chat-0")})
    # chat-0 is gone and its IP now belongs to a pod of another namespace, which team-a does not know yet.
    wanted.want("team-b", {URL: ("team-b", "web-3")})
    assert sink.pages == {}, "never read for either: it may be either pod's"
    assert wanted.filed_under(URL) is None
    assert sink.calls[-1] == f"remove {URL}"
    wanted.want("team-a", {})
    assert sink.pages == {URL: ("team-b", "web-3")}
    wanted.release("team-b")
    assert sink.pages == {}


def test_a_shared_address_belongs_to_the_pod_that_declares_its_port_whoever_names_it_last() -> None:
    sink = RecordingSink()
    wanted = WantedPages(sink)
    # hostNetwork pods share their node's IP: team-a's server declares port 8000.
    wanted.want("team-a", {URL: ("team-a", "chat-0")}, declared={URL})
    # team-b names 8000 as metricsPort for its own pod on the same node, which does not declare it.
    wanted.want("team-b", {URL: ("team-b", "web-3")})
    assert sink.pages == {URL: ("team-a", "chat-0")}
    assert sink.calls == [f"add {URL} team-a/chat-0"], "team-a's page was never dropped or re-filed"
    wanted.release("team-b")
    assert sink.pages == {URL: ("team-a", "chat-0")}
    # In the other order too: the last to name it does not take it.
    wanted.want("team-b", {URL: ("team-b", "web-3")})
    wanted.release("team-a")
    wanted.want("team-a", {URL: ("team-a", "chat-0")}, declared={URL})
    assert sink.pages == {URL: ("team-a", "chat-0")}


def test_the_same_owner_rebinding_an_address_is_read_again_under_the_new_pod() -> None:
    sink = RecordingSink()
    wanted = WantedPages(sink)
    wanted.want("a", {URL: ("llm", "chat-0")})
    wanted.want("a", {URL: ("llm", "chat-9")})
    assert sink.pages == {URL: ("llm", "chat-9")}
    wanted.release("a")
    assert sink.pages == {}
