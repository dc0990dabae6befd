"""Fetching endpoint picker (EPP) pages: which token goes to a picker, over what, and what a refusal means.

The EPP authenticates its metrics by default (llm-d: `--metrics-endpoint-auth=true`, over plain HTTP on
9090): it reviews the bearer token it is given (TokenReview) and asks the API server whether that
identity may `get` the non-resource URL /metrics (SubjectAccessReview). Two tokens can answer it:

- the token of an identity of its own whose only right is that `get` (collect/gateway_token.py): minted
  for `--gateway-token-serviceaccount` through the TokenRequest API (10-minute tokens renewed in the
  background, one per namespace for that namespace's audience only, sent only to the pickers whose pages
  are filed under that namespace; the chart and manifests/components/gateway-metrics-token set it up), or read from
  `--gateway-token-file` whenever the file changes, never kept once the file is gone or empty. It goes
  over HTTPS, and over plain HTTP only where the operator says so with `--gateway-token-plain-http on`:
  whoever sees it there can read EPP metrics, nothing more, for minutes.
- otherwise the scaler's own service account token, which is worth protecting (it reads pods and
  ScaledObjects cluster-wide): it is sent only over HTTPS, and only once the EPP's certificate verified,
  never over plain HTTP.

HTTPS is verified against `--gateway-ca-file` when given (host names are not checked, as EPP pods are
reached by IP: give a CA that signs endpoint picker certificates), else against the system's CAs with the
host name checked, which a cluster-internal certificate will fail — the page is then not read, never read
unverified. A 401 or 403 answer is a source failure whose reason names the setting and the RBAC to fix,
and asks for a new minted token at once (a revoked one is not kept until its renewal).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from keda_gpu_scaler.collect.gateway_token import (
    SERVICEACCOUNT_FLAG,
    MintedTokens,
    TokenSource,
    TokenUnavailable,
    audience,
)
from keda_gpu_scaler.collect.http import BearerToken, FetchError, HTTPStatusError, PageFetcher, is_https
from keda_gpu_scaler.config.secretfile import SecretFile

# Where Kubernetes mounts a pod's service account token (projected, rotated by the kubelet).
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
# What the EPP's authorizer checks, and so what the scaler's ServiceAccount must be granted.
METRICS_RULE = '{nonResourceURLs: ["/metrics"], verbs: ["get"]}'


TOKEN_FLAG = "--gateway-token-file"
PLAIN_HTTP_FLAG = "--gateway-token-plain-http"


class GatewayToken(BearerToken):
    """The token endpoint pickers get: the limited one of a TokenSource (--gateway-token-file, or tokens
    minted for --gateway-token-serviceaccount), or the scaler's own service account token file.

    `plain_http`: also sent over plain HTTP. Only ever true for the limited identity. `namespace_of`: the
    namespace a page URL is filed under (its pool's), whose token alone that page gets."""

    def __init__(self, source: TokenSource | None, *, dedicated: bool, plain_http: bool = False) -> None:
        super().__init__(None)
        assert dedicated or not plain_http  # the scaler's own token never goes over plain HTTP
        self.dedicated = dedicated
        self.plain_http = plain_http
        self.source = source
        # The flag that names the limited token, for messages.
        self.flag = source.flag if dedicated and source is not None else TOKEN_FLAG
        self.namespace_of: Callable[[str], str | None] = lambda url: None
        # The token each request in flight carries, by page URL (one fetch of a page at a time): a refusal
        # is of that token, which may have been replaced while the request was under way.
        self._carried: dict[str, str] = {}

    def namespace(self, url: str) -> str:
        namespace = self.namespace_of(url)
        if namespace is None and isinstance(self.source, MintedTokens):
            # Minted tokens are per namespace: a page of no pool is no namespace's, and gets none.
            raise TokenUnavailable(f"{url} is no endpoint picker page of a pool: no token is sent to it")
        return namespace or ""

    def header(self, url: str) -> str | None:
        if self.source is None or not self.sent(is_https(url)):
            return None
        token = self._carried[url] = self.source.read(self.namespace(url))
        return f"Bearer {token}"

    def sent(self, https: bool) -> bool:
        """Whether a request over this scheme carries the token."""
        return self.source is not None and (https or self.plain_http)

    def answered(self, url: str, *, accepted: bool) -> None:
        """Tell the token's source whether the picker at url took the token its request carried (a
        refused minted one is replaced, unless it already was)."""
        token = self._carried.pop(url, None)
        if self.source is None or token is None:
            return
        if accepted:
            self.source.accepted(self.namespace(url))
        else:
            self.source.refused(self.namespace(url), token)

    def done(self, url: str) -> None:
        """The request to url ended (answered or not): what it carried is forgotten."""
        self._carried.pop(url, None)

    def holder(self, url: str) -> str:
        """Who the picker is told the caller is, in a message."""
        if self.dedicated and self.source is not None:
            return self.source.identity(self.namespace(url))
        return "the scaler's service account token"


class _OwnToken:
    """The scaler's own service account token file (rotated by the kubelet), for verified HTTPS only."""

    flag = "the scaler's service account token"

    def __init__(self, path: Path) -> None:
        self._file = SecretFile(path, self.flag)

    def read(self, namespace: str) -> str:
        return self._file.read()

    def identity(self, namespace: str) -> str:
        return "the scaler's service account token"

    def refused(self, namespace: str, token: str) -> None:
        pass  # the kubelet rotates it

    def accepted(self, namespace: str) -> None:
        pass


def gateway_ssl(ca_file: Path | None) -> ssl.SSLContext:
    """TLS for EPPs: only certificates chaining to `ca_file` (any host name), else the system's CAs."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    if ca_file is not None:
        # EPP pods are reached by IP, which their serving certificates do not name (they name the
        # Service). The CA the operator gives is the trust anchor: it should sign EPP certificates only.
        context.check_hostname = False
    return context


class GatewayFetcher:
    """EPP pages through a PageFetcher; 401, 403 and unverifiable certificates say what to do."""

    def __init__(self, inner: PageFetcher, token: GatewayToken, ca_file: Path | None) -> None:
        self._inner = inner
        self._token = token
        self._ca_file = ca_file

    async def get(self, url: str) -> bytes:
        try:
            return await self._get(url)
        finally:
            self._token.done(url)

    async def _get(self, url: str) -> bytes:
        try:
            page = await self._inner.get(url)
        except HTTPStatusError as error:
            https = urlsplit(url).scheme == "https"
            if error.status in (401, 403):
                self._token.answered(url, accepted=False)
            if error.status == 401:
                raise FetchError(self._unauthorized(https, url)) from error
            if error.status == 403:
                raise FetchError(self._forbidden(https, url)) from error
            raise
        except FetchError as error:
            if "CERTIFICATE_VERIFY_FAILED" in str(error) or "SSLCertVerificationError" in str(error):
                trust = (
                    f"--gateway-ca-file {self._ca_file}"
                    if self._ca_file
                    else "the system's CAs (give --gateway-ca-file with the CA that signs the endpoint"
                    " picker's certificate)"
                )
                raise FetchError(
                    f"the endpoint picker's certificate does not verify against {trust}; its page is not"
                    f" read and the scaler's token is not sent ({error})"
                ) from error
            raise
        self._token.answered(url, accepted=True)
        return page

    def _unauthorized(self, https: bool, url: str) -> str:
        head = (
            "HTTP 401 Unauthorized: the endpoint picker asks for a bearer token (its --metrics-endpoint-auth"
        )
        grant = (
            f"; the identity needs a ClusterRole rule {METRICS_RULE} (the chart's gateway.metricsToken,"
            " manifests/components/gateway-metrics-token)"
        )
        if self._token.sent(https) and isinstance(self._token.source, MintedTokens):
            # The likeliest cause: a picker reviewing tokens for the API server's audience (llm-d's built-in
            # --metrics-endpoint-auth), which a token scoped to one namespace never carries.
            return (
                f"{head}) and did not accept {self._token.holder(url)}, a token for the audience"
                f" {audience(self._token.namespace(url))!r} only (never the API server's, so that a tenant"
                " given it cannot read another namespace's picker): have the picker's metrics reviewed for"
                " that audience, e.g. kube-rbac-proxy in front of it with --auth-token-audiences (docs/SECURITY.md,"
                f" 'Endpoint picker pages and their token'); if it does, the token was revoked or expired{grant}"
            )
        if self._token.sent(https):
            return (
                f"{head}) and did not accept {self._token.holder(url)} (its TokenReview failed: the token is"
                f" not one of this cluster's, or has expired){grant}"
            )
        if not https:
            if self._token.dedicated:
                return (
                    f"{head}, on by default) over plain HTTP, and the token of {self._token.flag} goes"
                    f" over plain HTTP only with {PLAIN_HTTP_FLAG} on (the chart's"
                    " gateway.metricsToken.plainHTTP);"
                    " or serve the picker's metrics over TLS (its --metrics-cert-dir) and give the scaler"
                    " --gateway-ca-file"
                )
            return (
                f"{head}, on by default) over plain HTTP, and the scaler never sends its own service account"
                f" token over plain HTTP: give it {SERVICEACCOUNT_FLAG} NAMESPACE/NAME, a ServiceAccount"
                " whose only right is `get` on the non-resource URL /metrics, whose short-lived tokens it"
                f" mints (or {TOKEN_FLAG} with such a token), and {PLAIN_HTTP_FLAG} on (the chart's"
                " gateway.metricsToken), or serve the picker's metrics over TLS (its --metrics-cert-dir) and"
                " give the scaler --gateway-ca-file, or run the picker with --metrics-endpoint-auth=false"
            )
        return (
            f"{head}) and the scaler has no service account token to present ({SERVICE_ACCOUNT_TOKEN} does"
            f" not exist: it runs outside a pod): give it {SERVICEACCOUNT_FLAG} or {TOKEN_FLAG}{grant}"
        )

    def _forbidden(self, https: bool, url: str) -> str:
        who = self._token.holder(url) if self._token.sent(https) else "a caller without a token"
        if not self._token.dedicated:
            fix = "grant the scaler's ServiceAccount"
        elif isinstance(self._token.source, MintedTokens):
            fix = f"grant the ServiceAccount {self._token.source.ref} ({SERVICEACCOUNT_FLAG})"
        else:
            fix = f"grant the ServiceAccount whose token {TOKEN_FLAG} holds"
        return (
            f"HTTP 403 Forbidden: the endpoint picker denies {who} its page (its SubjectAccessReview for"
            f" `get` on the non-resource URL /metrics failed); {fix} a ClusterRole rule {METRICS_RULE}"
            " (the chart's gateway.metricsToken and rbac.gateway, manifests/components/gateway-metrics-token"
            " and manifests/base have it)"
        )


def gateway_fetcher(
    session: aiohttp.ClientSession,
    *,
    timeout: float,
    max_bytes: int,
    ca_file: Path | None,
    token_file: Path | None = SERVICE_ACCOUNT_TOKEN,
    metrics_token: TokenSource | None = None,
    plain_http: bool = False,
    namespace_of: Callable[[str], str | None] = lambda url: None,
) -> GatewayFetcher:
    """The fetcher of EPP pages: raises ssl.SSLError or OSError for a CA file that cannot be loaded.

    The limited token — `metrics_token` (minted for --gateway-token-serviceaccount, or the files of
    --gateway-token-file) — replaces the scaler's own token (`token_file`) for
    pickers; `plain_http` (--gateway-token-plain-http) lets it go over plain HTTP too; `namespace_of`: the
    namespace a page URL is filed under (a token goes to pages of a namespace only)."""
    if metrics_token is not None:
        token = GatewayToken(metrics_token, dedicated=True, plain_http=plain_http)
    else:
        if token_file is not None and not token_file.exists():
            token_file = None  # not in a pod: nothing to present (a 401 then says so)
        token = GatewayToken(_OwnToken(token_file) if token_file else None, dedicated=False)
    token.namespace_of = namespace_of
    inner = PageFetcher(
        session, timeout=timeout, max_bytes=max_bytes, ssl_context=gateway_ssl(ca_file), token=token
    )
    return GatewayFetcher(inner, token, ca_file)
