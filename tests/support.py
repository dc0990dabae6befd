"""Test support: loopback exporter servers, small exporter pages, and polling with a deadline."""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from aiohttp import web

from keda_gpu_scaler.demo.engines import EngineLoad
from keda_gpu_scaler.pages import pagetext
from keda_gpu_scaler.pages.engines.formats import TGI

T = TypeVar("T")


@dataclass
class GpuLine:
    namespace: str
    pod: str
    util: float
    gpu: int = 0
    fb_used: int = 40000
    fb_free: int = 41000


def dcgm_page(gpus: list[GpuLine], host: str = "gpu-node-a") -> str:
    """A dcgm-exporter page (GPU_UTIL, FB_USED, FB_FREE) in the exporter's own format."""

    def labels(g: GpuLine) -> str:
        device = [
            ("gpu", str(g.gpu)),
            ("UUID", f"GPU-{host}-{g.gpu}"),
            ("pci_bus_id", f"00000000:{g.gpu:02d}:00.0"),
            ("device", f"nvidia{g.gpu}"),
            ("modelName", "NVIDIA H100 80GB HBM3"),
            ("Hostname", host),
            ("DCGM_FI_DRIVER_VERSION", "550.144.03"),
        ]
        pod = [("container", "main"), ("namespace", g.namespace), ("pod", g.pod)] if g.pod else []
        return pagetext.label_text(device + pod)

    families: list[tuple[str, str, Callable[[GpuLine], float]]] = [
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.util),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: g.fb_used),
        ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda g: g.fb_free),
    ]
    return pagetext.render(
        (name, "gauge", help_text, [(labels(g), pagetext.go_float(value(g))) for g in gpus])
        for name, help_text, value in families
    )


@dataclass
class ExporterServer:
    """A real aiohttp exporter on 127.0.0.1 whose page, status and delay tests change at will."""

    page: str = ""
    status: int = 200
    delay: float = 0.0
    requests: int = 0
    _runner: web.AppRunner | None = field(default=None, repr=False)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    async def start(self) -> None:
        async def metrics(_: web.Request) -> web.Response:
            self.requests += 1
            if self.delay:
                await asyncio.sleep(self.delay)
            return web.Response(text=self.page, status=self.status, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def eventually(
    check: Callable[[], Awaitable[T]], *, timeout: float = 10.0, interval: float = 0.02
) -> T:
    """Poll `check` until it returns without an assertion or RPC error, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await check()
        except (AssertionError, grpc.RpcError):
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(interval)


def tgi_page(load: EngineLoad | tuple[float, float, float]) -> str:
    """A TGI router's gauges (unlabelled, integers as its Rust exporter prints them); no KV-cache %."""
    state = EngineLoad(*load)
    lines = [
        "# HELP tgi_queue_size Current queue size",
        "# TYPE tgi_queue_size gauge",
        f"{TGI.waiting.name} {int(state.waiting)}",
        "# HELP tgi_batch_current_size Current batch size",
        "# TYPE tgi_batch_current_size gauge",
        f"{TGI.running.name} {int(state.running)}",
        "# HELP tgi_batch_current_max_tokens Maximum tokens for the current batch",
        "# TYPE tgi_batch_current_max_tokens gauge",
        f"tgi_batch_current_max_tokens {int(state.running) * 1024}",
    ]
    return "\n".join(lines) + "\n"


def latest_trigger(explained: dict[str, Any]) -> dict[str, Any]:
    """Of /explain's answer for a whole ScaledObject, the trigger evaluated last (the one just called);
    an error answer (no "triggers") as it is."""
    if "triggers" not in explained:
        return explained
    latest: dict[str, Any] = max(explained["triggers"], key=lambda entry: entry["evaluatedAt"])
    return latest


def kustomize_command(directory: Path) -> list[str] | None:
    """How to build a kustomization here: a kustomize on PATH or in the virtualenv (make test builds one
    there when the machine has neither it nor kubectl), else kubectl's built-in one; None: neither."""
    beside = Path(sys.executable).with_name("kustomize")
    standalone = shutil.which("kustomize") or (str(beside) if beside.exists() else None)
    if standalone:
        return [standalone, "build", str(directory)]
    kubectl = shutil.which("kubectl")
    return [kubectl, "kustomize", str(directory)] if kubectl else None
