"""A real Prometheus server on loopback for the tests, exporters it scrapes, and a proxy in front of it."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import bcrypt
from aiohttp import web
from support import ExporterServer

PROMETHEUS_BIN = shutil.which("prometheus")
USERNAME = "keda"
PASSWORD = "gpu-scaler-test-password"

# Two scrape jobs, as clusters have them. "operator": honor_labels false (the default), so where a page
# has its own namespace/pod/container, those become exported_* and the target labels kube-prometheus gives
# a dcgm-exporter pod take their place. "direct": honor_labels true, the page's labels kept as printed and
# the target's added only where the page has none (a device-level series then names the exporter pod).
JOBS = {"operator": False, "direct": True}


def basic_auth() -> str:
    return "Basic " + base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def operator_labels(exporter_pod: str) -> dict[str, str]:
    """The target labels of a dcgm-exporter pod scraped through a kube-prometheus ServiceMonitor."""
    return {
        "namespace": "gpu-operator",
        "pod": exporter_pod,
        "container": "nvidia-dcgm-exporter",
        "service": "nvidia-dcgm-exporter",
        "endpoint": "gpu-metrics",
    }


class PrometheusServer:
    """The Debian `prometheus` binary with its own config: 1 s scrapes, basic auth, file-based targets.

    Targets live in file_sd files (one per job and group name) that Prometheus watches, so tests add and
    remove exporters while it runs.
    """

    def __init__(self, root: Path) -> None:
        assert PROMETHEUS_BIN is not None
        self.root = root
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        self.port = free_port()
        (self.root / "targets").mkdir(parents=True, exist_ok=True)
        jobs = [
            {
                "job_name": job,
                "honor_labels": honor,
                "file_sd_configs": [
                    {"files": [str(self.root / "targets" / f"{job}-*.json")], "refresh_interval": "1s"}
                ],
            }
            for job, honor in JOBS.items()
        ]
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}, "scrape_configs": jobs}
        # JSON is YAML: no YAML writer needed.
        (self.root / "prometheus.yml").write_text(json.dumps(config))
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
        (self.root / "web.yml").write_text(json.dumps({"basic_auth_users": {USERNAME: hashed}}))
        log = (self.root / "prometheus.log").open("wb")
        assert PROMETHEUS_BIN is not None
        self._process = subprocess.Popen(
            [
                PROMETHEUS_BIN,
                f"--config.file={self.root / 'prometheus.yml'}",
                f"--web.config.file={self.root / 'web.yml'}",
                f"--storage.tsdb.path={self.root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(self.root / 'prometheus.log').read_text()[-2000:]}")
            try:
                if self._get("/-/ready").status == 200:
                    return
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("prometheus did not become ready in time")
            time.sleep(0.1)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def set_targets(self, job: str, group: str, targets: list[tuple[str, dict[str, str]]]) -> None:
        """Replace one group of a job's targets: (host:port, target labels) pairs; [] removes them."""
        path = self.root / "targets" / f"{job}-{group}.json"
        document = [{"targets": [address], "labels": labels} for address, labels in targets]
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(document))
        os.replace(temporary, path)  # Prometheus never reads half a file

    def query(self, promql: str) -> list[dict[str, Any]]:
        body = urllib.parse.urlencode({"query": promql}).encode()
        with self._get("/api/v1/query", body) as response:
            result: list[dict[str, Any]] = json.loads(response.read())["data"]["result"]
            return result

    def _get(self, path: str, body: bytes | None = None) -> Any:
        request = urllib.request.Request(self.url + path, data=body)
        request.add_header("Authorization", basic_auth())
        return urllib.request.urlopen(request, timeout=5)


class ExporterThread:
    """Loopback exporters on an event loop of their own in a thread: a module-wide fleet outlives test loops."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._servers: list[ExporterServer] = []

    def start(self, page: str) -> ExporterServer:
        server = ExporterServer(page=page)
        asyncio.run_coroutine_threadsafe(server.start(), self._loop).result(10)
        self._servers.append(server)
        return server

    def stop(self) -> None:
        for server in self._servers:
            asyncio.run_coroutine_threadsafe(server.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def address_of(exporter: ExporterServer) -> str:
    return f"127.0.0.1:{exporter.port}"


def with_timestamps(page: str, at_ms: int) -> str:
    """The page with an explicit timestamp on every sample (as a federating or caching exporter prints)."""
    lines = [line if not line or line.startswith("#") else f"{line} {at_ms}" for line in page.splitlines()]
    return "\n".join(lines) + "\n"


@dataclass
class PrometheusProxy:
    """A loopback gateway in front of Prometheus, as managed offerings have: it checks the caller's bearer
    token and headers, adds its own basic auth upstream, and can be made slow, broken or stopped."""

    upstream: str
    bearer: str | None = None  # the token callers must present
    required_headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    answer: tuple[int, bytes] | None = None  # answer this instead of forwarding
    tls: ssl.SSLContext | None = None
    requests: int = 0
    seen_headers: list[dict[str, str]] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = field(default=None, repr=False)
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(headers={"Authorization": basic_auth()})

        async def query(request: web.Request) -> web.Response:
            self.requests += 1
            self.seen_headers.append(dict(request.headers))
            if self.bearer is not None and request.headers.get("Authorization") != f"Bearer {self.bearer}":
                return web.json_response(
                    {"status": "error", "errorType": "unauthorized", "error": "bad or missing bearer token"},
                    status=401,
                )
            for name, value in self.required_headers.items():
                if request.headers.get(name) != value:
                    return web.json_response(
                        {"status": "error", "errorType": "forbidden", "error": f"missing header {name}"},
                        status=403,
                    )
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.answer is not None:
                status, body = self.answer
                return web.Response(status=status, body=body, content_type="application/json")
            assert self._session is not None
            form = await request.post()
            async with self._session.post(self.upstream + "/api/v1/query", data=dict(form)) as upstream:
                return web.Response(
                    status=upstream.status, body=await upstream.read(), content_type="application/json"
                )

        app = web.Application()
        app.router.add_route("*", "/api/v1/query", query)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.tls).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
