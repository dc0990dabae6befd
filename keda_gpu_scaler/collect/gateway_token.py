"""Where the endpoint pickers' limited token comes from: files, or tokens the scaler mints and renews.

Both answer the same questions for the gateway fetch: the token for the pickers of a namespace (read()
raises TokenUnavailable, whose message names the flag and what to fix), whose token it is (identity(), for
messages), and what a picker's 401 or 403 to it means (refused()).

Minted tokens (--gateway-token-serviceaccount) come from the TokenRequest API: a pod can mount projected
tokens of its own ServiceAccount only, and the scaler's own identity reads pods cluster-wide, so the
scaler asks the API server for short-lived tokens of a ServiceAccount whose only right is `get` on the
non-resource URL /metrics. They are scoped per namespace: the pickers of namespace N get a token minted
for the audience `keda-gpu-scaler-epp:N` only, which the API server itself does not accept and a picker
checking its own namespace's audience accepts; a tenant whose pod receives it (its pool, its Service,
its port) cannot read another namespace's picker with it (docs/SECURITY.md). A background task per
namespace renews each at 80 % of its life, retries with backoff when the API server refuses or cannot be
reached, keeps serving the last token until it expires (a scrape never waits for the API server), and
mints at once, with backoff, when a picker refuses the token (revoked).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from keda_gpu_scaler.collect.supervise import supervised
from keda_gpu_scaler.config.secretfile import SecretFile, SecretFileError
from keda_gpu_scaler.core.errors import KubeError
from keda_gpu_scaler.core.names import is_namespace

log = logging.getLogger(__name__)

FILE_FLAG = "--gateway-token-file"
SERVICEACCOUNT_FLAG = "--gateway-token-serviceaccount"
# The shortest life the API server grants a TokenRequest (it refuses less than 10 minutes).
TOKEN_SECONDS = 600
# Renewed at this share of a token's life, so an outage of the API server has the rest to pass.
RENEW_AT = 0.8
# A token stops being sent this long before its expiry (at most 10 s, 5 % of its life): one sent at the
# last moment would arrive expired, or meet a clock a little ahead of this one.
EXPIRY_MARGIN_SECONDS = 10.0
EXPIRY_MARGIN_SHARE = 0.05
FIRST_RETRY_SECONDS = 0.5
MAX_RETRY_SECONDS = 30.0
# A token a picker refuses (401/403: revoked, say) is replaced at once, but never sooner than this after
# the last mint, doubled for each replacement refused again: a picker that refuses every token costs the
# API server a TokenRequest every 5, 10, 20 … s at most, never a storm.
REMINT_SECONDS = 5.0
# The audience of the tokens the pickers of one namespace get (never the API server's).
AUDIENCE_PREFIX = "keda-gpu-scaler-epp:"
WHERE_TO_GRANT = "the chart's gateway.metricsToken, manifests/components/gateway-metrics-token"


class TokenUnavailable(SecretFileError):
    """There is no token to send; the message names the flag and what to fix. A SecretFileError, so the
    fetchers record it as the page's failure exactly like an unreadable token file."""


class TokenSource(Protocol):
    """The limited token endpoint pickers get, whichever way it is obtained."""

    flag: str

    def read(self, namespace: str) -> str:
        """The token for the pickers of `namespace`; raises TokenUnavailable saying why there is none."""
        ...

    def identity(self, namespace: str) -> str:
        """Whose token it is, for messages ("the ServiceAccount ... of --flag ...")."""
        ...

    def refused(self, namespace: str, token: str) -> None:
        """A picker of `namespace` answered 401 or 403 to `token`, the one its request carried."""
        ...

    def accepted(self, namespace: str) -> None:
        """A picker of `namespace` served its page to the token."""
        ...


class FileToken:
    """--gateway-token-file: a directory holding one token per namespace (the file named after it: a
    Secret with one key per namespace, mounted), or one file. Each is read again whenever it changes and
    never kept once it is gone or empty.

    One file means one token for every namespace's pickers. With Kubernetes discovery a tenant decides
    where its pool's picker is (its InferencePool, Service, pod and port), so a tenant pointing its pool at
    a pod of its own would obtain that token and read every other namespace's pickers with it (SPEC §7):
    one file is sent only where `one_for_all` (without Kubernetes, the pickers are the operator's own
    --gateway-url addresses); otherwise the page fails saying to give a directory."""

    flag = FILE_FLAG

    def __init__(self, path: Path, *, one_for_all: bool = True) -> None:
        self.path = path
        self._one_for_all = one_for_all
        self._files: dict[Path, SecretFile] = {}  # each file read, by path: the one, or a namespace's

    def read(self, namespace: str) -> str:
        if self.path.is_dir():
            path = self._namespace_file(namespace)
        elif self.path.exists() and not self._one_for_all:
            raise TokenUnavailable(one_file_refused(self.path))
        else:
            path = self.path  # one file, or nothing there yet: its read says which
        secret = self._files.get(path)
        if secret is None:
            secret = self._files[path] = SecretFile(path, FILE_FLAG, TokenUnavailable)
        return secret.read()

    def _namespace_file(self, namespace: str) -> Path:
        if not namespace:
            raise TokenUnavailable(f"{FILE_FLAG} {self.path}: a page of no pool is no namespace's: no token")
        if not is_namespace(namespace):  # never a path outside the directory
            raise TokenUnavailable(f"{FILE_FLAG}: {namespace[:100]!r} is not a namespace name")
        path = self.path / namespace
        if not path.exists():
            raise TokenUnavailable(
                f"{FILE_FLAG} {self.path}: no token for namespace {namespace!r}: add the file {namespace}"
                f" (the key {namespace} of the Secret mounted there) holding a token its endpoint pickers"
                " accept"
            )
        return path

    def identity(self, namespace: str) -> str:
        path = self.path / namespace if self.path.is_dir() else self.path
        return f"the token of {FILE_FLAG} {path}"

    def refused(self, namespace: str, token: str) -> None:
        pass  # the file is read again as soon as it changes: nothing to ask for

    def accepted(self, namespace: str) -> None:
        pass


def one_file_refused(path: Path) -> str:
    """Why one token file is not sent with Kubernetes discovery, and what to give instead."""
    return (
        f"{FILE_FLAG} {path} is one file: with Kubernetes its token would go to every namespace's endpoint"
        " pickers, and a tenant pointing its InferencePool at a pod of its own would obtain it and read"
        " every other namespace's pickers; give a directory with one token file per namespace, named after"
        f" it (a Secret with one key per namespace, mounted), or {SERVICEACCOUNT_FLAG}"
    )


def audience(namespace: str) -> str:
    """The only audience of the tokens the pickers of `namespace` get."""
    return f"{AUDIENCE_PREFIX}{namespace}"


# mint(namespace, name, seconds, audience) → the TokenRequest answer (KubeApi.create_token); raises KubeError.
Mint = Callable[[str, str, int, str], Awaitable[dict[str, Any]]]


def _expiry(answer: dict[str, Any]) -> tuple[str, float]:
    """The token and its expiry (seconds since the epoch) of a TokenRequest answer; ValueError if absent."""
    status = answer.get("status") if isinstance(answer, dict) else None
    token = status.get("token") if isinstance(status, dict) else None
    stamp = status.get("expirationTimestamp") if isinstance(status, dict) else None
    if not isinstance(token, str) or not token or not isinstance(stamp, str):
        raise ValueError("the TokenRequest answer has no status.token and status.expirationTimestamp")
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    if when.tzinfo is None:
        raise ValueError(f"status.expirationTimestamp {stamp[:40]!r} has no time zone")
    return token, when.timestamp()


# A namespace's tokens whose pickers were not read for this long (its ScaledObjects forgotten: the
# default --interest-ttl is 600 s) go with their renewal task; read again, minting starts anew.
IDLE_SECONDS = 900.0


class MintedToken:
    """Tokens of a ServiceAccount for one audience, minted through the TokenRequest API and renewed in the
    background; read() only looks at what the last mint left."""

    def __init__(
        self,
        namespace: str,
        name: str,
        mint: Mint,
        *,
        audience: str,
        seconds: int = TOKEN_SECONDS,
        clock: Callable[[], float] = time.time,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        self.namespace = namespace
        # Told when nothing read a token for IDLE_SECONDS since the last mint: its renewal ends.
        self._on_idle = on_idle
        self.name = name
        self.audience = audience
        self._mint = mint
        self._seconds = seconds
        # Wall clock: expirationTimestamp is a wall-clock time of the API server.
        self._clock = clock
        self._token: str | None = None
        self._expires = 0.0
        self._usable_until = 0.0  # the expiry less the margin
        self._life = float(seconds)  # the life of the last token minted (the API server may change it)
        self._failure: str | None = None  # why the last mint failed; None after a success
        self._task: asyncio.Task[None] | None = None
        self.minted = 0  # tokens minted so far
        # A picker refused the current token: replaced once the gap since the last mint has passed.
        self._refused = False
        self._refusal_logged = False
        self._last_refusal = -float("inf")  # monotonic (the loop's clock)
        self._remint_gap = REMINT_SECONDS
        self._last_mint = -float("inf")  # monotonic
        self._wake = asyncio.Event()
        # A picker page was read with this namespace's tokens since the last mint (the first read starts
        # minting): a namespace no longer read gets no new token and no retry.
        self._read_since_mint = True
        self._read_again = asyncio.Event()

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def identity(self) -> str:
        return f"the ServiceAccount {self.ref} ({SERVICEACCOUNT_FLAG}, audience {self.audience})"

    def refused(self, token: str) -> None:
        """A picker answered 401 or 403 to `token`. A token already replaced says nothing of its
        replacement: a request sent with it before the new one was minted, and answered after, asks for
        nothing (one revocation costs one new token)."""
        if token != self._token:
            return
        if not self._refusal_logged:
            log.warning(
                "an endpoint picker refused the token of ServiceAccount %s (audience %s): minting a new one",
                self.ref,
                self.audience,
            )
            self._refusal_logged = True
        self._refused = True
        self._last_refusal = asyncio.get_running_loop().time()
        self._wake.set()

    def accepted(self) -> None:
        """A picker read its page with the token: the refusals are over once none came for a whole gap.
        One picker refusing beside one accepting keeps the gap doubling (reset at every acceptance, it
        was a TokenRequest every REMINT_SECONDS for ever)."""
        if asyncio.get_running_loop().time() - self._last_refusal < self._remint_gap:
            return
        self._refused = self._refusal_logged = False
        self._remint_gap = REMINT_SECONDS

    def read(self) -> str:
        if not self._read_since_mint:
            self._read_since_mint = True
            self._read_again.set()
        now = self._clock()
        if self._token is not None and now < self._usable_until:
            return self._token
        if self._token is not None:
            expired = datetime.fromtimestamp(self._expires).astimezone().isoformat(timespec="seconds")
            why = (
                f"renewing it failed: {self._failure}"
                if self._failure
                else "it has not been renewed yet (no answer from the API server)"
            )
            raise TokenUnavailable(
                f"{SERVICEACCOUNT_FLAG} {self.ref}: the last minted token is no longer sent (it expires at"
                f" {expired}), and {why}"
            )
        raise TokenUnavailable(
            f"{SERVICEACCOUNT_FLAG} {self.ref}: no token minted yet: "
            f"{self._failure or 'the first TokenRequest is under way'}"
        )

    def start(self) -> None:
        if self._task is None:
            self._task = supervised(self._renew_forever, f"mint tokens of ServiceAccount {self.ref}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def cancel(self) -> None:
        """Stop renewing, without waiting for the task to end (from within it)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _renew_forever(self) -> None:
        retry = FIRST_RETRY_SECONDS
        while True:
            if not await self._until_read(IDLE_SECONDS):
                if self._on_idle is not None:
                    self._on_idle()  # forgets these tokens and cancels this task
                    await asyncio.Event().wait()  # until cancelled (a supervised task that returns restarts)
                continue
            life = await self.mint_once()
            if life is not None:
                retry = FIRST_RETRY_SECONDS
                await self._until_renewal(life * RENEW_AT)
                continue
            # Backoff, never longer than a tenth of a token's life (short-lived tokens retry sooner).
            await asyncio.sleep(retry)
            retry = min(retry * 2, MAX_RETRY_SECONDS, max(FIRST_RETRY_SECONDS, self._life / 10))

    async def _until_read(self, idle: float) -> bool:
        """Until a picker page is read with these tokens since the last mint: once a namespace's
        ScaledObjects are forgotten (SPEC §2) its pool is no longer read, and it is minted no more tokens
        (nor retried while minting fails) until it is read again. False: not read for `idle` seconds."""
        while not self._read_since_mint:
            self._read_again.clear()
            try:
                await asyncio.wait_for(self._read_again.wait(), idle)
            except TimeoutError:
                return False
        return True

    async def _until_renewal(self, seconds: float) -> None:
        """Wait `seconds`, or less when a picker refused the token: until the gap since the last mint has
        passed (then the next refusal waits twice as long, until a picker accepts a token again)."""
        loop = asyncio.get_running_loop()
        renew_at = loop.time() + seconds
        while loop.time() < renew_at:
            self._wake.clear()
            if self._refused:
                remint_at = self._last_mint + self._remint_gap
                if loop.time() >= remint_at:
                    self._refused = False
                    self._remint_gap = min(self._remint_gap * 2, seconds)
                    return
                wake_at = min(renew_at, remint_at)
            else:
                wake_at = renew_at
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, wake_at - loop.time()))

    async def mint_once(self) -> float | None:
        """Ask for a new token; the seconds it lives, or None when minting failed (the reason kept)."""
        self._last_mint = asyncio.get_running_loop().time()
        self._read_since_mint = False
        try:
            token, expires = _expiry(
                await self._mint(self.namespace, self.name, self._seconds, self.audience)
            )
        except KubeError as error:
            self._failed(self._explain(error))
            return None
        except ValueError as error:
            self._failed(f"the API server's answer cannot be used: {error}")
            return None
        life = expires - self._clock()
        if life <= 0:
            self._failed(
                "the API server minted a token that has already expired (is this host's clock right?)"
            )
            return None
        if self._failure is not None or self._token is None:
            log.info("minted a token of ServiceAccount %s for %s (%.0fs)", self.ref, self.audience, life)
        # A refusal of the token just replaced (one came while this mint was under way) is answered by it.
        self._refused = False
        self._token, self._expires, self._life, self._failure = token, expires, life, None
        self._usable_until = expires - min(EXPIRY_MARGIN_SECONDS, life * EXPIRY_MARGIN_SHARE)
        self.minted += 1
        return life

    def _failed(self, reason: str) -> None:
        if reason != self._failure:
            log.warning("%s %s: minting a token failed: %s", SERVICEACCOUNT_FLAG, self.ref, reason)
        self._failure = reason
        return None

    def _explain(self, error: KubeError) -> str:
        if error.status == 403:
            return (
                f"the API server denies the scaler `create` on serviceaccounts/token for {self.name!r} in"
                f" namespace {self.namespace!r}: grant the scaler's ServiceAccount a Role in"
                f' {self.namespace!r} with the rule {{apiGroups: [""], resources: ["serviceaccounts/token"],'
                f' resourceNames: ["{self.name}"], verbs: ["create"]}} ({WHERE_TO_GRANT})'
            )
        if error.status == 404:
            return (
                f"there is no ServiceAccount {self.name!r} in namespace {self.namespace!r}: create it and"
                ' give it a ClusterRole rule {nonResourceURLs: ["/metrics"], verbs: ["get"]} only'
                f" ({WHERE_TO_GRANT}), or name another with {SERVICEACCOUNT_FLAG}"
            )
        return str(error)


class MintedTokens:
    """--gateway-token-serviceaccount: a MintedToken per namespace whose pickers are read, for that
    namespace's audience only; a namespace's first read starts its minting."""

    flag = SERVICEACCOUNT_FLAG

    def __init__(self, namespace: str, name: str, mint: Mint, **options: Any) -> None:
        self.namespace = namespace
        self.name = name
        self._mint = mint
        self._options = options
        self.of: dict[str, MintedToken] = {}  # picker namespace → its tokens

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def _tokens(self, namespace: str) -> MintedToken:
        tokens = self.of.get(namespace)
        if tokens is None:
            tokens = self.of[namespace] = MintedToken(
                self.namespace,
                self.name,
                self._mint,
                audience=audience(namespace),
                on_idle=lambda: self._forget(namespace, tokens),
                **self._options,
            )
            tokens.start()
        return tokens

    def _forget(self, namespace: str, tokens: MintedToken | None) -> None:
        """A namespace whose pickers nobody read for IDLE_SECONDS: its tokens go (read again, it starts
        anew), or every namespace ever read would keep a token and its renewal for good."""
        if tokens is not None and self.of.get(namespace) is tokens:
            del self.of[namespace]
            tokens.cancel()

    def read(self, namespace: str) -> str:
        return self._tokens(namespace).read()

    def identity(self, namespace: str) -> str:
        return self._tokens(namespace).identity()

    def refused(self, namespace: str, token: str) -> None:
        self._tokens(namespace).refused(token)

    def accepted(self, namespace: str) -> None:
        self._tokens(namespace).accepted()

    async def stop(self) -> None:
        tokens, self.of = self.of, {}
        for token in tokens.values():
            await token.stop()
