"""Composition root: builds every part from Settings, owns start-up and the ordered shutdown."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import ssl
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from aiohttp import web

from keda_gpu_scaler.collect.gateway import GatewayPages
from keda_gpu_scaler.collect.gateway_fetch import gateway_fetcher
from keda_gpu_scaler.collect.gateway_source import GatewayCollectorSink
from keda_gpu_scaler.collect.gateway_token import FileToken, MintedTokens, one_file_refused
from keda_gpu_scaler.collect.http import client_session, exporter_fetcher, keepalive_for
from keda_gpu_scaler.collect.inference import InferencePages
from keda_gpu_scaler.collect.prometheus import PrometheusCollector
from keda_gpu_scaler.collect.prometheus_client import PrometheusClient, prometheus_ssl
from keda_gpu_scaler.collect.scrape import ScrapeCollector, ScrapeLimits
from keda_gpu_scaler.collect.snapshot import Snapshots, TargetResolver
from keda_gpu_scaler.collect.store import Store
from keda_gpu_scaler.collect.supervise import supervised
from keda_gpu_scaler.collect.wanted import ExporterPage, PodPage, WantedSources, pod_page_bindings
from keda_gpu_scaler.config.settings import Settings, SettingsError, resolve_kubernetes
from keda_gpu_scaler.core.trigger import Source
from keda_gpu_scaler.kubernetes.api import ConnectError, KubeApi, connect
from keda_gpu_scaler.kubernetes.resolver import DiscoveryConfig, KubeDiscovery
from keda_gpu_scaler.server import http_endpoints
from keda_gpu_scaler.server.evaluator import Evaluator, publish
from keda_gpu_scaler.server.health import HealthStatus
from keda_gpu_scaler.server.http_endpoints import http_app
from keda_gpu_scaler.server.logs import quiet_non_http_clients
from keda_gpu_scaler.server.registry import Explanation, Followed, Registry, Subscription
from keda_gpu_scaler.server.service import SERVICE_NAME, ExternalScalerService, add_services
from keda_gpu_scaler.server.subscriptions import Subscriptions
from keda_gpu_scaler.server.tls import ReloadingServerCredentials
from keda_gpu_scaler.telemetry import Telemetry

log = logging.getLogger(__name__)


def grpc_server_options(settings: Settings) -> list[tuple[str, int]]:
    """gRPC server channel options: no shared port, and dead peers found and dropped."""
    return [
        # gRPC sets SO_REUSEPORT by default: a second scaler on the same port would then share it silently
        # and the two would answer alternately with different values. Refuse instead.
        ("grpc.so_reuseport", 0),
        # KEDA sends no keepalive pings. The server pings idle connections, so a peer that vanished
        # (node lost, frozen process) is dropped and its StreamIsActive slots come back.
        ("grpc.keepalive_time_ms", int(settings.keepalive_time * 1000)),
        ("grpc.keepalive_timeout_ms", int(settings.keepalive_timeout * 1000)),
        # Newer gRPC cores time pings out by this one (default 60 s), whatever keepalive_timeout says.
        ("grpc.http2.ping_timeout_ms", int(settings.keepalive_timeout * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Without this, gRPC sends at most one ping per 5 minutes while a stream carries no data, and
        # an idle StreamIsActive carries none for hours.
        ("grpc.http2.min_sent_ping_interval_without_data_ms", int(settings.keepalive_time * 1000)),
    ]


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def gateway_max_staleness(settings: Settings) -> float:
    """Endpoint-picker data older than 2 gateway intervals + --scrape-timeout is not used (5 s at the
    defaults): a replica that stops answering is seen as missing within seconds, and one answering within
    the timeout never is. Each page is stamped when its answer arrives and the next scrape starts at
    most an interval later, so answers come at most an interval + the timeout apart; the second interval
    is the margin for the wait for a fetch slot and the page's reading. (3 intervals, as before, were
    passed by an answer that took over 2 of them, 2 s at the defaults, within the 3 s timeout: the
    pending trigger flapped UNAVAILABLE though every scrape succeeded. Scraping at a fixed rate would not
    do: a quick answer followed by a slow one still comes an interval + the timeout later.)"""
    return 2 * settings.gateway_interval + settings.scrape_timeout


class App:
    """The running scaler. start() binds the ports (port 0 picks a free one), stop() shuts down in order."""

    def __init__(
        self,
        settings: Settings,
        clock: Callable[[], float] = time.monotonic,
        targets: TargetResolver | None = None,
    ) -> None:
        """`targets`: which pods a ScaledObject has, in place of Kubernetes discovery (the benchmark
        simulator's cluster); None: discovery, when --kubernetes is on."""
        if settings.kubernetes == "auto":
            settings = resolve_kubernetes(settings, os.environ)
        self.settings = settings
        self.clock = clock
        self.telemetry = Telemetry()
        self.store = Store()
        # What is collected: every followed trigger's wanted sources, read by every collector.
        self.wanted = WantedSources()
        self.discovery = (
            KubeDiscovery(
                DiscoveryConfig(
                    kubeconfig=settings.kubeconfig,
                    exporter_selectors=settings.exporter_selectors,
                    exporter_namespaces=settings.exporter_namespaces,
                    refresh_interval=settings.discovery_interval,
                    static_urls=frozenset(settings.exporter_urls),
                ),
                self.telemetry,
                self.wanted,
                clock,
            )
            if settings.kubernetes == "on"
            else None
        )
        # EPP replica pages per InferencePool (SPEC §7): fed by discovery or --gateway-url.
        self.gateway_pages = GatewayPages(self.wanted)
        for namespace, pool, url in settings.gateway_urls:
            self.gateway_pages.add_static(namespace, pool, url)
        self.snapshots = Snapshots(
            store=self.store,
            max_staleness=settings.max_staleness,
            prometheus_max_staleness=settings.prometheus_max_staleness,
            clock=clock,
            targets=targets or self.discovery,
            default_source=Source(settings.default_source),
            prometheus_enabled=settings.prometheus_url is not None,
            gateway_pages=self.gateway_pages,
            gateway_max_staleness=gateway_max_staleness(settings),
            demand_forget_after=settings.interest_ttl,
            scrape_interval=settings.scrape_interval,
            gateway_interval=settings.gateway_interval,
        )
        self.evaluator = Evaluator(snapshots=self.snapshots, telemetry=self.telemetry)
        self.registry = Registry(
            ttl=settings.interest_ttl,
            cap=settings.max_scaledobjects,
            clock=clock,
            tracker=self.discovery,
            on_drop=self._dropped,
            on_subscribe=self._subscribed,
            # A StreamIsActive of a forgotten ScaledObject waits on its namespace's data: woken now, it
            # ends (or follows it again) at once, not at its next round.
            on_forget=lambda followed: self.store.wake(followed.namespace),
        )
        self.subscriptions = Subscriptions(
            wanted=self.wanted,
            kind_of=self.evaluator.kind_of,
            followed_in=self.registry.in_namespace,
            discovery=self.discovery,
            exporter_urls=settings.exporter_urls,
            inference_urls=settings.inference_urls,
        )
        if self.discovery is not None:
            self.discovery.on_change = self.subscriptions.changed
        self.telemetry.followed_scaled_objects.set_function(lambda: len(self.registry))
        self.service = ExternalScalerService(
            evaluator=self.evaluator,
            registry=self.registry,
            store=self.store,
            telemetry=self.telemetry,
            stream_recheck_seconds=settings.scrape_interval,
            max_streams=settings.max_streams,
        )
        self.health = HealthStatus(SERVICE_NAME)
        self.grpc_port = 0
        self.tls: ReloadingServerCredentials | None = None
        self.http_port = 0
        # Every HTTP request of the sources (pages and Prometheus queries) goes through this one session.
        self._session: aiohttp.ClientSession | None = None
        self._collector: ScrapeCollector | None = None
        self._server: grpc.aio.Server | None = None
        self._http: web.AppRunner | None = None
        self._prometheus: PrometheusCollector | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._inference_collector: ScrapeCollector | None = None
        self._gateway_collector: ScrapeCollector | None = None
        self._minted: MintedTokens | None = None
        self._token_api: KubeApi | None = None

    def _subscribed(self, followed: Followed, subscription: Subscription) -> None:
        self.subscriptions.subscribed(followed, subscription)

    def _dropped(self, followed: Followed, subscription: Subscription) -> None:
        """A trigger is no longer followed: its series and pages go. Where another trigger of the same
        ScaledObject publishes under the same labels (two triggers may share a metric name), the series
        shows that one's last evaluation again: the dropped trigger's value must not stay on it."""
        labels = subscription.metric_labels
        if labels is not None:
            # Gone first (its learned target too): what the other has no evaluation for stays unshown.
            self.telemetry.forget_labels((labels,))
            sharing = (
                s for s in followed.triggers.values() if s is not subscription and s.metric_labels == labels
            )
            if (other := next(sharing, None)) is not None:
                publish(self.telemetry, labels, other)
        self.subscriptions.dropped(followed, subscription)

    def explanation(self, namespace: str, name: str) -> Explanation | None:
        """The last evaluation of a followed ScaledObject (for /explain and the demo's status lines)."""
        followed = self.registry.get(namespace, name)
        return followed.explanation if followed is not None else None

    def explanations(self, namespace: str, name: str) -> list[Explanation]:
        """The last evaluation of each trigger of a followed ScaledObject (for /explain)."""
        followed = self.registry.get(namespace, name)
        return followed.explanations() if followed is not None else []

    def explained(self) -> list[tuple[str, str]]:
        return [
            key for key in self.registry.followed_keys() if (f := self.registry.get(*key)) and f.explanation
        ]

    async def start(self) -> None:
        s = self.settings
        # Certificate files are loaded first: a bad one stops start-up before anything runs.
        prometheus_tls = prometheus_ssl(s) if s.prometheus_url is not None else True
        limits = ScrapeLimits(s.scrape_interval, s.scrape_timeout, s.max_page_bytes, s.scrape_concurrency)
        self._session = session = client_session(keepalive_for(s))
        try:
            fetcher = exporter_fetcher(session, s)
            # Endpoint-picker pages have their own fetcher: the limited token (minted for
            # --gateway-token-serviceaccount, or --gateway-token-file's), or the scaler's service account
            # token over verified HTTPS only (collect/gateway_fetch.py), never to exporters.
            metrics_token = await self._metrics_token() or self._token_files()
            try:
                epp_fetcher = gateway_fetcher(
                    session,
                    timeout=s.scrape_timeout,
                    max_bytes=s.max_page_bytes,
                    ca_file=s.gateway_ca_file,
                    metrics_token=metrics_token,
                    plain_http=s.gateway_token_plain_http,
                    namespace_of=self._gateway_namespace_of,
                )
            except (ssl.SSLError, OSError) as error:
                raise SettingsError(f"--gateway-ca-file: {error}") from error
        except SettingsError:
            await self._stop_minting()
            await self._close_session()
            raise

        def collector() -> ScrapeCollector:
            return ScrapeCollector(
                fetcher=fetcher,
                store=self.store,
                interest=self.wanted,
                limits=limits,
                telemetry=self.telemetry,
                clock=self.clock,
            )

        # Each collector fetches exactly the sources of its kind some trigger wants (wanted.py).
        self._collector = exporters = collector()
        self.wanted.handle(
            ExporterPage,
            lambda page: exporters.add(page.url, interest_key=page),
            lambda page: exporters.remove(page.url),
        )
        # Inference-server pages: one source per pod.
        self._inference_collector = collector()
        pod_pages = InferencePages(self._inference_collector)
        bindings = pod_page_bindings(pod_pages.add_page, pod_pages.remove, pod_ips=self.discovery is not None)
        self.wanted.handle(PodPage, bindings.added, bindings.removed)
        self.subscriptions.filed_under = bindings.bound
        # Endpoint-picker pages: few (one per EPP replica), scraped every --gateway-interval while a
        # `pending` trigger reads their pool, so a wake from zero follows within that interval.
        self._gateway_collector = ScrapeCollector(
            fetcher=epp_fetcher,
            store=self.store,
            interest=self.wanted,
            limits=ScrapeLimits(s.gateway_interval, s.scrape_timeout, s.max_page_bytes, s.scrape_concurrency),
            telemetry=self.telemetry,
            clock=self.clock,
        )
        self.gateway_pages.start(GatewayCollectorSink(self._gateway_collector))
        if self.discovery is not None:
            try:
                await self.discovery.start(self.gateway_pages)
            except ConnectError as error:
                await self.stop()
                raise SettingsError(f"--kubernetes={s.kubernetes}: {error}") from None
        if s.prometheus_url is not None:
            self._prometheus = PrometheusCollector(
                client=PrometheusClient(session, s, self.telemetry, self.clock, prometheus_tls),
                store=self.store,
                wanted=self.wanted,
                interval=s.scrape_interval,
                max_staleness=s.prometheus_max_staleness,
                clock=self.clock,
                exporter_namespaces=s.exporter_namespaces,
            )
            self._prometheus.start()

        self._server = grpc.aio.server(options=grpc_server_options(s))
        add_services(self._server, self.service, self.health)
        try:
            if s.tls_cert_file is None or s.tls_key_file is None:
                self.grpc_port = self._server.add_insecure_port(s.grpc_address)
            else:
                self.tls = ReloadingServerCredentials(s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file)
                self.grpc_port = self._server.add_secure_port(s.grpc_address, self.tls.credentials)
        except RuntimeError:
            await self.stop()
            # gRPC says only that it could not bind: a certificate it cannot use fails the same way.
            unusable = _unusable_key_pair(s.tls_cert_file, s.tls_key_file)
            if unusable is not None:
                raise SettingsError(unusable) from None
            raise SettingsError(
                f"--grpc-address {s.grpc_address}: cannot listen there (the port is in use, e.g. by another"
                " scaler, or the address is not this host's)"
            ) from None
        await self._server.start()
        await self.health.set_serving(True)

        self._sweeper = supervised(self.registry.sweep, "forget ScaledObjects past --interest-ttl")
        quiet_non_http_clients()  # a gRPC or TLS client on the HTTP port: one line, no traceback
        self._http = web.AppRunner(
            http_app(self.telemetry, self if s.explain else None),
            access_log=None,
            # From the moment a connection opens: a client that sends no complete request in this time
            # (a slowloris trickling header bytes, an idle keep-alive) is closed, so it cannot hoard sockets.
            keepalive_timeout=http_endpoints.HTTP_IDLE_SECONDS,
        )
        await self._http.setup()
        host, port = _split_address(s.http_address)
        site = web.TCPSite(self._http, host, port)
        try:
            await site.start()
        except OSError as error:
            await self.stop()
            raise SettingsError(
                f"--http-address {s.http_address}: cannot listen there ({error.strerror or error})"
            ) from None
        self.http_port = self._http.addresses[0][1]
        self.telemetry.ready = True
        log.info(
            "serving gRPC on %s (port %d, %s), HTTP on %s (port %d); %d exporter(s)",
            s.grpc_address,
            self.grpc_port,
            "plaintext" if self.tls is None else "mTLS" if s.tls_client_ca_file else "TLS",
            s.http_address,
            self.http_port,
            len(s.exporter_urls),
        )

    def _gateway_namespace_of(self, url: str) -> str | None:
        """The namespace of the pool whose picker page url is (the only namespace whose token it gets)."""
        return self._gateway_collector.namespace_of(url) if self._gateway_collector is not None else None

    def _token_files(self) -> FileToken | None:
        """--gateway-token-file's tokens. With Kubernetes, one file for every namespace is refused at once
        (a tenant could obtain it: collect/gateway_token.py); a file that appears later, at its read."""
        path, kubernetes = self.settings.gateway_token_file, self.settings.kubernetes == "on"
        if path is None:
            return None
        if kubernetes and path.is_file():
            raise SettingsError(one_file_refused(path))
        return FileToken(path, one_for_all=not kubernetes)

    async def _metrics_token(self) -> MintedTokens | None:
        """Tokens minted for --gateway-token-serviceaccount, renewed in the background from now on, through
        an API client of their own (discovery's connection is not started yet, and stops on its own)."""
        s = self.settings
        if s.gateway_token_serviceaccount is None:
            return None
        if s.kubernetes != "on":
            raise SettingsError(
                "--gateway-token-serviceaccount needs Kubernetes: its tokens are minted through the API"
                " server, and no in-cluster service account or KUBECONFIG is present (give --kubernetes on"
                " with --kubeconfig, or --gateway-token-file)"
            )
        try:
            self._token_api = KubeApi(await connect(s.kubeconfig))
        except ConnectError as error:
            raise SettingsError(f"--gateway-token-serviceaccount: {error}") from None
        namespace, name = s.gateway_token_serviceaccount
        self._minted = MintedTokens(namespace, name, self._token_api.create_token)
        return self._minted

    async def stop(self) -> None:
        """Health NOT_SERVING, streams end with OK, in-flight calls finish within the grace, then the rest."""
        self.telemetry.ready = False
        await self.health.set_serving(False)
        self.service.close_streams()
        if self._server is not None:
            await self._server.stop(self.settings.shutdown_grace)
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        collecting = (
            self.discovery,
            self._collector,
            self._inference_collector,
            self._gateway_collector,
            self._prometheus,
        )
        for part in collecting:
            if part is not None:
                await part.stop()
        if self._http is not None:
            await self._http.cleanup()
        await self._close_session()
        await self._stop_minting()
        log.info("stopped")

    async def _close_session(self) -> None:
        """Close the HTTP session (its kept connections) once nothing fetches any more."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def _stop_minting(self) -> None:
        if self._minted is not None:
            await self._minted.stop()
            self._minted = None
        if self._token_api is not None:
            await self._token_api.close()
            self._token_api = None


async def run_until_signalled(
    app: App, alongside: Callable[[], Coroutine[Any, Any, None]] | None = None
) -> None:
    """Start the app (and `alongside`, if given), wait for SIGTERM or SIGINT, stop both."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    # SIGHUP too: a closed terminal or a supervisor's "reload" must not skip the graceful path.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stopping.set)
    await app.start()
    # The process is the scaler's alone from here: what start-up built (modules, gRPC, protobuf, the app)
    # lives as long as it, and frozen it is no longer walked by every full collection. One freeze, the
    # usual practice: freezing again after every full collection, and a 1 ms GIL switch interval, did not
    # shorten the RPC tail at 100 ScaledObjects and 1,000 pods (docs/BENCHMARKS.md, "Caches"). A process's
    # setting, so made here and not by App, which tests and tools embed.
    gc.freeze()
    extra = asyncio.create_task(alongside()) if alongside else None
    try:
        await stopping.wait()
        log.info("signal received: shutting down")
    finally:
        # The process as it was before serving (it may go on: tests and tools embed this).
        gc.unfreeze()
        if extra is not None:
            extra.cancel()
            await asyncio.gather(extra, return_exceptions=True)
        await app.stop()


def _unusable_key_pair(cert: Path | None, key: Path | None) -> str | None:
    """Why --tls-cert-file and --tls-key-file cannot serve TLS (not PEM, or a key of another
    certificate), naming both flags; None when they can, or when TLS is off."""
    if cert is None or key is None:
        return None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, ValueError) as error:
        return (
            f"--tls-cert-file {cert} and --tls-key-file {key}: not a PEM certificate and its private key"
            f" ({error.__class__.__name__}: {str(error)[:120]})"
        )
    except OSError:
        return None  # unreadable: the credentials' own read names the file
    return None
