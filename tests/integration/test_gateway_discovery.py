"""Endpoint picker discovery end to end: InferencePool → Service → Ready pods, through the real client."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import fake_kube
import pytest
from aiohttp import web
from certs import CertificateAuthority
from fake_kube import (
    DEPLOYMENT,
    INFERENCE_POOL,
    POD,
    SCALED_OBJECT,
    SERVICE,
    FakeKube,
    deployment,
    inference_pool,
    pod,
    scaled_object,
    service,
)
from support import eventually

from keda_gpu_scaler.collect.wanted import EppPool
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.kubernetes.api import KubeApi, connect
from keda_gpu_scaler.kubernetes.gateway import GatewayDiscovery

NS = "llm"
EPP = {"app": "chat-pool-epp"}


class Sink:
    """Records what discovery hands the gateway source, last state per pool."""

    def __init__(self) -> None:
        self.replicas: dict[tuple[str, str], dict[str, str]] = {}
        self.unreachable: dict[tuple[str, str], dict[str, str]] = {}  # Ready replicas it cannot reach
        self.problems: dict[tuple[str, str], str] = {}
        self.absent: set[tuple[str, str]] = set()  # pools said not to exist (a typo, not "nothing pending")
        self.forgotten: list[tuple[str, str]] = []
        self.calls = 0

    def set_replicas(
        self, pool: EppPool, replicas: Mapping[str, str], unreachable: Mapping[str, str] | None = None
    ) -> None:
        self.calls += 1
        self.problems.pop((pool.namespace, pool.pool), None)
        self.replicas[(pool.namespace, pool.pool)] = dict(replicas)
        self.unreachable[(pool.namespace, pool.pool)] = dict(unreachable or {})

    def set_problem(self, pool: EppPool, message: str, *, absent: bool = False) -> None:
        self.calls += 1
        (self.absent.add if absent else self.absent.discard)((pool.namespace, pool.pool))
        self.replicas.pop((pool.namespace, pool.pool), None)
        self.problems[(pool.namespace, pool.pool)] = message

    def forget(self, pool: EppPool) -> None:
        self.replicas.pop((pool.namespace, pool.pool), None)
        self.problems.pop((pool.namespace, pool.pool), None)
        self.forgotten.append((pool.namespace, pool.pool))

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
async def api(kube: FakeKube, tmp_path: Path) -> AsyncIterator[KubeApi]:
    client = KubeApi(await connect(str(kube.kubeconfig(tmp_path))))
    yield client
    await client.close()


async def plain_http(host: str, port: int) -> bool:
    """The TLS probe for pods at addresses that are not there: every EPP serves plain HTTP."""
    return False


@pytest.fixture
async def gateways(api: KubeApi) -> AsyncIterator[tuple[GatewayDiscovery, Sink]]:
    sink = Sink()
    discovery = GatewayDiscovery(api, sink, probe=plain_http)
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
    discovery.set_wanted([EppPool(NS, "chat-pool", 9090)])
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
    discovery.set_wanted([EppPool(NS, "chat-pool", 9191)])
    await sink.has_replicas({"epp-0": "http://10.0.0.1:9191/metrics"})


async def test_no_ready_epp_pod_names_the_pool(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink]
) -> None:
    discovery, sink = gateways
    chat_pool(kube)
    kube.put(POD, epp_pod("epp-0", "10.0.0.1", ready=False))
    discovery.set_wanted([EppPool(NS, "chat-pool", 9090)])
    await sink.has_problem("no Ready endpoint picker pod", "InferencePool llm/chat-pool", "app=chat-pool-epp")
    kube.put(POD, epp_pod("epp-0", "10.0.0.1"))
    await sink.has_replicas({"epp-0": "http://10.0.0.1:9090/metrics"})
    kube.delete(POD, NS, "epp-0")
    await sink.has_problem("no Ready endpoint picker pod", "InferencePool llm/chat-pool")


async def test_a_ready_epp_pod_that_cannot_be_reached_is_handed_on_as_one_that_cannot_be_read(
    kube: FakeKube, api: KubeApi
) -> None:
    async def refused_at_10_0_0_2(host: str, port: int) -> bool:
        if host == "10.0.0.2":
            raise ConnectionRefusedError(111, "Connection refused")
        return False

    sink = Sink()
    discovery = GatewayDiscovery(api, sink, probe=refused_at_10_0_0_2)
    try:
        chat_pool(kube)
        kube.put(POD, epp_pod("epp-0", "10.0.0.1"))
        kube.put(POD, epp_pod("epp-1", "10.0.0.2"))
        discovery.set_wanted([EppPool(NS, "chat-pool", 9090)])
        await sink.has_replicas({"epp-0": "http://10.0.0.1:9090/metrics"})

        async def unread() -> None:
            why = sink.unreachable.get((NS, "chat-pool"), {}).get("epp-1", "")
            assert "not reachable on metrics port 9090" in why, sink.unreachable
            assert "Connection refused" in why, sink.unreachable

        await eventually(unread)
        kube.delete(POD, NS, "epp-1")  # gone: no longer a replica of the pool at all

        async def gone() -> None:
            assert sink.unreachable.get((NS, "chat-pool")) == {}, sink.unreachable

        await eventually(gone)
    finally:
        await discovery.stop()


async def test_a_pool_that_does_not_exist_yet_is_read_once_created_without_a_restart(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink]
) -> None:
    discovery, sink = gateways
    kube.put(SERVICE, service("chat-pool-epp", NS, EPP))
    kube.put(POD, epp_pod("epp-0", "10.0.0.1"))
    discovery.set_wanted([EppPool(NS, "chat-pool", 9090)])
    await sink.has_problem("InferencePool llm/chat-pool does not exist", "namespace 'llm'")
    assert ("llm", "chat-pool") in sink.absent
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
    discovery.set_wanted([EppPool(NS, "chat-pool", 9090)])
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
    discovery.set_wanted([EppPool(NS, "chat-pool", 9090)])
    await sink.has_problem("Service llm/chat-pool-epp", "does not exist")
    assert ("llm", "chat-pool") not in sink.absent  # the pool exists: its trigger keeps its SPEC answer
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
    discovery.set_wanted([EppPool(NS, "chat-pool", 9090)])
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
    discovery.set_wanted([EppPool(NS, "chat-pool", 9090)])
    await sink.has_problem("list inferencepools.inference.networking.k8s.io in namespace 'llm'", "grant")
    kube.allow_all()
    await sink.has_replicas({"epp-0": "http://10.0.0.1:9090/metrics"})


async def test_watch_410_gone_relists_and_keeps_following(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink]
) -> None:
    discovery, sink = gateways
    chat_pool(kube)
    kube.put(POD, epp_pod("epp-0", "10.0.0.1"))
    discovery.set_wanted([EppPool(NS, "chat-pool", 9090)])
    await sink.has_replicas({"epp-0": "http://10.0.0.1:9090/metrics"})
    # Changes while the watches are down, then a compaction: the watches resume with 410 and relist.
    kube.put(POD, epp_pod("epp-1", "10.0.0.2"), notify=False)
    kube.compact()
    kube.end_watches()
    await sink.has_replicas(
        {"epp-0": "http://10.0.0.1:9090/metrics", "epp-1": "http://10.0.0.2:9090/metrics"}
    )


async def test_a_pool_no_longer_wanted_stops_its_watches_and_is_forgotten(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink]
) -> None:
    discovery, sink = gateways
    chat_pool(kube)
    kube.put(POD, epp_pod("epp-0", "10.0.0.1"))
    discovery.set_wanted([EppPool(NS, "chat-pool", 9090)])
    await sink.has_replicas({"epp-0": "http://10.0.0.1:9090/metrics"})
    discovery.set_wanted([])
    assert (NS, "chat-pool") not in discovery.pools
    assert sink.forgotten == [(NS, "chat-pool")]

    async def watches_closed() -> None:
        kube.bookmark()  # the fake server notices a closed watch when it next writes to it
        assert not kube.watchers

    await eventually(watches_closed)


class _TlsServer:
    """A loopback page server over HTTPS with a certificate from a test CA."""

    def __init__(self, tmp_path: Path) -> None:
        self.ca = CertificateAuthority()
        issued = self.ca.issue("epp", ["127.0.0.1"])
        (tmp_path / "epp.crt").write_bytes(issued.cert_pem)
        (tmp_path / "epp.key").write_bytes(issued.key_pem)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(tmp_path / "epp.crt", tmp_path / "epp.key")


async def _serve(ssl_context: ssl.SSLContext | None, port: int = 0) -> tuple[web.AppRunner, int]:
    async def page(_: web.Request) -> web.Response:
        return web.Response(text="# an endpoint picker\n")

    app = web.Application()
    app.router.add_get("/metrics", page)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context).start()
    return runner, runner.addresses[0][1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_https_exactly_where_the_epp_serves_tls(kube: FakeKube, api: KubeApi, tmp_path: Path) -> None:
    tls = _TlsServer(tmp_path)
    secure, secure_port = await _serve(tls.context)
    plain, plain_port = await _serve(None)
    sink = Sink()
    discovery = GatewayDiscovery(api, sink)  # the real probe: a TLS handshake with each EPP address
    try:
        kube.put(INFERENCE_POOL, inference_pool("chat-pool", NS, "chat-pool-epp"))
        kube.put(INFERENCE_POOL, inference_pool("code-pool", NS, "code-pool-epp"))
        kube.put(SERVICE, service("chat-pool-epp", NS, EPP))
        kube.put(SERVICE, service("code-pool-epp", NS, {"app": "code-pool-epp"}))
        kube.put(POD, epp_pod("epp-chat", "127.0.0.1"))
        kube.put(POD, epp_pod("epp-code", "127.0.0.1", labels={"app": "code-pool-epp"}))
        discovery.set_wanted([EppPool(NS, "chat-pool", secure_port), EppPool(NS, "code-pool", plain_port)])
        await sink.has_replicas({"epp-chat": f"https://127.0.0.1:{secure_port}/metrics"})
        await sink.has_replicas({"epp-code": f"http://127.0.0.1:{plain_port}/metrics"}, pool="code-pool")
    finally:
        await discovery.stop()
        await secure.cleanup()
        await plain.cleanup()


async def test_an_epp_not_listening_yet_is_a_problem_until_it_answers(kube: FakeKube, api: KubeApi) -> None:
    port = _free_port()
    sink = Sink()
    discovery = GatewayDiscovery(api, sink)
    runner: web.AppRunner | None = None
    try:
        chat_pool(kube)
        kube.put(POD, epp_pod("epp-0", "127.0.0.1"))
        discovery.set_wanted([EppPool(NS, "chat-pool", port)])
        await sink.has_problem("not reachable on metrics port", f"cannot connect to 127.0.0.1:{port}")
        assert (NS, "chat-pool") not in sink.replicas
        runner, _ = await _serve(None, port)
        await sink.has_replicas({"epp-0": f"http://127.0.0.1:{port}/metrics"})
    finally:
        await discovery.stop()
        if runner is not None:
            await runner.cleanup()


# --- through the running scaler: the pools that triggers want, in followed namespaces only --------------


async def test_the_scaler_reads_the_wanted_pools_of_followed_namespaces_only(
    make_scaler: Callable[..., Awaitable[Any]], kube: FakeKube, tmp_path: Path
) -> None:
    page, port = await _serve(None)
    try:
        scaler = await make_scaler(
            kubernetes="on", kubeconfig=str(kube.kubeconfig(tmp_path)), discovery_interval=0.2
        )
        app = scaler.app
        chat_pool(kube)
        kube.put(POD, epp_pod("epp-0", "127.0.0.1"))
        # The same pool and picker in a namespace where no ScaledObject is followed.
        kube.put(INFERENCE_POOL, inference_pool("chat-pool", "other", "chat-pool-epp"))
        kube.put(SERVICE, service("chat-pool-epp", "other", EPP))
        # A ScaledObject of namespace llm, followed once a call names it.
        kube.put(DEPLOYMENT, deployment("vllm", NS, {"app": "vllm"}, replicas=0))
        kube.put(
            SCALED_OBJECT,
            scaled_object(
                "vllm", NS, {"name": "vllm"}, [{"type": "external", "metadata": {"threshold": "70"}}]
            ),
        )
        pending = {"metric": "pending", "threshold": "4", "inferencePool": "chat-pool"}
        spec = parse_trigger({**pending, "gatewayMetricsPort": str(port)})
        app.registry.follow(NS, "vllm", spec)  # as every call does
        app.registry.follow("other", "vllm", spec)  # no such ScaledObject there
        pool = EppPool(NS, "chat-pool", port)

        async def read() -> None:
            replicas = app.gateway_pages.replicas(pool)
            assert [(r.name, r.url) for r in replicas] == [("epp-0", f"http://127.0.0.1:{port}/metrics")], (
                app.gateway_pages.problem(pool)
            )

        await eventually(read)
        assert not [path for path, _ in kube.requests if "/namespaces/other/inference" in path]
        assert app.gateway_pages.replicas(EppPool("other", "chat-pool", port)) == ()
    finally:
        await page.cleanup()


async def test_an_api_server_without_inference_pools_says_to_install_them(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cluster without the Gateway API Inference Extension: the API server does not know the resource.
    monkeypatch.setattr(fake_kube, "KINDS", tuple(k for k in fake_kube.KINDS if k is not INFERENCE_POOL))
    discovery, sink = gateways
    discovery.set_wanted([EppPool(NS, "chat-pool", 9090)])
    await sink.has_problem(
        "cannot read InferencePool llm/chat-pool", "inferencepools.inference.networking.k8s.io", "installed"
    )


async def test_a_tls_probe_ends_with_the_pool_it_probed(kube: FakeKube, api: KubeApi) -> None:
    """An EPP address that never answers is retried while its pool is wanted, and no longer after."""
    port = _free_port()
    sink = Sink()
    discovery = GatewayDiscovery(api, sink)  # the real probe: nothing listens at the port

    def probing() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if t.get_name() == f"TLS probe 127.0.0.1:{port}"]

    try:
        chat_pool(kube)
        kube.put(POD, epp_pod("epp-0", "127.0.0.1"))
        discovery.set_wanted([EppPool(NS, "chat-pool", port)])
        await sink.has_problem("not reachable on metrics port", f"cannot connect to 127.0.0.1:{port}")
        assert probing()
        discovery.set_wanted([])

        async def ended() -> None:
            assert not probing()

        await eventually(ended)
    finally:
        await discovery.stop()


async def test_a_pool_name_matching_no_pool_names_the_pools_that_exist(
    kube: FakeKube, gateways: tuple[GatewayDiscovery, Sink]
) -> None:
    discovery, sink = gateways
    kube.put(INFERENCE_POOL, inference_pool("code-pool", NS, "code-pool-epp"))
    kube.put(INFERENCE_POOL, inference_pool("chat-pool", NS, "chat-pool-epp"))
    discovery.set_wanted([EppPool(NS, "chat-pol", 9090)])
    # The closest first: the trigger most likely meant chat-pool.
    await sink.has_problem("does not exist", "those that exist: chat-pool, code-pool", pool="chat-pol")
    assert ("llm", "chat-pol") in sink.absent


async def test_a_pod_ip_another_namespaces_picker_reuses_gets_its_own_scheme(
    kube: FakeKube, api: KubeApi
) -> None:
    # a's picker at 10.0.0.7 serves plain HTTP and is Terminating; b's new picker gets the same IP and
    # serves HTTPS. Probes were shared by address: b was handed a's http, and kept it once a's pod went.
    serves_tls = {"a": False, "b": True}
    asked: list[str] = []

    async def probe(host: str, port: int) -> bool:
        asked.append(host)
        return serves_tls["b" if len(asked) > 1 else "a"]

    sink = Sink()
    discovery = GatewayDiscovery(api, sink, probe=probe)
    try:
        for namespace in ("a", "b"):
            kube.put(INFERENCE_POOL, inference_pool("chat-pool", namespace, "chat-pool-epp"))
            kube.put(SERVICE, service("chat-pool-epp", namespace, {"app": f"epp-{namespace}"}))
        a_pod = pod("epp-a", "a", {"app": "epp-a"}, "node-a", ip="10.0.0.7", ports=[("metrics", 9090)])
        kube.put(POD, a_pod)
        discovery.set_wanted([EppPool("a", "chat-pool", 9090), EppPool("b", "chat-pool", 9090)])

        async def a_read() -> None:
            assert sink.replicas.get(("a", "chat-pool")) == {"epp-a": "http://10.0.0.7:9090/metrics"}

        await eventually(a_read)
        kube.put(POD, pod("epp-b", "b", {"app": "epp-b"}, "node-b", ip="10.0.0.7", ports=[("metrics", 9090)]))

        async def b_https() -> None:
            assert sink.replicas.get(("b", "chat-pool")) == {"epp-b": "https://10.0.0.7:9090/metrics"}

        await eventually(b_https)
    finally:
        await discovery.stop()
