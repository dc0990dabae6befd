"""Fetching endpoint picker (EPP) pages: the scaler's own token, over verified HTTPS only.

The EPP authenticates its metrics by default: it reviews the bearer token it is given (TokenReview)
and asks the API server whether that identity may `get` the non-resource URL /metrics. The scaler
presents its own service account token, which is worth protecting (it reads pods and ScaledObjects
cluster-wide), so:

- it is sent only over HTTPS, and only once the EPP's certificate verified: against `--gateway-ca-file`
  when given (host names are not checked, as EPP pods are reached by IP: give a CA that signs endpoint
  picker certificates), else against the system's CAs with the host name checked, which a
  cluster-internal certificate will fail — the page is then not read, never read unverified;
- an EPP serving plain HTTP is read without it (discovery finds which EPPs serve TLS); if that EPP asks
  for a token, the answer says how to give it TLS or turn its authentication off.

A 401 or 403 answer is a source failure whose reason says which of these applies and what to grant.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from keda_gpu_scaler.collect.http import BearerToken, FetchError, HTTPStatusError, PageFetcher
from keda_gpu_scaler.secretfile import SecretFile

# Where Kubernetes mounts a pod's service account token (projected, rotated by the kubelet).
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
# What the EPP's authorizer checks, and so what the scaler's ServiceAccount must be granted.
METRICS_RULE = '{nonResourceURLs: ["/metrics"], verbs: ["get"]}'


class ServiceAccountToken(BearerToken):
    """The scaler's own service account token, read again whenever the kubelet rotates it."""

    def __init__(self, path: Path | None) -> None:
        super().__init__(None)
        self.path = path
        self._file = SecretFile(path, "the scaler's service account token") if path is not None else None


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

    def __init__(self, inner: PageFetcher, token: ServiceAccountToken, ca_file: Path | None) -> None:
        self._inner = inner
        self._token = token
        self._ca_file = ca_file

    async def get(self, url: str) -> bytes:
        try:
            return await self._inner.get(url)
        except HTTPStatusError as error:
            if error.status == 401:
                raise FetchError(self._unauthorized(url)) from error
            if error.status == 403:
                raise FetchError(
                    f"HTTP 403 Forbidden: the endpoint picker denies the scaler's service account its page;"
                    f" grant that ServiceAccount `get` on the non-resource URL /metrics (a ClusterRole rule"
                    f" {METRICS_RULE}: manifests/base and the chart's rbac.gateway have it)"
                ) from error
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

    def _unauthorized(self, url: str) -> str:
        if urlsplit(url).scheme != "https":
            return (
                "HTTP 401 Unauthorized: the endpoint picker asks for a bearer token but serves its metrics"
                " over plain HTTP, and the scaler sends its service account token over verified HTTPS only;"
                " serve the picker's metrics over TLS (its --metrics-cert-dir) and give the scaler"
                " --gateway-ca-file, or run the picker with --metrics-endpoint-auth=false"
            )
        if self._token.path is None:
            return (
                f"HTTP 401 Unauthorized: the endpoint picker asks for a bearer token and the scaler has no"
                f" service account token ({SERVICE_ACCOUNT_TOKEN} does not exist: it runs outside a pod)"
            )
        return (
            "HTTP 401 Unauthorized: the endpoint picker did not accept the scaler's service account token"
            " (its TokenReview failed: the token is not one of this cluster's, or has expired)"
        )


def gateway_fetcher(
    session: aiohttp.ClientSession,
    *,
    timeout: float,
    max_bytes: int,
    ca_file: Path | None,
    token_file: Path | None = SERVICE_ACCOUNT_TOKEN,
) -> GatewayFetcher:
    """The fetcher of EPP pages: raises ssl.SSLError or OSError for a CA file that cannot be loaded."""
    if token_file is not None and not token_file.exists():
        token_file = None  # not in a pod: nothing to present (a 401 then says so)
    token = ServiceAccountToken(token_file)
    inner = PageFetcher(
        session, timeout=timeout, max_bytes=max_bytes, ssl_context=gateway_ssl(ca_file), token=token
    )
    return GatewayFetcher(inner, token, ca_file)
