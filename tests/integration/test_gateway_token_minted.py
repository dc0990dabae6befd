"""`--gateway-token-serviceaccount`: the scaler mints short-lived tokens of a limited ServiceAccount through
the TokenRequest API of the fake API server and renews them, against an endpoint-picker double that accepts
only a token that is currently valid (as the EPP's TokenReview would)."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
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

from keda_gpu_scaler._proto import externalscaler_pb2 as pb
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.settings import SettingsError

NS = "llm"
ACCOUNT = ("keda", "epp-metrics")
EPP = {"app": "chat-pool-epp"}


@dataclass
class MintedEpp:
    """EPP metrics that accept a bearer token only while the fake API server says it is valid."""

    kube: FakeKube
    port: int = 0
    seen: list[str | None] = field(default_factory=list)
    page: str = epp_page("chat-pool", {Queued("llama"): 3})


@pytest.fixture(autouse=True)
def account(kube: FakeKube) -> None:
    """The dedicated ServiceAccount exists (a test that needs it missing removes it)."""
    kube.tokens.accounts.add(ACCOUNT)


@pytest.fixture
async def epp(kube: FakeKube) -> AsyncIterator[MintedEpp]:
    double = MintedEpp(kube)

    async def metrics(request: web.Request) -> web.Response:
        header = request.headers.get("Authorization")
        # Whether the token was valid when it arrived: kept with the header, as the review happened then.
        valid = header is not None and kube.tokens.valid(header.removeprefix("Bearer ")) is not None
        double.seen.append(header if valid else f"refused {header}")
        if header is None or not header.startswith("Bearer "):
            return web.Response(status=401, text="Unauthorized")
        if not valid:
            return web.Response(status=401, text="Unauthorized")  # an expired token fails its review
        return web.Response(text=double.page)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    double.port = runner.addresses[0][1]
    yield double
    await runner.cleanup()


def metadata(epp: MintedEpp) -> dict[str, str]:
    return {
        "metric": "pending",
        "threshold": "4",
        "inferencePool": "chat-pool",
        "gatewayMetricsPort": str(epp.port),
    }


def ref(epp: MintedEpp) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="chat", namespace=NS, scalerMetadata=metadata(epp))


async def start(make_scaler: Any, kube: FakeKube, epp: MintedEpp, tmp_path: Path, **overrides: Any) -> Any:
    kube.put(DEPLOYMENT, deployment("chat", NS, {"app": "vllm"}, replicas=0))
    trigger = {
        "type": "external",
        "metadata": {**metadata(epp), "scalerAddress": "keda-gpu-scaler.keda:6000"},
    }
    kube.put(SCALED_OBJECT, scaled_object("chat", NS, {"name": "chat"}, [trigger]))
    kube.put(INFERENCE_POOL, inference_pool("chat-pool", NS, "chat-pool-epp"))
    kube.put(SERVICE, service("chat-pool-epp", NS, EPP))
    kube.put(POD, pod("chat-pool-epp-0", NS, EPP, "node-a", ip="127.0.0.1"))
    settings: dict[str, Any] = {
        "kubernetes": "on",
        "kubeconfig": str(kube.kubeconfig(tmp_path)),
        "discovery_interval": 0.2,
        "gateway_interval": 0.05,
        "gateway_token_serviceaccount": ACCOUNT,
        "gateway_token_plain_http": True,
    }
    return await make_scaler(**(settings | overrides))


async def value(scaler: Any, epp: MintedEpp) -> float:
    request = pb.GetMetricsRequest(scaledObjectRef=ref(epp), metricName="gateway-pending")
    response = await scaler.stub.GetMetrics(request)
    return float(response.metricValues[0].metricValueFloat)


async def unavailable_saying(scaler: Any, epp: MintedEpp, *words: str) -> str:
    async def check() -> str:
        try:
            await scaler.stub.IsActive(ref(epp))
        except grpc.aio.AioRpcError as error:
            assert error.code() is grpc.StatusCode.UNAVAILABLE, error
            message = error.details() or ""
            for word in words:
                assert word in message, message
            return message
        raise AssertionError("IsActive answered")

    return await eventually(check)


async def test_the_pool_is_read_through_minted_tokens_renewed_before_they_expire(
    make_scaler: Any, kube: FakeKube, epp: MintedEpp, tmp_path: Path
) -> None:
    kube.tokens.lifetime = 5  # seconds: the answer's expirationTimestamp, not the 600 s asked for
    scaler = await start(make_scaler, kube, epp, tmp_path)

    async def three() -> None:
        assert await value(scaler, epp) == 3

    await eventually(three)

    async def renewed_twice() -> None:
        assert len(kube.tokens.minted) >= 3
        await three()

    await eventually(renewed_twice, timeout=30)
    minted = kube.tokens.minted
    # Each token was replaced while it was still valid, and every one is new.
    assert all(later.issued < earlier.expires for earlier, later in itertools.pairwise(minted))
    assert len({m.token for m in minted}) == len(minted)
    assert {(m.namespace, m.name) for m in minted} == {ACCOUNT}
    # The API server's floor is asked for, never less; the pickers saw more than the first token.
    assert {body["spec"]["expirationSeconds"] for body in kube.tokens.asked} == {600}
    used = {h.removeprefix("Bearer ") for h in epp.seen if h and h.startswith("Bearer ")}
    assert len(used & {m.token for m in minted}) >= 2
    assert not [h for h in epp.seen if h and h.startswith("refused")], epp.seen


async def test_a_scaler_without_the_grant_to_mint_fails_the_pool_naming_the_rbac_rule(
    make_scaler: Any, kube: FakeKube, epp: MintedEpp, tmp_path: Path
) -> None:
    kube.deny("create", "serviceaccounts/token", "keda")
    scaler = await start(make_scaler, kube, epp, tmp_path)
    message = await unavailable_saying(
        scaler, epp, "--gateway-token-serviceaccount keda/epp-metrics", "serviceaccounts/token"
    )
    assert 'resourceNames: ["epp-metrics"], verbs: ["create"]' in message, message
    assert "Role in 'keda'" in message and "gateway.metricsToken" in message, message
    assert epp.seen == []  # nothing was sent: not without a token, never the scaler's own


async def test_a_service_account_that_does_not_exist_is_named_with_what_to_create(
    make_scaler: Any, kube: FakeKube, epp: MintedEpp, tmp_path: Path
) -> None:
    kube.tokens.accounts.clear()
    scaler = await start(make_scaler, kube, epp, tmp_path)
    message = await unavailable_saying(scaler, epp, "no ServiceAccount 'epp-metrics' in namespace 'keda'")
    assert 'nonResourceURLs: ["/metrics"], verbs: ["get"]' in message, message
    assert epp.seen == []


async def test_a_minting_outage_keeps_the_last_token_until_it_expires_then_fails_clearly(
    make_scaler: Any, kube: FakeKube, epp: MintedEpp, tmp_path: Path
) -> None:
    kube.tokens.lifetime = 5  # the refused renewal (at 80 %) leaves most of a second to keep using it
    scaler = await start(make_scaler, kube, epp, tmp_path)

    async def three() -> None:
        assert await value(scaler, epp) == 3

    await eventually(three)
    kube.tokens.outage = 503
    last = kube.tokens.minted[-1]
    path = f"/api/v1/namespaces/{ACCOUNT[0]}/serviceaccounts/{ACCOUNT[1]}/token"
    asked = kube.count(path)

    async def renewal_refused() -> None:
        assert kube.count(path) > asked

    await eventually(renewal_refused)
    read_before = len(epp.seen)
    message = await unavailable_saying(
        scaler,
        epp,
        "--gateway-token-serviceaccount keda/epp-metrics",
        "last minted token is no longer sent (it expires at",
        "503",
    )
    assert "renewing it failed" in message, message
    assert kube.tokens.minted[-1] == last  # nothing minted during the outage
    # After the refusal the last token was still used while valid, and never once it had expired.
    assert f"Bearer {last.token}" in epp.seen[read_before:]
    assert not [h for h in epp.seen if h and h.startswith("refused")], epp.seen
    assert time.time() >= last.expires - 0.25  # kept until the last moment it could still be sent
    kube.tokens.outage = None  # the API server is back: a new token, the page is read again
    await eventually(three)
    assert kube.tokens.minted[-1] != last


async def test_without_plain_http_allowed_the_minted_token_stays_home_and_the_401_names_the_flag(
    make_scaler: Any, kube: FakeKube, epp: MintedEpp, tmp_path: Path
) -> None:
    scaler = await start(make_scaler, kube, epp, tmp_path, gateway_token_plain_http=False)
    message = await unavailable_saying(scaler, epp, "HTTP 401", "--gateway-token-plain-http on")
    assert "the token of --gateway-token-serviceaccount goes over plain HTTP only" in message, message
    assert set(epp.seen) == {"refused None"}


async def test_without_kubernetes_the_scaler_does_not_start_and_names_the_flag(make_scaler: Any) -> None:
    # --kubernetes auto that found no cluster: the flag cannot be honoured, and no other token replaces it.
    with pytest.raises(SettingsError, match="--gateway-token-serviceaccount needs Kubernetes"):
        await make_scaler(kubernetes="off", gateway_token_serviceaccount=ACCOUNT)
