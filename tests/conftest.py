"""Shared fixtures: real loopback exporters and a real scaler (gRPC + HTTP) built by the tests."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import hypothesis
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from support import ExporterServer

from keda_gpu_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from keda_gpu_scaler.app import App
from keda_gpu_scaler.settings import Settings

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

    async def make(*exporters: ExporterServer, **overrides: Any) -> RunningScaler:
        settings = dataclasses.replace(FAST, exporter_urls=tuple(e.url for e in exporters), **overrides)
        app = App(settings)
        await app.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
        scaler = RunningScaler(app, channel, pb_grpc.ExternalScalerStub(channel))
        running.append(scaler)
        return scaler

    yield make
    for scaler in running:
        await scaler.channel.close()
        await scaler.app.stop()
