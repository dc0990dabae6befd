"""A scale target with replicas but no pod is told from one scaled to zero (SPEC §4) only by a /scale read
that began after its last pod went: KEDA writes /scale first, then the pods go."""

from __future__ import annotations

from keda_gpu_scaler.core.selectors import parse_selector
from keda_gpu_scaler.kubernetes.followed import Followed
from keda_gpu_scaler.kubernetes.pods import pod_info
from keda_gpu_scaler.kubernetes.targets import NamespaceIndex


def running(name: str) -> dict[str, object]:
    return {
        "metadata": {"namespace": "llm", "name": name, "labels": {"app": "vllm"}},
        "spec": {"nodeName": "node-a"},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_a_read_that_began_before_the_last_pod_went_does_not_count_its_replicas() -> None:
    index = NamespaceIndex("llm")
    tracked = Followed("llm", "vllm")
    selection = index.acquire(parse_selector("app=vllm"), tracked, {})
    pod = pod_info(running("vllm-0"))
    assert index.on_pod(None, pod) == []  # a pod came: nothing emptied
    tracked.replicas, tracked.replicas_read_at = 1, 0.0  # read while the pod ran (any time before it went)
    assert index.on_pod(pod, None) == [selection]  # its last pod went: the caller reads /scale again
    assert not selection.has_pods
    assert tracked.replicas_since(selection.emptied_at) is None  # maybe scaled to zero since: not known
    tracked.replicas_read_at = selection.emptied_at + 0.001  # read again after: 1 replica and no pod
    assert tracked.replicas_since(selection.emptied_at) == 1


def test_a_selection_that_never_had_a_pod_takes_any_read() -> None:
    index = NamespaceIndex("llm")
    tracked = Followed("llm", "vllm")
    selection = index.acquire(parse_selector("app=vllm"), tracked, {})
    tracked.replicas, tracked.replicas_read_at = 2, 0.0
    assert tracked.replicas_since(selection.emptied_at) == 2
