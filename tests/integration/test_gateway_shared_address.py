"""Two namespaces' pools name one picker address (a pod IP reused across namespaces while one watch is
stale or relisting): it is read for neither, so one namespace's token never goes on to what may now be
another tenant's pod, nor is that pod's page read as its queue (SPEC §7)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web
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

from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

PAGE = epp_page("chat-pool", {Queued("llama"): 3})


async def serve(port: int, seen: list[str], token: str | None) -> web.AppRunner:
    async def metrics(request: web.Request) -> web.Response:
        header = request.headers.get("Authorization") or ""
        seen.append(header)
        if token is not None and header != f"Bearer {token}":
            return web.Response(status=401)
        return web.Response(text=PAGE)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def put_pool(kube: FakeKube, ns: str, port: int) -> pb.ScaledObjectRef:
    meta = {
        "metric": "pending",
        "threshold": "4",
        "inferencePool": "chat-pool",
        "gatewayMetricsPort": str(port),
    }
    kube.put(DEPLOYMENT, deployment("chat", ns, {"app": "vllm"}, replicas=0))
    trigger = {"type": "external", "metadata": {**meta, "scalerAddress": "keda-gpu-scaler.keda:6000"}}
    kube.put(SCALED_OBJECT, scaled_object("chat", ns, {"name": "chat"}, [trigger]))
    kube.put(INFERENCE_POOL, inference_pool("chat-pool", ns, "chat-pool-epp"))
    kube.put(SERVICE, service("chat-pool-epp", ns, {"app": "epp"}))
    kube.put(POD, pod(f"epp-{ns}", ns, {"app": "epp"}, "node-a", ip="127.0.0.1"))
    return pb.ScaledObjectRef(name="chat", namespace=ns, scalerMetadata=meta)


async def test_an_address_two_namespaces_pools_name_is_read_for_neither(
    make_scaler: Any, kube: FakeKube, tmp_path: Path, unused_tcp_port: int
) -> None:
    port = unused_tcp_port
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    (tokens / "victim").write_text("victim-secret")
    (tokens / "tenant").write_text("tenant-secret")
    victim_seen: list[str] = []
    victim_epp = await serve(port, victim_seen, "victim-secret")
    victim = put_pool(kube, "victim", port)
    scaler = await make_scaler(
        kubernetes="on",
        kubeconfig=str(kube.kubeconfig(tmp_path)),
        discovery_interval=0.2,
        gateway_interval=0.05,
        gateway_token_file=tokens,
        gateway_token_plain_http=True,
    )
    victim_request = pb.GetMetricsRequest(scaledObjectRef=victim, metricName="gateway-pending")

    async def victim_reads() -> None:
        assert (await scaler.stub.GetMetrics(victim_request)).metricValues[0].metricValueFloat == 3

    await eventually(victim_reads)
    # The victim's picker pod goes; its address is now the tenant's pod, and the victim's watch still
    # lists its old picker there.
    await victim_epp.cleanup()
    tenant_seen: list[str] = []
    tenant_pod = await serve(port, tenant_seen, None)
    try:
        tenant = put_pool(kube, "tenant", port)

        async def both_claim_it() -> None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await scaler.stub.IsActive(tenant)  # the tenant's pool is followed too
            try:
                answer = await scaler.stub.GetMetrics(victim_request)  # never the tenant's page as its queue
            except grpc.aio.AioRpcError as error:
                assert error.code() is grpc.StatusCode.UNAVAILABLE, error
                assert "read for neither" in (error.details() or ""), error.details()
                return
            raise AssertionError(f"the victim's pool still answers {answer.metricValues[0].metricValueFloat}")

        await eventually(both_claim_it)
        seen = len(tenant_seen)
        await asyncio.sleep(1.0)  # 20 picker intervals
        assert tenant_seen[seen:] == []  # read for neither: no token of either namespace goes there
    finally:
        await tenant_pod.cleanup()
