"""A relist after a watch fell behind is applied in slices; readers never see it half applied.

Against the loopback API server of tests/fake_kube.py, through the real client library: a rollout
happens while the watch is away, its events are compacted, and the watch's return gets 410 Gone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fake_kube import POD, FakeKube, pod
from support import eventually

from keda_gpu_scaler.discovery.api import KubeApi, connect
from keda_gpu_scaler.discovery.informer import RELIST_SLICE, PodInformer
from keda_gpu_scaler.discovery.pods import PodInfo
from keda_gpu_scaler.discovery.selectors import parse_selector
from keda_gpu_scaler.discovery.targets import NamespaceIndex

NS = "llm"
PODS = RELIST_SLICE + 100  # a rollout bigger than one slice
APP = {"app": "vllm"}


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    server = FakeKube()
    await server.start()
    yield server
    await server.stop()


async def test_targets_read_during_a_sliced_relist_are_those_before_it_until_it_is_applied_whole(
    kube: FakeKube, tmp_path: Path
) -> None:
    for i in range(PODS):
        kube.put(POD, pod(f"old-{i}", NS, APP, "node-a"))
    api = KubeApi(await connect(str(kube.kubeconfig(tmp_path))))
    index = NamespaceIndex(NS, lambda node, delta: None)
    selection = index.acquire(parse_selector("app=vllm"), "user", {})
    seen: list[int] = []

    def on_pod(old: PodInfo | None, new: PodInfo | None) -> None:
        index.on_pod(old, new)
        seen.append(len(selection.targets(None).pods))

    informer = PodInformer(api, namespace=NS, label_selector=None, on_pod=on_pod, on_relist=index.hold)
    informer.start()
    try:

        async def listed() -> None:
            assert informer.synced and len(selection.targets(None).pods) == PODS

        await eventually(listed)
        # The watch is refused for a while; the rollout happens meanwhile and its events are compacted.
        kube.deny("watch", "pods", NS)
        kube.end_watches()

        async def refused() -> None:
            assert informer.error is not None

        await eventually(refused)
        for i in range(PODS):
            kube.delete(POD, NS, f"old-{i}")
            kube.put(POD, pod(f"new-{i}", NS, APP, "node-a"))
        kube.compact()
        seen.clear()
        kube.allow_all()

        async def relisted() -> None:
            assert selection.targets(None).pods == {f"new-{i}" for i in range(PODS)}

        await eventually(relisted)
    finally:
        await informer.stop()
        await api.close()
    # Every answer read between the relist's slices was the whole old set, never a half-applied one.
    assert len(seen) == 2 * PODS and set(seen) == {PODS}
    assert selection.complete


def test_a_selection_started_during_a_relist_is_not_complete_until_it_ends() -> None:
    index = NamespaceIndex(NS, lambda node, delta: None)
    index.hold(True)
    selection = index.acquire(parse_selector("app=vllm"), "user", {})
    assert not selection.complete
    index.hold(False)
    assert selection.complete
