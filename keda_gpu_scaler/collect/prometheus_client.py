"""The Prometheus query API over HTTP: credentials, TLS, size-capped answers, errors that say why."""

from __future__ import annotations

import base64
import json
import logging
import ssl
from collections.abc import Callable, Hashable
from contextlib import AbstractAsyncContextManager

import aiohttp

from keda_gpu_scaler.collect.fairshare import FairSlots
from keda_gpu_scaler.collect.http import USER_AGENT, FetchError, PageTooLarge, request
from keda_gpu_scaler.collect.page_workers import in_page_worker
from keda_gpu_scaler.config.secretfile import SecretFile
from keda_gpu_scaler.config.settings import Settings, SettingsError
from keda_gpu_scaler.pages.prometheus_answer import (
    Element,
    PrometheusError,
    api_error,
    parse_vector,
    remote_text,
)
from keda_gpu_scaler.telemetry import Telemetry

# An answer larger than this is decoded off the loop (about 2.5 ms of decoding on it at most).
DECODE_OFF_LOOP_BYTES = 64 * 1024
log = logging.getLogger(__name__)

# Collection rounds querying at once, shared fairly between namespaces (collect/fairshare.py): each also
# has slots of its own, so one tenant's slow queries never hold another's back.
QUERIES_IN_FLIGHT = 8


class Credentials:
    """The headers every query carries: the configured extra headers, then bearer or basic auth."""

    def __init__(self, settings: Settings) -> None:
        self._headers = dict(settings.prometheus_headers)
        token = settings.prometheus_bearer_token_file
        # A secret that cannot be read fails the query like any other reason Prometheus gives no answer.
        self._token = SecretFile(token, "--prometheus-bearer-token-file", PrometheusError) if token else None
        self._username = settings.prometheus_username
        self._password = settings.prometheus_password
        password_file = settings.prometheus_password_file
        self._password_file = (
            SecretFile(password_file, "--prometheus-password-file", PrometheusError)
            if password_file
            else None
        )

    def headers(self) -> dict[str, str]:
        headers = dict(self._headers)
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token.read()}"
        elif self._username is not None:
            password = self._password_file.read() if self._password_file else self._password or ""
            # RFC 7617 with UTF-8: user-id ":" password, base64.
            pair = base64.b64encode(f"{self._username}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {pair}"
        return headers


def prometheus_ssl(settings: Settings) -> ssl.SSLContext | bool:
    """The TLS context for the Prometheus API: a private CA and a client certificate when configured."""
    ca, cert, key = settings.prometheus_ca_file, settings.prometheus_cert_file, settings.prometheus_key_file
    if ca is None and cert is None:
        return True  # the system's trust store
    try:
        context = ssl.create_default_context(cafile=str(ca) if ca else None)
        if cert is not None:
            context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as error:
        raise SettingsError(
            f"--prometheus-ca-file/--prometheus-cert-file/--prometheus-key-file: {error}"
        ) from None
    return context


def http_error(status: int, reason: str | None, location: str | None, body: bytes) -> str:
    """Why a non-200 answer is no answer, quoting at most a short part of what the server said."""
    message = f"HTTP {status} {remote_text(reason or '')}".strip()
    try:
        detail = api_error(json.loads(body))
    except (ValueError, RecursionError):
        detail = None
    if detail:
        message += f": {detail}"
    if status in (401, 403):
        message += (
            " (check the credentials: --prometheus-bearer-token-file, or --prometheus-username with"
            " --prometheus-password-file or KEDA_GPU_SCALER_PROMETHEUS_PASSWORD)"
        )
    elif 300 <= status < 400:
        message += f" (redirect to {remote_text(location or '?')}: give that URL as --prometheus-url)"
    return message


class PrometheusClient:
    """Instant queries against /api/v1/query; every failure becomes a PrometheusError saying why."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        settings: Settings,
        telemetry: Telemetry,
        clock: Callable[[], float],
        ssl_context: ssl.SSLContext | bool = True,
    ) -> None:
        assert settings.prometheus_url is not None
        self._session = session  # the app's: it closes it
        self._ssl = ssl_context  # prometheus_ssl(settings), loaded once at start-up
        self._url = settings.prometheus_url.rstrip("/") + "/api/v1/query"
        self._timeout = settings.prometheus_timeout
        self._max_bytes = settings.max_page_bytes
        self._credentials = Credentials(settings)
        self._telemetry = telemetry
        self._clock = clock
        self.slots = FairSlots(QUERIES_IN_FLIGHT)

    def slot(self, namespace: Hashable) -> AbstractAsyncContextManager[None]:
        """A turn for one namespace's collection round (its queries, one after the other): the rounds of
        all namespaces share the client fairly, so one tenant's slow answers spend its own share only."""
        return self.slots.slot(namespace)

    async def query(self, promql: str, at: float, purpose: str) -> list[Element]:
        """Evaluate `promql` at wall-clock time `at` (seconds); `purpose` labels the query counter.

        The collector asks within a slot() of the namespace the query is for."""
        form = {
            "query": promql,
            "time": f"{at:.3f}",
            # Thanos and VictoriaMetrics' cluster answer with part of the data when a store is down unless
            # told not to; the others ignore the parameters. Part of the data would look like pods gone.
            "partial_response": "false",
            "deny_partial_response": "1",
        }
        started = self._clock()
        try:
            body = await self._post(form)
            if len(body) > DECODE_OFF_LOOP_BYTES:
                # Decoded off the loop, in the page workers by its namespace's turn (PAGE_OWNER): a 15 MiB
                # answer took 0.7 s of the loop in one call, and 256 kB (700 series) 9 ms.
                elements, warnings = await in_page_worker(parse_vector, body)
            else:
                elements, warnings = parse_vector(body)
        except PrometheusError:
            self._count(purpose, "error", started)
            raise
        self._count(purpose, "ok", started)
        if warnings:
            log.debug("Prometheus warnings for a %s query: %s", purpose, "; ".join(warnings[:5]))
        return elements

    async def _post(self, form: dict[str, str]) -> bytes:
        """The body of a 200 answer; PrometheusError saying why there is none."""
        headers = self._credentials.headers()
        headers.setdefault("User-Agent", USER_AGENT)
        # Answers of many series compress well; the body is inflated off the loop (collect/http.py).
        headers.setdefault("Accept-Encoding", "gzip, deflate")
        try:
            answer = await request(
                self._session,
                self._url,
                timeout=self._timeout,
                max_bytes=self._max_bytes,
                ssl_context=self._ssl,
                headers=headers,
                form=form,
            )
        except PageTooLarge as error:
            raise PrometheusError(f"answer too large: {error.args[0]}") from error
        except FetchError as error:
            raise PrometheusError(remote_text(str(error), 200)) from error
        if answer.status != 200:
            # (A redirect is not followed: it could carry the credentials to another host.)
            raise PrometheusError(http_error(answer.status, answer.reason, answer.location, answer.body))
        return answer.body

    def _count(self, purpose: str, result: str, started: float) -> None:
        self._telemetry.prometheus_queries.labels(purpose, result).inc()
        self._telemetry.prometheus_query_duration.observe(self._clock() - started)
