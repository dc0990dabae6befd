"""Loopback exporter fleet in its own process: many ports each serving an 8-GPU dcgm-exporter page."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys

from aiohttp import web

from bench.pages import dcgm_page

_POD = re.compile(r'pod="([^"]+)"')
_UTIL = "DCGM_FI_DEV_GPU_UTIL{"
_HEADERS = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}


def _moved(line: str) -> str:
    if not line or line.startswith("#"):
        return line
    name_labels, _, value = line.rpartition(" ")
    return f"{name_labels} {float(value) + 1:g}"


class Exporter:
    """One node's page. Its GPU_UTIL lines can be set to one value (the freshness benchmark's change)."""

    def __init__(self, index: int, gpus: int, namespace: str | None) -> None:
        page = dcgm_page(gpus=gpus).replace('Hostname="gpu-node-a"', f'Hostname="gpu-node-{index}"')
        # Every node runs its own pods: without distinct names 1,000 pages would describe the same 3 pods.
        page = _POD.sub(lambda m: f'pod="{m.group(1)}-n{index}"', page)
        if namespace is not None:
            page = re.sub(r'namespace="[^"]+"', f'namespace="{namespace}"', page)
        self.lines = page.split("\n")
        self.util_lines = [i for i, line in enumerate(self.lines) if line.startswith(_UTIL)]
        self.body = page.encode()
        # A second version of the page (one GPU's utilisation moved by one point), for --refresh.
        other = list(self.lines)
        first = self.util_lines[0]
        name_labels, _, value = other[first].rpartition(" ")
        other[first] = f"{name_labels} {(float(value) + 1) % 100:g}"
        self.versions = (self.body, "\n".join(other).encode())
        # And one where every sample's value moved (--every-value): nothing on it was printed before.
        moved = [_moved(line) for line in self.lines]
        self.every_value_versions = (self.body, "\n".join(moved).encode())
        self.requests = 0

    def set_util(self, value: float) -> None:
        for i in self.util_lines:
            self.lines[i] = f"{self.lines[i].rpartition(' ')[0]} {value:g}"
        self.body = "\n".join(self.lines).encode()

    def page(self, refresh: float | None, now: float, every_value: bool = False) -> bytes:
        """The page to answer: fixed (refresh None), new on every request (0), or new every `refresh` s;
        new: one value moved, or every value with every_value."""
        versions = self.every_value_versions if every_value else self.versions
        if refresh is None:
            return self.body
        if refresh == 0:
            return versions[self.requests % 2]
        return versions[int(now // refresh) % 2]


async def serve(
    count: int, gpus: int, namespace_per_port: bool, refresh: float | None, every_value: bool = False
) -> None:
    exporters: dict[int, Exporter] = {}
    loop = asyncio.get_running_loop()

    async def metrics(request: web.Request) -> web.Response:
        exporter = exporters[request.transport.get_extra_info("sockname")[1]]  # type: ignore[union-attr]
        exporter.requests += 1
        return web.Response(body=exporter.page(refresh, loop.time(), every_value), headers=_HEADERS)

    async def set_value(request: web.Request) -> web.Response:
        exporters[int(request.query["port"])].set_util(float(request.query["value"]))
        return web.Response(text="ok")

    async def stats(_: web.Request) -> web.Response:
        return web.json_response({"requests": sum(e.requests for e in exporters.values())})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sites = []
    for _ in range(count):
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        sites.append(site)
    ports = [address[1] for address in runner.addresses]
    for index, port in enumerate(ports):
        exporters[port] = Exporter(index, gpus, f"lane{index}" if namespace_per_port else None)

    control = web.Application()
    control.router.add_post("/set", set_value)
    control.router.add_get("/stats", stats)
    control_runner = web.AppRunner(control, access_log=None)
    await control_runner.setup()
    control_site = web.TCPSite(control_runner, "127.0.0.1", 0)
    await control_site.start()
    control_port = control_runner.addresses[0][1]

    print(json.dumps({"ports": ports, "control": control_port}), flush=True)
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await control_runner.cleanup()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=1, help="number of exporters (one port each)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--namespace-per-port", action="store_true", help="pods of port i in namespace lane<i>"
    )
    parser.add_argument(
        "--refresh",
        type=float,
        default=None,
        help="seconds between page changes (0: a different page on every request; default: never)",
    )
    parser.add_argument(
        "--every-value",
        action="store_true",
        help="a change moves every value (default: one GPU's utilisation)",
    )
    args = parser.parse_args()
    asyncio.run(serve(args.count, args.gpus, args.namespace_per_port, args.refresh, args.every_value))
    sys.exit(0)


if __name__ == "__main__":
    main()
