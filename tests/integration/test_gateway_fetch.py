"""Endpoint picker pages: the scaler's token over verified HTTPS only, and 401/403 that say what to grant."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from certs import CertificateAuthority, write
from support import eventually

from keda_gpu_scaler.collect.gateway_fetch import GatewayFetcher, gateway_fetcher
from keda_gpu_scaler.collect.http import FetchError, client_session

TOKEN = "scaler-service-account-token"
PAGE = "# TYPE llm_d_epp_flow_control_queue_size gauge\nllm_d_epp_flow_control_queue_size 3\n"


@dataclass
class Epp:
    """A loopback endpoint picker metrics server: answers `status`, or the page to TOKEN only."""

    url: str
    seen: list[str | None] = field(default_factory=list)  # the Authorization header of each request
    status: int | None = None


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority()


@pytest.fixture
async def epp(tmp_path: Path, ca: CertificateAuthority) -> AsyncIterator[Callable[..., Awaitable[Epp]]]:
    runners: list[web.AppRunner] = []

    async def start(*, tls: bool) -> Epp:
        server = Epp("")

        async def metrics(request: web.Request) -> web.Response:
            server.seen.append(request.headers.get("Authorization"))
            if server.status is not None:
                return web.Response(status=server.status)
            if request.headers.get("Authorization") != f"Bearer {TOKEN}":
                return web.Response(status=401)
            return web.Response(text=PAGE)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        context = None
        if tls:
            # The certificate names the Service, as EPP certificates do; the scaler reaches the pod by IP.
            cert, key = write(tmp_path, "epp", ca.issue("chat-pool-epp", ["chat-pool-epp.llm.svc"]))
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(cert, key)
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
        runners.append(runner)
        server.url = f"{'https' if tls else 'http'}://127.0.0.1:{runner.addresses[0][1]}/metrics"
        return server

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with client_session() as made:
        yield made


def fetcher(
    session: aiohttp.ClientSession, tmp_path: Path, ca: CertificateAuthority | None, *, token: bool = True
) -> GatewayFetcher:
    ca_file = None
    if ca is not None:
        ca_file = tmp_path / "ca.crt"
        ca_file.write_bytes(ca.cert_pem)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    return gateway_fetcher(
        session,
        timeout=5,
        max_bytes=1 << 20,
        ca_file=ca_file,
        token_file=token_file if token else tmp_path / "absent",
    )


async def failure(fetch: GatewayFetcher, url: str) -> str:
    with pytest.raises(FetchError) as caught:
        await fetch.get(url)
    return str(caught.value)


async def test_https_verified_against_the_ca_file_carries_the_token(
    epp: Callable[..., Awaitable[Epp]],
    session: aiohttp.ClientSession,
    tmp_path: Path,
    ca: CertificateAuthority,
) -> None:
    server = await epp(tls=True)
    fetch = fetcher(session, tmp_path, ca)
    assert await fetch.get(server.url) == PAGE.encode()
    assert server.seen == [f"Bearer {TOKEN}"]


async def test_an_unverifiable_certificate_is_not_read_and_gets_no_token(
    epp: Callable[..., Awaitable[Epp]],
    session: aiohttp.ClientSession,
    tmp_path: Path,
    ca: CertificateAuthority,
) -> None:
    server = await epp(tls=True)
    for fetch, trust in (
        (fetcher(session, tmp_path, None), "the system's CAs (give --gateway-ca-file"),
        (fetcher(session, tmp_path, CertificateAuthority("another CA")), "--gateway-ca-file"),
    ):
        message = await failure(fetch, server.url)
        assert "does not verify against" in message and trust in message, message
        assert "the scaler's token is not sent" in message
    assert server.seen == []  # no request, so no token, ever reached the server


async def test_plain_http_never_carries_the_token_and_a_401_says_why(
    epp: Callable[..., Awaitable[Epp]], session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    server = await epp(tls=False)
    fetch = fetcher(session, tmp_path, None)
    message = await failure(fetch, server.url)
    assert server.seen == [None]
    assert "HTTP 401" in message and "plain HTTP" in message, message
    assert "--gateway-ca-file" in message and "--metrics-endpoint-auth=false" in message


async def test_403_names_the_permission_to_grant(
    epp: Callable[..., Awaitable[Epp]],
    session: aiohttp.ClientSession,
    tmp_path: Path,
    ca: CertificateAuthority,
) -> None:
    server = await epp(tls=True)
    server.status = 403
    fetch = fetcher(session, tmp_path, ca)
    message = await failure(fetch, server.url)
    assert "HTTP 403" in message and "`get` on the non-resource URL /metrics" in message, message
    assert 'nonResourceURLs: ["/metrics"]' in message


async def test_401_over_https_says_whether_a_token_was_presented(
    epp: Callable[..., Awaitable[Epp]],
    session: aiohttp.ClientSession,
    tmp_path: Path,
    ca: CertificateAuthority,
) -> None:
    server = await epp(tls=True)
    server.status = 401
    with_token, without = fetcher(session, tmp_path, ca), fetcher(session, tmp_path, ca, token=False)
    assert "did not accept the scaler's service account token" in await failure(with_token, server.url)
    assert "has no service account token" in await failure(without, server.url)
    assert server.seen == [f"Bearer {TOKEN}", None]


@dataclass
class RecordingToken:
    """A limited token source whose current token the test replaces; records what pickers said of which."""

    flag: str = "--gateway-token-serviceaccount"
    current: str = "first"
    refusals: list[tuple[str, str]] = field(default_factory=list)  # (namespace, the token refused)

    def read(self, namespace: str) -> str:
        return self.current

    def identity(self, namespace: str) -> str:
        return "the recording token"

    def refused(self, namespace: str, token: str) -> None:
        self.refusals.append((namespace, token))

    def accepted(self, namespace: str) -> None:
        pass


async def test_a_refusal_is_of_the_token_the_request_carried_even_once_replaced(
    session: aiohttp.ClientSession,
) -> None:
    """A request sent with one token and answered 401 after the token was replaced (the replacement minted
    meanwhile) refuses the token it carried, not its replacement: one revocation, one new token."""
    replaced = asyncio.Event()
    seen: list[str | None] = []

    async def metrics(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        await replaced.wait()  # the picker reviews the token while the scaler mints the next one
        return web.Response(status=401)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    source = RecordingToken()
    fetch = gateway_fetcher(
        session,
        timeout=5,
        max_bytes=1 << 20,
        ca_file=None,
        metrics_token=source,
        plain_http=True,
        namespace_of=lambda _: "llm",
    )
    try:
        pending = asyncio.ensure_future(fetch.get(url))
        await eventually(_said(seen))
        source.current = "second"
        replaced.set()
        with pytest.raises(FetchError, match="HTTP 401"):
            await pending
        assert seen == ["Bearer first"]
        assert source.refusals == [("llm", "first")]
    finally:
        await runner.cleanup()


def _said(seen: list[str | None]) -> Callable[[], Awaitable[None]]:
    async def check() -> None:
        assert seen

    return check
