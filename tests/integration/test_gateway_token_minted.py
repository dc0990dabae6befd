"""`--gateway-token-serviceaccount`: the scaler mints short-lived tokens of a limited ServiceAccount through
the TokenRequest API of the fake API server and renews them, against endpoint-picker doubles that accept
only a token currently valid for their own namespace's audience (as a TokenReview for it would); each
namespace's pickers get that namespace's token only, and a refused token is replaced at once."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
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
from fake_kube_tokens import API_SERVER, Minted
from support import eventually

from keda_gpu_scaler.config.settings import SettingsError
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

NS = "llm"
ACCOUNT = ("keda", "epp-metrics")
EPP = {"app": "chat-pool-epp"}
AUDIENCE_OF = "keda-gpu-scaler-epp:"  # the pickers of a namespace accept this and the namespace's name
AUDIENCE = f"{AUDIENCE_OF}{NS}"  # what the pickers of NS are configured to accept


@dataclass
class MintedEpp:
    """EPP metrics of a namespace that accept a bearer token only while the fake API server says it is
    valid for that namespace's audience (`refuse_all`: a misconfigured picker that refuses every token)."""

    kube: FakeKube
    namespace: str = NS
    port: int = 0
    seen: list[str | None] = field(default_factory=list)
    page: str = epp_page("chat-pool", {Queued("llama"): 3})
    refuse_all: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def tokens(self) -> set[str]:
        """Every bearer token this picker was sent, accepted or not."""
        return {h.removeprefix("refused ").removeprefix("Bearer ") for h in self.seen if h and "Bearer " in h}


@pytest.fixture(autouse=True)
def account(kube: FakeKube) -> None:
    """The dedicated ServiceAccount exists (a test that needs it missing removes it)."""
    kube.tokens.accounts.add(ACCOUNT)


@pytest.fixture
async def epps(kube: FakeKube) -> AsyncIterator[Callable[[str], Awaitable[MintedEpp]]]:
    """Starts the picker double of a namespace."""
    runners: list[web.AppRunner] = []

    async def serve(namespace: str) -> MintedEpp:
        double = MintedEpp(kube, namespace)
        audience = f"keda-gpu-scaler-epp:{namespace}"  # what the pickers of the namespace accept

        async def metrics(request: web.Request) -> web.Response:
            header = request.headers.get("Authorization") or ""
            token = header.removeprefix("Bearer ")
            # Whether the token was valid when it arrived: kept with the header, as the review happened then.
            valid = header.startswith("Bearer ") and kube.tokens.valid(token, audience) is not None
            valid = valid and not double.refuse_all
            double.seen.append(header if valid else f"refused {header or None}")
            if not valid:  # no token, or an expired, revoked or other audience's one: its review fails
                return web.Response(status=401, text="Unauthorized")
            return web.Response(text=double.page)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        runners.append(runner)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        double.port = runner.addresses[0][1]
        return double

    yield serve
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def epp(epps: Callable[[str], Awaitable[MintedEpp]]) -> MintedEpp:
    return await epps(NS)


def metadata(epp: MintedEpp) -> dict[str, str]:
    return {
        "metric": "pending",
        "threshold": "4",
        "inferencePool": "chat-pool",
        "gatewayMetricsPort": str(epp.port),
    }


def ref(epp: MintedEpp) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="chat", namespace=epp.namespace, scalerMetadata=metadata(epp))


def put_pool(kube: FakeKube, epp: MintedEpp) -> None:
    """A ScaledObject of the picker's namespace whose `pending` trigger reads it: the namespace's own
    InferencePool, Service and EPP pod, at the picker's port."""
    ns = epp.namespace
    kube.put(DEPLOYMENT, deployment("chat", ns, {"app": "vllm"}, replicas=0))
    trigger = {
        "type": "external",
        "metadata": {**metadata(epp), "scalerAddress": "keda-gpu-scaler.keda:6000"},
    }
    kube.put(SCALED_OBJECT, scaled_object("chat", ns, {"name": "chat"}, [trigger]))
    kube.put(INFERENCE_POOL, inference_pool("chat-pool", ns, "chat-pool-epp"))
    kube.put(SERVICE, service("chat-pool-epp", ns, EPP))
    kube.put(POD, pod("chat-pool-epp-0", ns, EPP, "node-a", ip="127.0.0.1"))


async def start(make_scaler: Any, kube: FakeKube, epp: MintedEpp, tmp_path: Path, **overrides: Any) -> Any:
    put_pool(kube, epp)
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
    assert {(m.namespace, m.name, m.audiences) for m in minted} == {(*ACCOUNT, (AUDIENCE,))}
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


async def test_a_tenants_own_picker_gets_only_its_namespaces_token_never_one_good_for_another(
    make_scaler: Any, kube: FakeKube, epps: Callable[[str], Awaitable[MintedEpp]], tmp_path: Path
) -> None:
    # Tenant A owns its ScaledObject, pool, Service and the pod at its port (which logs headers): A's
    # picker double is that pod. B's picker is the one A would like to read.
    tenant_a, tenant_b = await epps("team-a"), await epps("team-b")
    put_pool(kube, tenant_b)
    scaler = await start(make_scaler, kube, tenant_a, tmp_path)

    async def both_read() -> None:
        assert await value(scaler, tenant_a) == 3
        assert await value(scaler, tenant_b) == 3

    await eventually(both_read)
    audiences = {m.token: m.audiences for m in kube.tokens.minted}
    assert {audiences[t] for t in tenant_a.tokens()} == {("keda-gpu-scaler-epp:team-a",)}
    assert {audiences[t] for t in tenant_b.tokens()} == {("keda-gpu-scaler-epp:team-b",)}
    for token in tenant_a.tokens():
        # Not accepted by B's picker, nor by the API server: what A obtained reads A's picker only.
        assert kube.tokens.valid(token, "keda-gpu-scaler-epp:team-b") is None
        assert kube.tokens.valid(token, API_SERVER) is None
        async with aiohttp.ClientSession() as session:
            headers = {"Authorization": f"Bearer {token}"}
            async with session.get(tenant_b.url, headers=headers) as answer:
                assert answer.status == 401


async def test_a_revoked_token_is_replaced_at_once_and_the_pool_answers_again(
    make_scaler: Any, kube: FakeKube, epp: MintedEpp, tmp_path: Path
) -> None:
    scaler = await start(make_scaler, kube, epp, tmp_path)  # 10-minute tokens: no renewal in this test

    async def three() -> None:
        assert await value(scaler, epp) == 3

    await eventually(three)
    revoked = kube.tokens.minted[-1].token
    kube.tokens.revoked.add(revoked)
    await unavailable_saying(scaler, epp, "HTTP 401")  # never a made-up 0 meanwhile
    await eventually(three, timeout=10)
    assert len(kube.tokens.minted) == 2
    assert f"Bearer {kube.tokens.minted[-1].token}" in epp.seen


async def test_a_picker_refusing_every_token_costs_a_bounded_number_of_token_requests(
    make_scaler: Any, kube: FakeKube, epp: MintedEpp, tmp_path: Path
) -> None:
    epp.refuse_all = True
    scaler = await start(make_scaler, kube, epp, tmp_path)
    await unavailable_saying(scaler, epp, "HTTP 401")  # KEDA's call: the pool is followed from now on

    async def refused_twice_and_twenty_more() -> None:
        assert len(epp.tokens()) >= 2  # the first refusal minted a second token
        second = f"refused Bearer {kube.tokens.minted[1].token}"
        assert epp.seen[epp.seen.index(second) :].count(second) >= 20

    await eventually(refused_twice_and_twenty_more, timeout=20)
    # Twenty refusals of the replacement, and it was not replaced again on each: the backoff holds.
    assert len(kube.tokens.minted) <= 3
    # What an operator reads: the picker refused a token scoped to one namespace's audience (llm-d's own
    # metrics auth reviews for the API server's), and where to read how to have it checked.
    await unavailable_saying(scaler, epp, "for the audience 'keda-gpu-scaler-epp:")
    await unavailable_saying(scaler, epp, "docs/SECURITY.md")


async def test_token_files_reach_each_namespaces_pickers_only_and_one_file_for_all_stops_start_up(
    make_scaler: Any, kube: FakeKube, epps: Callable[[str], Awaitable[MintedEpp]], tmp_path: Path
) -> None:
    # --gateway-token-file with Kubernetes: the operator mints per-namespace tokens with its own tooling
    # and mounts them as one directory (a Secret with one key per namespace).
    tenant_a, tenant_b = await epps("team-a"), await epps("team-b")
    now = time.time()
    for ns in ("team-a", "team-b"):
        kube.tokens.minted.append(Minted(*ACCOUNT, f"operator-{ns}", now, now + 600, (f"{AUDIENCE_OF}{ns}",)))
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    for ns in ("team-a", "team-b"):
        (tokens / ns).write_text(f"operator-{ns}")
    single = tmp_path / "token"
    single.write_text("operator-team-a")
    put_pool(kube, tenant_b)
    # One file for every namespace: refused before anything starts.
    with pytest.raises(SettingsError, match=f"--gateway-token-file {single} is one file"):
        await start(
            make_scaler,
            kube,
            tenant_a,
            tmp_path,
            gateway_token_serviceaccount=None,
            gateway_token_file=single,
        )
    scaler = await start(
        make_scaler, kube, tenant_a, tmp_path, gateway_token_serviceaccount=None, gateway_token_file=tokens
    )

    async def both_read() -> None:
        assert await value(scaler, tenant_a) == 3 and await value(scaler, tenant_b) == 3

    await eventually(both_read)
    assert tenant_a.tokens() == {"operator-team-a"} and tenant_b.tokens() == {"operator-team-b"}


async def test_a_namespace_no_longer_read_is_minted_no_more_tokens(
    make_scaler: Any, kube: FakeKube, tmp_path: Path
) -> None:
    """SPEC §2: a ScaledObject KEDA stops calling is forgotten with all its state; its pool is no longer
    read, and its namespace gets no new token (nor a retry) until a picker of it is read again."""
    kube.tokens.accounts.add(ACCOUNT)
    kube.tokens.lifetime = 2  # renewed every 1.6 s while read

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=epp_page("chat-pool", {Queued("llama"): 3}))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        epp = MintedEpp(kube, "llm", port=runner.addresses[0][1])
        put_pool(kube, epp)
        scaler = await make_scaler(
            kubernetes="on",
            kubeconfig=str(kube.kubeconfig(tmp_path)),
            discovery_interval=0.2,
            gateway_interval=0.05,
            gateway_token_serviceaccount=ACCOUNT,
            gateway_token_plain_http=True,
            interest_ttl=1.0,
        )

        async def minted_and_read() -> None:
            assert (await scaler.stub.IsActive(ref(epp))).result is True

        await eventually(minted_and_read)

        async def forgotten() -> None:
            assert len(scaler.app.registry) == 0

        await eventually(forgotten, timeout=5)
        await asyncio.sleep(2.0)  # the renewal the last reads asked for
        before = len(kube.tokens.minted)
        await asyncio.sleep(3.5)  # two renewals' time
        assert len(kube.tokens.minted) == before
        # Followed again: minted again (the first read may find the old token expired, then it is renewed).
        await eventually(minted_and_read)
        assert len(kube.tokens.minted) > before
    finally:
        await runner.cleanup()
