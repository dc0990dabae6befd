"""Shared fixtures: real loopback exporters and a real scaler (gRPC + HTTP) built by the tests."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import hypothesis
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_kube import FakeKube
from prometheus_support import PROMETHEUS_BIN, PrometheusServer
from support import ExporterServer

from keda_gpu_scaler.app import App
from keda_gpu_scaler.config.settings import Settings
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc

# A few hundred fuzzing examples per property in CI; `make soak` runs the `soak` profile (10,000 each).
hypothesis.settings.register_profile("ci", max_examples=200)
hypothesis.settings.register_profile("soak", max_examples=10_000)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

FAST = Settings(
    grpc_address="127.0.0.1:0",
    http_address="127.0.0.1:0",
    kubernetes="off",
    scrape_interval=0.2,
    gateway_interval=0.2,
    max_staleness=0.6,
    scrape_timeout=0.5,
    shutdown_grace=2.0,
    explain=True,
)


@dataclasses.dataclass
class RunningScaler:
    app: App
    channel: grpc.aio.Channel
    stub: pb_grpc.ExternalScalerStub

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.app.grpc_port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.app.http_port}"


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    """A loopback API server speaking the Kubernetes API's JSON (tests/fake_kube.py)."""
    server = FakeKube()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def make_exporter() -> AsyncIterator[Callable[..., Awaitable[ExporterServer]]]:
    started: list[ExporterServer] = []

    async def make(page: str = "") -> ExporterServer:
        server = ExporterServer(page=page)
        await server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        await server.stop()


@pytest.fixture
async def make_scaler() -> AsyncIterator[Callable[..., Awaitable[RunningScaler]]]:
    running: list[RunningScaler] = []

    async def make(
        *exporters: ExporterServer, clock: Callable[[], float] = time.monotonic, **overrides: Any
    ) -> RunningScaler:
        settings = dataclasses.replace(FAST, exporter_urls=tuple(e.url for e in exporters), **overrides)
        app = App(settings, clock)
        await app.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
        scaler = RunningScaler(app, channel, pb_grpc.ExternalScalerStub(channel))
        running.append(scaler)
        return scaler

    yield make
    for scaler in running:
        await scaler.channel.close()
        await scaler.app.stop()


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """One real Prometheus for the whole session, shared by every test file that reads one: starting it
    takes seconds. Each file keeps to target groups of its own (PrometheusServer.set_targets' `group`) and
    removes them when done. Under pytest-xdist (`-n auto --dist loadfile`) a session is one worker's: each
    worker that runs a Prometheus test starts one Prometheus, once."""
    if PROMETHEUS_BIN is None:
        pytest.skip(
            "no `prometheus` binary (Debian package prometheus; `make test` installs it where it can)"
        )
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"))
    server.start()
    yield server
    server.stop()
