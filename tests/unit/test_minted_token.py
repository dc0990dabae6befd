"""The minted token's bookkeeping (collect/gateway_token.py) with a clock and TokenRequest answers of the
test's choosing: what read() gives or says at each point of a token's life, and answers it cannot use."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support import eventually

from keda_gpu_scaler.collect import gateway_token
from keda_gpu_scaler.collect.gateway_token import MintedToken, TokenUnavailable
from keda_gpu_scaler.config.secretfile import SecretFileError
from keda_gpu_scaler.core.errors import KubeError

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def answer(token: str, expires: str) -> dict[str, Any]:
    return {
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "spec": {"expirationSeconds": 600},
        "status": {"token": token, "expirationTimestamp": expires},
    }


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def minted(answers: list[dict[str, Any] | Exception], clock: Clock) -> tuple[MintedToken, list[Any]]:
    asked: list[Any] = []

    async def mint(namespace: str, name: str, seconds: int, audience: str) -> dict[str, Any]:
        asked.append((namespace, name, seconds))
        given = answers.pop(0)
        if isinstance(given, Exception):
            raise given
        return given

    return MintedToken("keda", "epp-metrics", mint, audience="keda-gpu-scaler-epp:llm", clock=clock), asked


def unavailable(token: MintedToken) -> str:
    with pytest.raises(TokenUnavailable) as caught:
        token.read()
    assert isinstance(caught.value, SecretFileError)  # what the fetchers record as the page's failure
    return str(caught.value)


async def test_a_token_is_served_until_its_expiry_and_a_failed_renewal_is_said_after() -> None:
    clock = Clock()
    token, asked = minted(
        [answer("first", "2027-01-15T08:10:00Z"), KubeError("the API server is unreachable (timed out)")],
        clock,
    )
    assert unavailable(token).startswith(
        "--gateway-token-serviceaccount keda/epp-metrics: no token minted yet"
    )
    assert await token.mint_once() == 600
    assert asked == [("keda", "epp-metrics", 600)]
    assert token.read() == "first"
    clock.now += 480
    assert await token.mint_once() is None  # the renewal failed: the last token still serves
    assert token.read() == "first"
    clock.now += 109
    assert token.read() == "first"
    clock.now += 1  # the last 10 s of its life: it would arrive expired
    message = unavailable(token)
    assert (
        "the last minted token is no longer sent (it expires at" in message
        and "renewing it failed" in message
    ), message
    assert "unreachable (timed out)" in message


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ({"kind": "TokenRequest", "status": {}}, "has no status.token"),
        (answer("t", "not a time"), "cannot be used"),
        (answer("t", "2027-01-15T08:10:00"), "has no time zone"),
        (answer("t", "2027-01-15T07:59:00Z"), "already expired (is this host's clock right?)"),
        (KubeError("denied", 403), 'resourceNames: ["epp-metrics"], verbs: ["create"]'),
        (KubeError("not found", 404), "no ServiceAccount 'epp-metrics' in namespace 'keda'"),
    ],
)
async def test_an_answer_that_gives_no_usable_token_is_the_reason_read_gives(
    given: dict[str, Any] | Exception, words: str
) -> None:
    token, _ = minted([given], Clock())
    assert await token.mint_once() is None
    message = unavailable(token)
    assert words in message and message.startswith("--gateway-token-serviceaccount keda/epp-metrics"), message


async def test_a_failure_after_a_token_expired_never_brings_the_old_one_back() -> None:
    clock = Clock()
    token, _ = minted(
        [answer("first", "2027-01-15T08:10:00Z"), answer("second", "2027-01-15T08:25:00Z")], clock
    )
    await token.mint_once()
    clock.now += 601
    assert "expires at" in unavailable(token) and "has not been renewed yet" in unavailable(token)
    assert await token.mint_once() is not None
    assert token.read() == "second" and token.minted == 2


async def test_one_picker_refusing_beside_one_accepting_keeps_the_gap_doubling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SECURITY.md: at most one TokenRequest 5 s after the last, the gap doubling while pickers keep
    refusing; an acceptance by another picker of the same token does not start it again from 5 s."""
    monkeypatch.setattr(gateway_token, "REMINT_SECONDS", 0.1)  # 5 s scaled down 50×
    clock, times = Clock(), []

    async def mint(namespace: str, name: str, seconds: int, audience: str) -> dict[str, Any]:
        times.append(asyncio.get_running_loop().time())
        return answer(f"t{len(times)}", "2027-01-15T08:10:00Z")

    token = MintedToken("keda", "epp-metrics", mint, audience="keda-gpu-scaler-epp:llm", clock=clock)
    token.start()
    try:
        end = asyncio.get_running_loop().time() + 3.2  # 32 gaps of 0.1 s; doubling, about 6 mints
        while asyncio.get_running_loop().time() < end:
            with contextlib.suppress(TokenUnavailable):  # the first mint may still be under way
                token.refused(token.read())  # epp-0 refuses every token
            await asyncio.sleep(0.01)
            token.accepted()  # epp-1 accepts it
            await asyncio.sleep(0.01)
    finally:
        await token.stop()
    assert 3 <= len(times) <= 8, times


async def test_a_refusal_of_a_token_already_replaced_asks_for_no_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One revocation, one new token: a picker's 401 to the old token that arrives after the replacement
    was minted (its request was under way meanwhile) says nothing of the replacement."""
    monkeypatch.setattr(gateway_token, "REMINT_SECONDS", 0.05)
    minted_tokens: list[str] = []

    async def mint(namespace: str, name: str, seconds: int, audience: str) -> dict[str, Any]:
        minted_tokens.append(f"t{len(minted_tokens) + 1}")
        return answer(minted_tokens[-1], "2027-01-15T08:10:00Z")

    token = MintedToken("keda", "epp-metrics", mint, audience="keda-gpu-scaler-epp:llm", clock=Clock())

    def minted_so_far(count: int) -> Callable[[], Awaitable[None]]:
        async def check() -> None:
            assert len(minted_tokens) == count and token.read() == minted_tokens[-1]

        return check

    token.start()
    try:
        await eventually(minted_so_far(1))
        token.refused("t1")  # revoked: epp-0 refuses it
        await eventually(minted_so_far(2))
        token.refused("t1")  # epp-1's answer to a request sent with t1 before t2 was minted
        await asyncio.sleep(0.5)  # ten re-mint gaps (0.05 s, doubled once)
        assert minted_tokens == ["t1", "t2"]
        token.refused("t2")  # the current token refused: replaced
        await eventually(minted_so_far(3))
    finally:
        await token.stop()


async def test_a_refusal_while_the_renewal_is_minted_is_answered_by_that_renewal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A picker refuses the current token while its replacement is being minted: the replacement answers
    the refusal. It stayed noted, and a third token was minted one gap later."""
    monkeypatch.setattr(gateway_token, "REMINT_SECONDS", 0.05)
    minted_tokens: list[str] = []
    slow = asyncio.Event()

    async def mint(namespace: str, name: str, seconds: int, audience: str) -> dict[str, Any]:
        minted_tokens.append(f"t{len(minted_tokens) + 1}")
        if len(minted_tokens) == 2:
            await slow.wait()  # the renewal is slow to come
        return answer(minted_tokens[-1], "2027-01-15T08:10:00Z")

    token = MintedToken("keda", "epp-metrics", mint, audience="keda-gpu-scaler-epp:llm", clock=Clock())
    token.start()
    try:
        await eventually(lambda: _count(minted_tokens, 1))
        token.refused(token.read())  # revoked: a new one is asked for
        await eventually(lambda: _count(minted_tokens, 2))
        token.refused(token.read())  # another picker refuses t1 while t2 is under way
        slow.set()
        await asyncio.sleep(0.5)  # ten re-mint gaps
        assert minted_tokens == ["t1", "t2"] and token.read() == "t2"
    finally:
        await token.stop()


async def _count(tokens: list[str], count: int) -> None:
    assert len(tokens) == count


async def test_a_namespace_whose_pickers_are_no_longer_read_loses_its_tokens_and_renewal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its ScaledObjects forgotten, nothing reads its pickers: its MintedToken and renewal task were kept
    # for good, one per namespace ever read. Read again, it starts anew.
    monkeypatch.setattr(gateway_token, "IDLE_SECONDS", 0.2)

    async def mint(namespace: str, name: str, seconds: int, audience: str) -> dict[str, Any]:
        return answer(f"for-{audience}", "2027-01-15T08:00:01Z")  # a 1 s life: renewed at once

    tokens = gateway_token.MintedTokens("keda", "epp-metrics", mint, clock=Clock())
    try:
        with contextlib.suppress(TokenUnavailable):
            tokens.read("tenant-a")  # the first read starts its minting
        first = tokens.of["tenant-a"]

        async def read_then_idle() -> None:
            assert "tenant-a" not in tokens.of

        await eventually(read_then_idle, timeout=10)
        assert first._task is None  # its renewal ended
        with contextlib.suppress(TokenUnavailable):
            tokens.read("tenant-a")
        assert tokens.of["tenant-a"] is not first
    finally:
        await tokens.stop()
