"""The scale target's /scale while it cannot be read (SPEC §4): with no pod its replicas are not known, so
nothing is 0; and a ScaledObject created again with another scaleTargetRef never reads its old target's
pods. Kubernetes is the fake API server (tests/fake_kube.py) speaking the real wire format."""

from __future__ import annotations

from fake_kube import DEPLOYMENT, SCALED_OBJECT, STATEFULSET, FakeKube, deployment, scaled_object
from support import eventually
from test_kubernetes import (
    APP,
    NS,
    _equals,
    cluster,
    external,
    kube_scaler,
    serving_one_pod,
    unavailable,
    value,
)

__all__ = ["cluster", "kube_scaler"]  # fixtures shared with test_kubernetes

OTHER = {"app": "other"}


async def test_no_pod_while_the_scale_target_cannot_be_read_is_not_zero(
    cluster, kube: FakeKube, kube_scaler
) -> None:  # type: ignore[no-untyped-def]
    """The Deployment asks for 1 replica; its pod is evicted (the new one refused by a quota) while its
    /scale cannot be read (an RBAC roll-out): 0 and inactive were answered for as long as that lasted."""
    scaler = await serving_one_pod(cluster, kube_scaler)
    scale = f"/apis/apps/v1/namespaces/{NS}/deployments/vllm/scale"
    kube.deny("get", "deployments/scale.apps", NS)
    cluster.remove("vllm-0")
    before = kube.count(scale)

    async def refused_twice_since() -> None:
        assert kube.count(scale) >= before + 2

    await eventually(refused_twice_since)
    for _ in range(3):
        await unavailable(scaler, "no pod")  # GetMetrics and IsActive alike


async def test_a_scaledobject_created_again_for_another_target_never_reads_the_old_ones_pods(  # type: ignore[no-untyped-def]
    cluster, kube: FakeKube, kube_scaler
) -> None:
    """Deleted and created again (kubectl delete + apply, a GitOps replace) for a StatefulSet whose /scale
    cannot be read yet: it was answered from the Deployment's pod (40) through the old selector."""
    await cluster.gpu_node("node-a")
    kube.put(DEPLOYMENT, deployment("vllm", NS, APP, replicas=1))
    kube.put(STATEFULSET, deployment("other", NS, OTHER, replicas=1))
    kube.put(SCALED_OBJECT, scaled_object("vllm", NS, {"name": "vllm"}, [external()]))
    cluster.run("vllm-0", "node-a", 40)
    cluster.run("other-0", "node-a", 90, labels=OTHER)
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler), 40))
    kube.deny("get", "statefulsets/scale.apps", NS)
    kube.delete(SCALED_OBJECT, NS, "vllm")
    await eventually(lambda: unavailable(scaler))
    target = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "other"}
    kube.put(SCALED_OBJECT, scaled_object("vllm", NS, target, [external()]))
    scale = f"/apis/apps/v1/namespaces/{NS}/statefulsets/other/scale"

    async def tried_twice() -> None:
        assert kube.count(scale) >= 2

    await eventually(tried_twice)
    for _ in range(3):
        await unavailable(scaler)  # its selector is not known yet: never the old target's pods
    kube.allow_all()  # readable again: the StatefulSet's own pod
    await eventually(lambda: _equals(value(scaler), 90))
