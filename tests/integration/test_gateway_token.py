"""`--gateway-token-file`: the limited token endpoint pickers get, against a double that checks it as llm-d's
EPP does by default (`--metrics-endpoint-auth=true`: 401 without a token, 403 for a token whose identity
may not `get` /metrics, the page for one that may), over plain HTTP only where allowed explicitly."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import pytest
from aiohttp import web
from support import eventually
from test_gateway import error_of, ref, urls, value

from keda_gpu_scaler.collect.gateway_fetch import GatewayFetcher, gateway_fetcher
from keda_gpu_scaler.collect.gateway_token import FileToken
from keda_gpu_scaler.collect.http import FetchError, client_session
from keda_gpu_scaler.config.settings import SettingsError, build_settings
from keda_gpu_scaler.demo.epp import Queued, epp_page

PAGE = epp_page("chat-pool", {Queued("llama"): 3})


@dataclass
class AuthEpp:
    """An EPP metrics endpoint whose reviews accept `allowed` tokens only (each one's identity granted
    `get` on /metrics); any other token is a real identity without that grant (403)."""

    url: str = ""
    allowed: set[str] = field(default_factory=set)
    seen: list[str | None] = field(default_factory=list)
    page: str = PAGE

    @property
    def requests(self) -> int:
        return len(self.seen)


@pytest.fixture
async def auth_epp() -> AsyncIterator[Callable[..., Awaitable[AuthEpp]]]:
    runners: list[web.AppRunner] = []

    async def start(*allowed: str) -> AuthEpp:
        server = AuthEpp(allowed=set(allowed))

        async def metrics(request: web.Request) -> web.Response:
            header = request.headers.get("Authorization")
            server.seen.append(header)
            if header is None or not header.startswith("Bearer "):
                return web.Response(status=401, text="Unauthorized")
            if header.removeprefix("Bearer ") not in server.allowed:
                return web.Response(status=403, text="Forbidden")
            return web.Response(text=server.page)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        server.url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
        return server

    yield start
    for runner in runners:
        await runner.cleanup()


# The HTTP session of the test running (the app's one session, in the product).
_SESSION: list[aiohttp.ClientSession] = []


@pytest.fixture(autouse=True)
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with client_session() as made:
        _SESSION.append(made)
        try:
            yield made
        finally:
            _SESSION.remove(made)


def fetcher(
    token_file: Path,
    *,
    plain_http: bool = True,
    sa_token: Path | None = None,
    one_for_all: bool = True,
    namespace: str = "llm",
) -> GatewayFetcher:
    """Reads every page as one of `namespace`'s pickers (the product files each page URL under its pool's)."""
    return gateway_fetcher(
        _SESSION[-1],
        timeout=5,
        max_bytes=1 << 20,
        ca_file=None,
        token_file=sa_token,
        metrics_token=FileToken(token_file, one_for_all=one_for_all),
        plain_http=plain_http,
        namespace_of=lambda url: namespace,
    )


async def failure(fetch: GatewayFetcher, url: str) -> str:
    with pytest.raises(FetchError) as caught:
        await fetch.get(url)
    return str(caught.value)


def rotate(path: Path, token: str) -> None:
    """As the kubelet updates a mounted token: a new file swapped in under the same name."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(token)
    os.replace(fresh, path)


async def test_the_right_token_reads_the_page_over_plain_http_when_allowed(
    auth_epp: Callable[..., Awaitable[AuthEpp]], tmp_path: Path
) -> None:
    epp = await auth_epp("metrics-reader")
    token = tmp_path / "token"
    token.write_text("metrics-reader\n")
    fetch = fetcher(token)
    assert await fetch.get(epp.url) == PAGE.encode()
    assert epp.seen == ["Bearer metrics-reader"]


async def test_without_plain_http_allowed_no_token_goes_and_the_401_names_the_setting(
    auth_epp: Callable[..., Awaitable[AuthEpp]], tmp_path: Path
) -> None:
    epp = await auth_epp("metrics-reader")
    token = tmp_path / "token"
    token.write_text("metrics-reader")
    sa_token = tmp_path / "sa-token"
    sa_token.write_text("the-scalers-own-token")
    for fetch, words in (
        (
            fetcher(token, plain_http=False),
            ("--gateway-token-plain-http on", "gateway.metricsToken.plainHTTP"),
        ),
        (
            gateway_fetcher(_SESSION[-1], timeout=5, max_bytes=1 << 20, ca_file=None, token_file=sa_token),
            (
                "--gateway-token-serviceaccount",
                "--gateway-token-file",
                "never sends its own service account token over plain HTTP",
            ),
        ),
    ):
        message = await failure(fetch, epp.url)
        assert "HTTP 401" in message and "--metrics-endpoint-auth" in message, message
        for word in words:
            assert word in message, message
    assert epp.seen == [None, None]  # neither token crossed plain HTTP


async def test_a_token_without_the_grant_gets_a_403_naming_the_rbac(
    auth_epp: Callable[..., Awaitable[AuthEpp]], tmp_path: Path
) -> None:
    epp = await auth_epp("metrics-reader")
    token = tmp_path / "token"
    token.write_text("someone-else")
    fetch = fetcher(token)
    message = await failure(fetch, epp.url)
    assert "HTTP 403" in message and f"--gateway-token-file {token}" in message, message
    assert 'nonResourceURLs: ["/metrics"], verbs: ["get"]' in message and "gateway.metricsToken" in message


@pytest.mark.parametrize("state", ["missing", "empty", "unreadable"])
async def test_a_token_file_that_cannot_be_read_fails_the_page_naming_the_flag_and_file(
    auth_epp: Callable[..., Awaitable[AuthEpp]], tmp_path: Path, state: str
) -> None:
    epp = await auth_epp("metrics-reader")
    token = tmp_path / "token"
    if state == "empty":
        token.write_text("\n")
    elif state == "unreadable":
        token.write_bytes(b"\xff\xfe token")  # not text: nothing to send (the tests run as root: no chmod)
    fetch = fetcher(token)
    message = await failure(fetch, epp.url)
    assert message.startswith(
        f"--gateway-token-file: {token}" if state == "empty" else "--gateway-token-file:"
    )
    assert str(token) in message
    assert epp.seen == []  # nothing was sent without its token


async def test_a_token_rotated_mid_run_is_read_again_and_a_removed_one_is_never_reused(
    auth_epp: Callable[..., Awaitable[AuthEpp]], tmp_path: Path
) -> None:
    epp = await auth_epp("first")
    token = tmp_path / "token"
    token.write_text("first")
    fetch = fetcher(token)
    assert await fetch.get(epp.url) == PAGE.encode()
    epp.allowed = {"second"}  # the old token expired
    rotate(token, "second")
    assert await fetch.get(epp.url) == PAGE.encode()
    token.unlink()
    assert "--gateway-token-file" in await failure(fetch, epp.url)
    assert epp.seen == ["Bearer first", "Bearer second"]


async def test_a_directory_holds_one_token_per_namespace_and_each_namespace_gets_its_own(
    auth_epp: Callable[..., Awaitable[AuthEpp]], tmp_path: Path
) -> None:
    epp = await auth_epp("token-of-llm")
    tokens = tmp_path / "tokens"  # a Secret with one key per namespace, mounted
    tokens.mkdir()
    (tokens / "llm").write_text("token-of-llm\n")
    (tokens / "other").write_text("token-of-other")
    assert await fetcher(tokens, one_for_all=False).get(epp.url) == PAGE.encode()
    # A page filed under another namespace (a tenant's pool pointing at this address) gets that one's.
    await failure(fetcher(tokens, one_for_all=False, namespace="other"), epp.url)
    assert epp.seen == ["Bearer token-of-llm", "Bearer token-of-other"]
    # A namespace without a file gets nothing, and the message says what to add.
    message = await failure(fetcher(tokens, one_for_all=False, namespace="team-b"), epp.url)
    assert f"--gateway-token-file {tokens}: no token for namespace 'team-b'" in message, message
    assert "the key team-b of the Secret" in message
    assert len(epp.seen) == 2


async def test_one_token_file_is_never_sent_where_tenants_place_the_pickers(
    auth_epp: Callable[..., Awaitable[AuthEpp]], tmp_path: Path
) -> None:
    # With Kubernetes, a tenant decides where its pool's picker is: one token for every namespace would
    # reach a pod of its own, and read every other namespace's pickers.
    epp = await auth_epp("one-for-all")
    token = tmp_path / "token"
    token.write_text("one-for-all")
    message = await failure(fetcher(token, one_for_all=False), epp.url)
    assert f"--gateway-token-file {token} is one file" in message, message
    assert "one token file per namespace" in message and "--gateway-token-serviceaccount" in message
    # Nothing there (yet): the read says so, not that it is one file.
    missing = await failure(fetcher(tmp_path / "absent", one_for_all=False), epp.url)
    assert "cannot read" in missing and "is one file" not in missing, missing
    assert epp.seen == []


def test_plain_http_needs_the_token_file_never_the_scalers_own_token() -> None:
    with pytest.raises(SettingsError, match="--gateway-token-plain-http=on needs --gateway-token-file"):
        build_settings({"gateway_token_plain_http": "on"})
    with pytest.raises(SettingsError, match="--gateway-token-plain-http='yes' is not allowed"):
        build_settings({"gateway_token_plain_http": "yes", "gateway_token_file": "/token"})
    settings = build_settings({"gateway_token_plain_http": "on", "gateway_token_file": "/not/there/yet"})
    assert settings.gateway_token_plain_http and settings.gateway_token_file == Path("/not/there/yet")


async def test_the_scaler_wakes_through_an_authenticating_epp_and_follows_a_rotation(
    auth_epp: Callable[..., Awaitable[AuthEpp]], make_scaler, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    epp = await auth_epp("first")
    token = tmp_path / "token"
    token.write_text("first")
    scaler = await make_scaler(
        gateway_urls=urls(epp), gateway_token_file=token, gateway_token_plain_http=True
    )
    assert await eventually(lambda: value(scaler)) == 3
    epp.allowed = {"second"}

    async def refused() -> None:
        code, message = await error_of(scaler.stub.IsActive(ref()))
        assert code is grpc.StatusCode.UNAVAILABLE and "HTTP 403" in message, message

    await eventually(refused)
    rotate(token, "second")
    epp.page = epp_page("chat-pool", {Queued("llama"): 5})

    async def five() -> None:
        assert await value(scaler) == 5

    await eventually(five)
