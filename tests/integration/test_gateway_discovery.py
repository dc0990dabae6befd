"""Endpoint picker discovery end to end: InferencePool → Service → Ready pods, through the real client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
from fake_kube import INFERENCE_POOL, POD, SERVICE, FakeKube, inference_pool, pod, service
from support import eventually

from keda_gpu_scaler.discovery.api import KubeApi, connect
from keda_gpu_scaler.discovery.gateway import GatewayDiscovery

NS = "llm"
EPP = {"app": "chat-pool-epp"}


class Sink:
    """Records what discovery hands the gateway source, last state per pool."""

    def __init__(self) -> None:
        self.replicas: dict[tuple[str, str], dict[str, str]] = {}
        self.problems: dict[tuple[str, str], str] = {}
        self.calls = 0

    def set_replicas(self, namespace: str, pool: str, replicas: Mapping[str, str]) -> None:
        self.calls += 1
        self.problems.pop((namespace, pool), None)
        self.replicas[(namespace, pool)] = dict(replicas)

    def set_problem(self, namespace: str, pool: str, message: str) -> None:
        self.calls += 1
        self.replicas.pop((namespace, pool), None)
        self.problems[(namespace, pool)] = message

    async def has_replicas(self, expected: dict[str, str], pool: str = "chat-pool") -> None:
        async def check() -> None:
            assert self.replicas.get((NS, pool)) == expected, (self.replicas, self.problems)

        await eventually(check)

    async def has_problem(self, *needles: str, pool: str = "chat-pool") -> str:
        async def check() -> str:
            message = self.problems.get((NS, pool))
            assert message is not None, self.replicas
            for needle in needles:
                assert needle in message, message
            return message

        return await eventually(check)


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    server = FakeKube()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def api(kube: FakeKube, tmp_path: Path) -> AsyncIterator[KubeApi]:
    client = KubeApi(await connect(str(kube.kubeconfig(tmp_path))))
    yield client
    await client.close()


@pytest.fixture
async def gateways(api: KubeApi) -> AsyncIterator[tuple[GatewayDiscovery, Sink]]:
    sink = Sink()
    discovery = GatewayDiscovery(api, sink)
    yield discovery, sink
    await discovery.stop()


def epp_pod(name: str, ip: str, *, ready: bool = True, labels: dict[str, str] = EPP) -> dict[str, object]:
    return pod(name, NS, labels, "node-a", ready=ready, ip=ip, ports=[("grpc", 9002), ("metrics", 9090)])


def chat_pool(kube: FakeKube, **ref: str) -> None:
    kube.put(INFERENCE_POOL, inference_pool("chat-pool", NS, "chat-pool-epp", **ref))  # type: ignore[arg-type]
    kube.put(SERVICE, service("chat-pool-epp", NS, EPP))


async def test_ready_epp_pods_of_the_pool_s_service_are_read_and_follow_changes(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink]
) -> None:
    discovery, sink = gateways
    chat_pool(kube)
    kube.put(POD, epp_pod("epp-0", "10.0.0.1"))
    kube.put(POD, epp_pod("epp-1", "10.0.0.2", ready=False))
    kube.put(POD, epp_pod("other", "10.0.0.9", labels={"app": "something-else"}))
    discovery.want(NS, "chat-pool", "chat", 9090)
    await sink.has_replicas({"epp-0": "http://10.0.0.1:9090/metrics"})
    # A new replica turning Ready is handed over from its watch event (no re-list, no polling).
    lists = kube.count(f"/api/v1/namespaces/{NS}/pods", watch=False)
    kube.put(POD, epp_pod("epp-1", "10.0.0.2"))
    await sink.has_replicas(
        {"epp-0": "http://10.0.0.1:9090/metrics", "epp-1": "http://10.0.0.2:9090/metrics"}
    )
    assert kube.count(f"/api/v1/namespaces/{NS}/pods", watch=False) == lists
    kube.delete(POD, NS, "epp-0")
    await sink.has_replicas({"epp-1": "http://10.0.0.2:9090/metrics"})


async def test_the_trigger_s_metrics_port_is_used(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink]
) -> None:
    discovery, sink = gateways
    chat_pool(kube)
    kube.put(POD, epp_pod("epp-0", "10.0.0.1"))
    discovery.want(NS, "chat-pool", "chat", 9191)
    await sink.has_replicas({"epp-0": "http://10.0.0.1:9191/metrics"})


async def test_no_ready_epp_pod_names_the_pool(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink]
) -> None:
    discovery, sink = gateways
    chat_pool(kube)
    kube.put(POD, epp_pod("epp-0", "10.0.0.1", ready=False))
    discovery.want(NS, "chat-pool", "chat")
    await sink.has_problem("no Ready endpoint picker pod", "InferencePool llm/chat-pool", "app=chat-pool-epp")
    kube.put(POD, epp_pod("epp-0", "10.0.0.1"))
    await sink.has_replicas({"epp-0": "http://10.0.0.1:9090/metrics"})
    kube.delete(POD, NS, "epp-0")
    await sink.has_problem("no Ready endpoint picker pod", "InferencePool llm/chat-pool")


async def test_a_pool_that_does_not_exist_yet_is_read_once_created_without_a_restart(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink]
) -> None:
    discovery, sink = gateways
    kube.put(SERVICE, service("chat-pool-epp", NS, EPP))
    kube.put(POD, epp_pod("epp-0", "10.0.0.1"))
    discovery.want(NS, "chat-pool", "chat")
    await sink.has_problem("InferencePool llm/chat-pool does not exist", "namespace 'llm'")
    kube.put(INFERENCE_POOL, inference_pool("chat-pool", NS, "chat-pool-epp"))
    await sink.has_replicas({"epp-0": "http://10.0.0.1:9090/metrics"})
    kube.delete(INFERENCE_POOL, NS, "chat-pool")
    await sink.has_problem("InferencePool llm/chat-pool does not exist")


async def test_an_endpoint_picker_that_is_not_a_service_is_named_by_its_kind(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink]
) -> None:
    discovery, sink = gateways
    chat_pool(kube, kind="EndpointPicker", group="llm-d.ai")
    kube.put(POD, epp_pod("epp-0", "10.0.0.1"))
    discovery.want(NS, "chat-pool", "chat")
    await sink.has_problem("'EndpointPicker'", "of group 'llm-d.ai'", "not a Service")
    assert (NS, "chat-pool") not in sink.replicas
    # Pointed at the Service (kind left out: Service is the default), the pool is read.
    kube.put(INFERENCE_POOL, inference_pool("chat-pool", NS, "chat-pool-epp"))
    await sink.has_replicas({"epp-0": "http://10.0.0.1:9090/metrics"})


async def test_a_missing_service_and_a_service_without_selector_are_problems(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink]
) -> None:
    discovery, sink = gateways
    kube.put(INFERENCE_POOL, inference_pool("chat-pool", NS, "chat-pool-epp"))
    kube.put(POD, epp_pod("epp-0", "10.0.0.1"))
    discovery.want(NS, "chat-pool", "chat")
    await sink.has_problem("Service llm/chat-pool-epp", "does not exist")
    kube.put(SERVICE, service("chat-pool-epp", NS, None))
    await sink.has_problem("Service llm/chat-pool-epp", "no spec.selector")
    kube.put(SERVICE, service("chat-pool-epp", NS, EPP))
    await sink.has_replicas({"epp-0": "http://10.0.0.1:9090/metrics"})


async def test_only_the_scaled_object_s_namespace_is_ever_read(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink]
) -> None:
    discovery, sink = gateways
    # The pool, its Service and its pods exist only in another namespace.
    kube.put(INFERENCE_POOL, inference_pool("chat-pool", "other", "chat-pool-epp"))
    kube.put(SERVICE, service("chat-pool-epp", "other", EPP))
    kube.put(POD, pod("epp-0", "other", EPP, "node-a", ip="10.0.0.1"))
    discovery.want(NS, "chat-pool", "chat")
    await sink.has_problem("InferencePool llm/chat-pool does not exist")
    paths = {path for path, _ in kube.requests}
    assert all("/namespaces/other/" not in path for path in paths), paths
    assert all(
        not path.endswith(("/inferencepools", "/services", "/pods")) or f"/namespaces/{NS}/" in path
        for path in paths
    ), paths


async def test_rbac_denial_names_the_permission_and_recovers(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink]
) -> None:
    discovery, sink = gateways
    chat_pool(kube)
    kube.put(POD, epp_pod("epp-0", "10.0.0.1"))
    kube.deny("list", "inferencepools.inference.networking.k8s.io", NS)
    discovery.want(NS, "chat-pool", "chat")
    await sink.has_problem("list inferencepools.inference.networking.k8s.io in namespace 'llm'", "grant")
    kube.allow_all()
    await sink.has_replicas({"epp-0": "http://10.0.0.1:9090/metrics"})


async def test_watch_410_gone_relists_and_keeps_following(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink]
) -> None:
    discovery, sink = gateways
    chat_pool(kube)
    kube.put(POD, epp_pod("epp-0", "10.0.0.1"))
    discovery.want(NS, "chat-pool", "chat")
    await sink.has_replicas({"epp-0": "http://10.0.0.1:9090/metrics"})
    # Changes while the watches are down, then a compaction: the watches resume with 410 and relist.
    kube.put(POD, epp_pod("epp-1", "10.0.0.2"), notify=False)
    kube.compact()
    kube.end_watches()
    await sink.has_replicas(
        {"epp-0": "http://10.0.0.1:9090/metrics", "epp-1": "http://10.0.0.2:9090/metrics"}
    )


async def test_the_last_holder_gone_stops_the_watches(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink]
) -> None:
    discovery, sink = gateways
    chat_pool(kube)
    kube.put(POD, epp_pod("epp-0", "10.0.0.1"))
    discovery.want(NS, "chat-pool", "a")
    discovery.want(NS, "chat-pool", "b")
    await sink.has_replicas({"epp-0": "http://10.0.0.1:9090/metrics"})
    discovery.release(NS, "a")
    assert (NS, "chat-pool") in discovery.pools
    discovery.release(NS, "b")
    assert (NS, "chat-pool") not in discovery.pools

    async def watches_closed() -> None:
        kube.bookmark()  # the fake server notices a closed watch when it next writes to it
        assert not kube.watchers

    await eventually(watches_closed)


async def test_https_pages_when_the_epp_serves_tls(kube: FakeKube, api: KubeApi) -> None:
    sink = Sink()
    discovery = GatewayDiscovery(api, sink, https=True)
    try:
        chat_pool(kube)
        kube.put(POD, epp_pod("epp-0", "10.0.0.1"))
        discovery.want(NS, "chat-pool", "chat")
        await sink.has_replicas({"epp-0": "https://10.0.0.1:9090/metrics"})
    finally:
        await discovery.stop()
