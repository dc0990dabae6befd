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


def test_an_address_reused_by_another_pod_is_filed_under_the_new_pod() -> None:
    sink = RecordingSink()
    wanted = WantedPages(sink)
    wanted.want("team-a", {URL: ("team-a", "chat-0")})
    # chat-0 is gone and its IP now belongs to a pod of another namespace.
    wanted.want("team-b", {URL: ("team-b", "web-3")})
    assert sink.pages == {URL: ("team-b", "web-3")}
    assert sink.calls[-2:] == [f"remove {URL}", f"add {URL} team-b/web-3"]
    wanted.want("team-a", {})
    assert sink.pages == {URL: ("team-b", "web-3")}, "still wanted by team-b"
    wanted.release("team-b")
    assert sink.pages == {}


def test_the_same_owner_rebinding_an_address_is_read_again_under_the_new_pod() -> None:
    sink = RecordingSink()
    wanted = WantedPages(sink)
    wanted.want("a", {URL: ("llm", "chat-0")})
    wanted.want("a", {URL: ("llm", "chat-9")})
    assert sink.pages == {URL: ("llm", "chat-9")}
    wanted.release("a")
    assert sink.pages == {}
