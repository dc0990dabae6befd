"""A shared pod IP (hostNetwork pods share their node's), through the loopback API server and real pages:
a page is read for the pod that owns its address at that port, never across namespaces."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from fake_kube import DEPLOYMENT, POD, SCALED_OBJECT, FakeKube, deployment, pod, scaled_object
from support import eventually

from keda_gpu_scaler.core.selectors import parse_exporter_selector
from keda_gpu_scaler.demo.engines import EngineLoad, vllm_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

REQUESTS = {"metric": "requests", "threshold": "8"}


def request(namespace: str, metadata: dict[str, str]) -> pb.GetMetricsRequest:
    ref = pb.ScaledObjectRef(name="chat", namespace=namespace, scalerMetadata=metadata)
    return pb.GetMetricsRequest(scaledObjectRef=ref, metricName="inference-requests")


async def outcome(scaler: Any, namespace: str, metadata: dict[str, str]) -> float | str:
    try:
        response = await scaler.stub.GetMetrics(request(namespace, metadata))
    except grpc.aio.AioRpcError as error:
        return error.code().name
    return float(response.metricValues[0].metricValueFloat)


async def test_a_tenant_naming_anothers_port_neither_reads_its_load_nor_blinds_it(
    kube: FakeKube, make_exporter, make_scaler, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # Both pods have IP 127.0.0.1, as hostNetwork pods on one node: each declares its own server's port.
    server_a = await make_exporter(vllm_page("llama", [EngineLoad(30, 12, 0.5)]))  # tenant A: 42
    server_b = await make_exporter(vllm_page("llama", [EngineLoad(1, 0, 0.1)]))  # tenant B: 1
    stolen = {**REQUESTS, "metricsPort": str(server_a.port)}  # tenant B names A's port as its own
    for namespace, server, metadata in (("team-a", server_a, REQUESTS), ("team-b", server_b, stolen)):
        kube.put(DEPLOYMENT, deployment("chat", namespace, {"app": "chat"}))
        trigger = {"type": "external", "metadata": metadata}
        kube.put(SCALED_OBJECT, scaled_object("chat", namespace, {"name": "chat"}, [trigger]))
        kube.put(POD, pod("chat-0", namespace, {"app": "chat"}, "node-a", ports=[("http", server.port)]))
    scaler = await make_scaler(
        kubernetes="on",
        kubeconfig=str(kube.kubeconfig(tmp_path)),
        exporter_selectors=(parse_exporter_selector("app=none:metrics"),),
        discovery_interval=0.2,
    )

    async def reads(namespace: str, metadata: dict[str, str], expected: float | str) -> None:
        assert await outcome(scaler, namespace, metadata) == expected

    await eventually(lambda: reads("team-a", REQUESTS, 42.0))
    # Tenant B names A's port as its metricsPort (its own pod does not declare it).
    before = server_a.requests
    await outcome(scaler, "team-b", stolen)

    async def b_asked_and_a_page_scraped_since() -> None:
        follows = scaler.app.registry.get("team-b", "chat")
        assert follows is not None and len(follows.triggers) == 1
        assert server_a.requests > before + 2

    await eventually(b_asked_and_a_page_scraped_since)
    # B never reads A's load (its pod has no page it owns: UNAVAILABLE), and A keeps reading its own.
    for _ in range(5):
        assert await outcome(scaler, "team-b", stolen) == "UNAVAILABLE"
        assert await outcome(scaler, "team-a", REQUESTS) == 42.0
    followed_b = scaler.app.registry.get("team-b", "chat")
    assert followed_b is not None
    assert any("is not read for it" in note for note in followed_b.notes_logged)


@pytest.fixture
async def prefix_server() -> AsyncIterator[Callable[[str], Awaitable[int]]]:
    """Servers that answer their page at every path starting with /metrics, as vLLM's does (its route is
    `^/metrics(?P<path>.*)$`): what port they listen at."""
    runners: list[web.AppRunner] = []

    async def start(page: str) -> int:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=page, content_type="text/plain")

        app = web.Application()
        app.router.add_get(r"/metrics{tail:.*}", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return int(runner.addresses[0][1])

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        # Other spellings of /metrics, as the client sends them: refused for what they are.
        ("/x/../metrics", "INVALID_ARGUMENT"),
        ("/./metrics", "INVALID_ARGUMENT"),
        ("/%6detrics", "INVALID_ARGUMENT"),
        # Another path the same server answers with the same page: the address is team-a's pod's.
        ("/metrics/", "UNAVAILABLE"),
        ("/metricsz", "UNAVAILABLE"),
    ],
)
async def test_another_path_to_anothers_port_never_reads_its_page(
    kube: FakeKube, prefix_server, make_scaler, tmp_path: Path, path: str, expected: str
) -> None:  # type: ignore[no-untyped-def]
    port_a = await prefix_server(vllm_page("llama", [EngineLoad(30, 12, 0.5)]))  # tenant A: 42
    port_b = await prefix_server(vllm_page("llama", [EngineLoad(1, 0, 0.1)]))  # tenant B: 1
    stolen = {**REQUESTS, "metricsPort": str(port_a), "metricsPath": path}
    for namespace, port, metadata in (("team-a", port_a, REQUESTS), ("team-b", port_b, stolen)):
        kube.put(DEPLOYMENT, deployment("chat", namespace, {"app": "chat"}))
        trigger = {"type": "external", "metadata": metadata}
        kube.put(SCALED_OBJECT, scaled_object("chat", namespace, {"name": "chat"}, [trigger]))
        kube.put(POD, pod("chat-0", namespace, {"app": "chat"}, "node-a", ports=[("http", port)]))
    scaler = await make_scaler(
        kubernetes="on",
        kubeconfig=str(kube.kubeconfig(tmp_path)),
        exporter_selectors=(parse_exporter_selector("app=none:metrics"),),
        discovery_interval=0.2,
    )

    async def a_reads_42_and_b_is_followed() -> None:
        assert await outcome(scaler, "team-a", REQUESTS) == 42.0
        await outcome(scaler, "team-b", stolen)
        if expected != "INVALID_ARGUMENT":
            follows = scaler.app.registry.get("team-b", "chat")
            assert follows is not None and len(follows.triggers) == 1
            assert any("is not read for it" in note for note in follows.notes_logged)

    await eventually(a_reads_42_and_b_is_followed)
    for _ in range(5):
        assert await outcome(scaler, "team-b", stolen) == expected
        assert await outcome(scaler, "team-a", REQUESTS) == 42.0
