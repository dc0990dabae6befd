"""A relist after a watch fell behind is applied in slices; readers never see it half applied."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from keda_gpu_scaler.core.selectors import parse_selector
from keda_gpu_scaler.kubernetes.api import Gone
from keda_gpu_scaler.kubernetes.informer import RELIST_SLICE, PodInformer
from keda_gpu_scaler.kubernetes.targets import NamespaceIndex

PODS = RELIST_SLICE + 100  # a rollout bigger than one slice


def pod(name: str, version: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "llm", "name": name, "labels": {"app": "vllm", "v": version}},
        "spec": {"nodeName": "node-a", "containers": [{"ports": [{"containerPort": 8000}]}]},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


class ListThenGone:
    """The API's side of a rollout done while the watch was away: the first list shows the old pods,
    the watch then answers 410 Gone, and the next list shows only the new ones."""

    def __init__(self) -> None:
        self.lists = [
            [pod(f"old-{i}", "1") for i in range(PODS)],
            [pod(f"new-{i}", "2") for i in range(PODS)],
        ]
        self.listed = asyncio.Event()
        self.watches = 0

    async def list_pods(self, namespace: str | None, label_selector: str | None) -> dict[str, Any]:
        items = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
        return {"metadata": {"resourceVersion": "7"}, "items": items}

    async def watch_pods(
        self, *args: Any, on_open: Callable[[], None] = lambda: None, **kwargs: Any
    ) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        if self.watches == 1:
            raise Gone("too old resource version")
        self.listed.set()
        await asyncio.Event().wait()
        yield {}  # pragma: no cover


async def test_targets_read_during_a_sliced_relist_are_those_before_it_until_it_is_applied_whole() -> None:
    api = ListThenGone()
    index = NamespaceIndex("llm")
    seen: list[int] = []

    def on_pod(old: Any, new: Any) -> None:
        index.on_pod(old, new)
        if selection is not None:
            seen.append(len(selection.targets(None).pods))

    selection = None
    informer = PodInformer(api, namespace="llm", label_selector=None, on_pod=on_pod, on_relist=index.hold)  # type: ignore[arg-type]
    selection = index.acquire(parse_selector("app=vllm"), "user", informer.pods)
    informer.start()
    try:
        await asyncio.wait_for(api.listed.wait(), 10)
    finally:
        await informer.stop()
    # The first list, applied in slices too, answered the empty set until it was whole; the relist
    # answered the whole old set between its slices; afterwards, the whole new one.
    first, relist = seen[:PODS], seen[PODS:]
    assert set(first) == {0}
    assert len(relist) == 2 * PODS and set(relist) == {PODS}
    assert selection.targets(None).pods == {f"new-{i}" for i in range(PODS)}
    assert selection.complete


def test_a_selection_started_during_a_relist_is_not_complete_until_it_ends() -> None:
    index = NamespaceIndex("llm")
    index.hold(True)
    selection = index.acquire(parse_selector("app=vllm"), "user", {})
    assert not selection.complete
    index.hold(False)
    assert selection.complete
