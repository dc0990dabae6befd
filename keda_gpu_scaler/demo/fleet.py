"""Simulated GPU fleet on loopback: NVIDIA and AMD exporter pages and LLM inference servers' pages whose
load moves, and a load control."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from keda_gpu_scaler.demo.counters import ServedTotals
from keda_gpu_scaler.demo.engines import EngineLoad, load_for, sglang_page, split, vllm_page
from keda_gpu_scaler.demo.gateway import DemoGateway
from keda_gpu_scaler.demo.gpu_pages import GpuPages, Noise
from keda_gpu_scaler.demo.layout import (
    EXPOSITION_CONTENT_TYPE,
    INFERENCE_LOAD_PARAMETERS,
    LOAD_PARAMETERS,
    LOAD_USAGE,
    MAX_PINNED_REQUESTS,
    REQUESTS_IDLE_BELOW,
    DemoInferenceWorkload,
    DemoWorkload,
    InferencePod,
    Pod,
    RequestPin,
    build_inference_layout,
    build_layout,
    burst,
    inference_workloads_of,
    workloads_of,
)
from keda_gpu_scaler.demo.load_query import read_inference_load


class DemoFleet:
    """A small simulated GPU fleet: one exporter server per node and a control server to pin pod loads.

    Everything printed is a function of the clock (seconds since construction), the seed and the
    pinned loads, so tests can drive a fake clock and get the same pages every time.
    """

    NAMESPACE = "demo"

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, seed: int = 0, engine_start_s: float = 20.0
    ) -> None:
        """``engine_start_s``: seconds one vLLM pod (the last of vllm-chat) takes to load its model; its
        page has no vLLM family until then, as a real server's (0: every engine is up from the start)."""
        self._clock = clock
        self._start = clock()
        self._pins: dict[str, float] = {}
        self._noise = Noise(seed)
        self._gpus = GpuPages(self._noise, self._pins, self.NAMESPACE)
        self._request_pins: dict[str, RequestPin] = {}
        self._runners: list[web.AppRunner] = []
        self._exporter_urls: dict[str, str] = {}
        self._control_url: str | None = None
        rng = random.Random(seed)
        self._nodes, pods = build_layout(rng)
        self._pods: dict[str, Pod] = {pod.name: pod for pod in pods}
        self.workloads: tuple[DemoWorkload, ...] = workloads_of(pods, self._nodes)
        self.nodes: tuple[str, ...] = tuple(self._nodes)
        # A separate random stream, so the GPU fleet is the same with or without the inference servers.
        inference_pods = build_inference_layout(random.Random(f"{seed}/inference"), engine_start_s)
        self._inference_pods: dict[str, InferencePod] = {pod.name: pod for pod in inference_pods}
        self.inference_workloads: tuple[DemoInferenceWorkload, ...] = inference_workloads_of(inference_pods)
        # The inference gateway in front of a model server scaled to zero (SPEC §7).
        self.gateway = DemoGateway(clock)
        self._served = ServedTotals()

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", control_port: int = 0) -> None:
        """Start one exporter per node on an ephemeral port and the control server on ``control_port``."""
        if self._runners:
            raise RuntimeError("the demo fleet is already started")
        try:
            for node in self._nodes.values():
                app = web.Application()
                app.router.add_get("/metrics", self._exporter_handler(node.name))
                self._exporter_urls[node.name] = await self._serve(app, host, 0) + "/metrics"
            control = web.Application()
            control.router.add_get("/", self._handle_state)
            control.router.add_get("/load", self._handle_load)
            # Each inference pod's own page, as if scraped from http://POD_IP:PORT/metrics.
            control.router.add_get("/pods/{pod}/metrics", self._handle_inference_page)
            # Each endpoint-picker replica's page, as if scraped from http://EPP_POD_IP:9090/metrics.
            control.router.add_get("/gateways/{pool}/{replica}/metrics", self.gateway.handle_page)
            self._control_url = await self._serve(control, host, control_port)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop every server this fleet started; safe to call twice or after a failed start."""
        runners, self._runners = self._runners, []
        self._exporter_urls = {}
        self._control_url = None
        for runner in reversed(runners):
            await runner.cleanup()

    async def _serve(self, app: web.Application, host: str, port: int) -> str:
        # No access log: the demo's terminal is for the scaler's output, not for one line per scrape.
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        return f"http://{_url_host(str(bound_host))}:{bound_port}"

    @property
    def exporter_urls(self) -> list[str]:
        """The exporters' /metrics URLs, in the order of ``nodes``."""
        if not self._exporter_urls:
            raise RuntimeError("the demo fleet is not started")
        return [self._exporter_urls[node] for node in self.nodes]

    @property
    def control_url(self) -> str:
        """Base URL of the control server (``GET /``, ``GET /load?pod=NAME&...``, the inference pages)."""
        if self._control_url is None:
            raise RuntimeError("the demo fleet is not started")
        return self._control_url

    @property
    def inference_urls(self) -> list[tuple[str, str, str]]:
        """(namespace, pod, URL of its metrics page) of every inference pod: the scaler's --inference-url."""
        base = self.control_url
        return [
            (self.NAMESPACE, pod, f"{base}/pods/{pod}/metrics")
            for workload in self.inference_workloads
            for pod in workload.pods
        ]

    @property
    def gateway_urls(self) -> list[tuple[str, str, str]]:
        """(namespace, pool, URL of an EPP replica's page) of every endpoint picker: the scaler's --gateway-url."""
        base = self.control_url
        return [(self.NAMESPACE, pool, f"{base}{path}") for pool, _, path in self.gateway.page_paths()]

    # -- load ---------------------------------------------------------------------------------------

    def set_load(self, pod: str, percent: float | None) -> None:
        """Pin every GPU of ``pod`` at ``percent`` busy (0-100); ``None`` returns it to its moving pattern.

        For an inference pod only ``None`` is allowed (it releases a pin of set_requests/set_in_flight).
        """
        if pod in self._inference_pods:
            if percent is not None:
                raise ValueError(
                    f"pod {pod!r} is an inference server: pin its requests with set_requests or set_in_flight"
                )
            self._request_pins.pop(pod, None)
            return
        if pod not in self._pods:
            raise ValueError(f"unknown pod {pod!r}; the demo fleet's pods are: {', '.join(self._all_pods())}")
        if percent is None:
            self._pins.pop(pod, None)
            return
        if not (math.isfinite(percent) and 0 <= percent <= 100):
            raise ValueError(f"load for pod {pod!r} must be a percentage from 0 to 100, got {percent!r}")
        self._pins[pod] = float(percent)

    def set_requests(
        self, pod: str, running: int, waiting: int, kv_cache_percent: float | None = None
    ) -> None:
        """Pin an inference pod's requests: ``running`` in the batch and ``waiting`` in its queue, spread
        over its engines; KV-cache follows the batch unless ``kv_cache_percent`` (0-100) pins it too."""
        self._inference_pod(pod)
        _check_count(f"running requests for pod {pod!r}", running)
        _check_count(f"waiting requests for pod {pod!r}", waiting)
        if kv_cache_percent is not None and not (
            math.isfinite(kv_cache_percent) and 0 <= kv_cache_percent <= 100
        ):
            raise ValueError(
                f"KV-cache for pod {pod!r} must be a percentage from 0 to 100, got {kv_cache_percent!r}"
            )
        self._request_pins[pod] = RequestPin(running, waiting, kv_cache_percent)

    def set_in_flight(self, pod: str, requests: int, kv_cache_percent: float | None = None) -> None:
        """Pin an inference pod at ``requests`` in flight, split as its engines would: each runs up to its
        batch limit and queues the rest."""
        info = self._inference_pod(pod)
        _check_count(f"requests in flight for pod {pod!r}", requests)
        loads = [load_for(share, max_running=info.max_running) for share in split(requests, info.engines)]
        running = sum(int(load.running) for load in loads)
        self.set_requests(pod, running, requests - running, kv_cache_percent)

    def _inference_pod(self, pod: str) -> InferencePod:
        info = self._inference_pods.get(pod)
        if info is None:
            raise ValueError(
                f"unknown inference pod {pod!r}; the demo fleet's inference pods are:"
                f" {', '.join(self._inference_pods)}"
            )
        return info

    def _all_pods(self) -> list[str]:
        return [*self._pods, *self._inference_pods]

    def _elapsed(self) -> float:
        return self._clock() - self._start

    def pod_load(self, pod: str) -> float:
        """The pod's utilisation now: the mean of its GPUs, as the exporters print it."""
        if pod not in self._pods:
            raise ValueError(f"unknown pod {pod!r}; the demo fleet's pods are: {', '.join(self._pods)}")
        info = self._pods[pod]
        t = self._elapsed()
        gpus = [gpu for gpu in self._nodes[info.node].gpus if gpu.pod is info]
        return sum(round(self._gpus.utilisation(gpu, t)) for gpu in gpus) / len(gpus)

    def _in_flight(self, pod: InferencePod, t: float) -> int:
        """Requests in flight on ``pod`` at ``t``: its share of the workload's day wave and bursts."""
        traffic = pod.traffic
        wave = math.sin(2 * math.pi * t / traffic.period_s + traffic.phase)
        day = max(0.0, (wave - REQUESTS_IDLE_BELOW) / (1 - REQUESTS_IDLE_BELOW))
        demand = traffic.peak * day + traffic.burst_extra * burst(t, traffic)
        if demand <= 0:
            # Nobody is asking: exactly zero requests, on every pod.
            return 0
        # The balancer's luck: each pod's share wobbles a little around its weight.
        noise = self._noise(f"{pod.name}/requests", t, 3.0)
        return max(0, round(demand * pod.share * (1 + 0.12 * noise)))

    def inference_loads(self, pod: str) -> list[EngineLoad]:
        """What each engine of inference pod ``pod`` prints now; empty while its engine is still starting."""
        info = self._inference_pod(pod)
        t = self._elapsed()
        if t < info.starts_after_s:
            return []
        pin = self._request_pins.get(pod)
        if pin is None:
            return [
                load_for(share, max_running=info.max_running, kv_per_request=info.kv_per_request)
                for share in split(self._in_flight(info, t), info.engines)
            ]
        loads = []
        for running, waiting in zip(
            split(pin.running, info.engines), split(pin.waiting, info.engines), strict=True
        ):
            kv = (
                pin.kv_cache_percent / 100
                if pin.kv_cache_percent is not None
                else min(1.0, running * info.kv_per_request)
            )
            loads.append(EngineLoad(running, waiting, round(kv, 4)))
        return loads

    def pod_requests(self, pod: str) -> EngineLoad | None:
        """Inference pod ``pod`` now, summed over its engines: running, waiting, and KV-cache in % (the
        mean over engines); None while its engine is still starting (its page has no family yet)."""
        loads = self.inference_loads(pod)
        if not loads:
            return None
        return EngineLoad(
            sum(load.running for load in loads),
            sum(load.waiting for load in loads),
            round(100 * sum(load.kv_cache for load in loads) / len(loads), 2),
        )

    # -- pages --------------------------------------------------------------------------------------

    def render_inference_page(self, pod: str) -> str:
        """The /metrics page inference pod ``pod``'s server prints now, in that engine's format."""
        info = self._inference_pod(pod)
        loads = self.inference_loads(pod)
        totals = (
            self._served.totals(pod, self._elapsed(), lambda t: self._running_at(info, t)) if loads else []
        )
        if info.engine == "sglang":
            return sglang_page(info.model, loads, tp_size=info.tp_size, totals=totals)
        return vllm_page(info.model, loads, totals)

    def _running_at(self, info: InferencePod, t: float) -> list[float]:
        """Each engine's running requests at second t (a pin holds from when it was set)."""
        if t < info.starts_after_s:
            return [0.0] * info.engines  # the engine is still loading its model: nothing runs
        pin = self._request_pins.get(info.name)
        if pin is not None:
            return split(pin.running, info.engines)
        loads = split(self._in_flight(info, t), info.engines)
        return [min(share, info.max_running) for share in loads]

    def render_page(self, node: str) -> str:
        """The /metrics page ``node``'s exporter prints now, in that vendor's exporter format."""
        if node not in self._nodes:
            raise ValueError(f"unknown node {node!r}; the demo fleet's nodes are: {', '.join(self._nodes)}")
        return self._gpus.render(self._nodes[node], self._elapsed())

    # -- HTTP ---------------------------------------------------------------------------------------

    def _exporter_handler(self, node: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            return web.Response(
                body=self.render_page(node).encode(), headers={"Content-Type": EXPOSITION_CONTENT_TYPE}
            )

        return handle

    async def _handle_inference_page(self, request: web.Request) -> web.Response:
        pod = request.match_info["pod"]
        if pod not in self._inference_pods:
            return web.Response(
                status=404,
                text=f"no inference pod {pod!r}; the demo's are: {', '.join(self._inference_pods)}\n",
            )
        return web.Response(
            body=self.render_inference_page(pod).encode(), headers={"Content-Type": EXPOSITION_CONTENT_TYPE}
        )

    def _inference_state(self) -> list[dict[str, Any]]:
        base = self._control_url
        workloads = []
        for workload in self.inference_workloads:
            pods = []
            for name in workload.pods:
                info = self._inference_pods[name]
                now = self.pod_requests(name)
                pin = self._request_pins.get(name)
                pods.append(
                    {
                        "name": name,
                        "url": f"{base}/pods/{name}/metrics" if base else None,
                        "engines": info.engines,
                        "started": now is not None,
                        "running": None if now is None else int(now.running),
                        "waiting": None if now is None else int(now.waiting),
                        "kv_cache": None if now is None else now.kv_cache,
                        "pinned": None
                        if pin is None
                        else {
                            "running": pin.running,
                            "waiting": pin.waiting,
                            "kv_cache": pin.kv_cache_percent,
                        },
                    }
                )
            workloads.append(
                {"name": workload.name, "engine": workload.engine, "model": workload.model, "pods": pods}
            )
        return workloads

    def state(self) -> dict[str, Any]:
        """What the control server's ``GET /`` answers: workloads, pods, their loads and pins."""
        workloads = []
        for workload in self.workloads:
            pods = []
            for name in workload.pods:
                pod = self._pods[name]
                pods.append(
                    {
                        "name": name,
                        "node": pod.node,
                        "gpus": list(pod.gpus),
                        "load": self.pod_load(name),
                        "pinned": self._pins.get(name),
                    }
                )
            workloads.append(
                {
                    "name": workload.name,
                    "vendor": workload.vendor,
                    "gpus_per_pod": workload.gpus_per_pod,
                    "pods": pods,
                }
            )
        return {
            "namespace": self.NAMESPACE,
            "seconds_since_start": round(self._elapsed(), 3),
            "exporters": dict(self._exporter_urls),
            "workloads": workloads,
            "inference_workloads": self._inference_state(),
            "gateways": self.gateway.state(),
            "usage": LOAD_USAGE,
        }

    async def _handle_state(self, request: web.Request) -> web.Response:
        return web.json_response(self.state())

    async def _handle_load(self, request: web.Request) -> web.Response:
        query = request.query
        unknown = sorted(set(query) - set(LOAD_PARAMETERS))
        if unknown:
            return _bad_request(
                f"unknown query parameter {unknown[0]!r}; allowed: {', '.join(LOAD_PARAMETERS)} ({LOAD_USAGE})"
            )
        repeated = next((key for key in LOAD_PARAMETERS if len(query.getall(key, [])) > 1), None)
        if repeated is not None:
            return _bad_request(f"query parameter {repeated!r} is given more than once; give it once")
        if "pool" in query or "pending" in query:
            error = self.gateway.load(query)
            if error is not None:
                return _bad_request(error)
            return web.json_response(
                {
                    "changed": {"pool": query["pool"], "pending": self.gateway.pending(query["pool"])},
                    **self.state(),
                }
            )
        pod = query.get("pod", "")
        if pod in self._inference_pods:
            return self._load_inference_pod(pod, query)
        if pod not in self._pods:
            what = "missing query parameter 'pod'" if not pod else f"query parameter 'pod'={pod!r} is unknown"
            return _bad_request(f"{what}; allowed: one of the demo pods: {', '.join(self._all_pods())}")
        inference_only = [key for key in INFERENCE_LOAD_PARAMETERS if key in query]
        if inference_only:
            return _bad_request(
                f"query parameter {inference_only[0]!r} is for the inference pods"
                f" ({', '.join(self._inference_pods)}); GPU pod {pod!r} takes value=PERCENT or value=auto"
            )
        raw = query.get("value")
        allowed = "a number from 0 to 100 (percent busy), or 'auto' to return to the moving pattern"
        if raw is None:
            return _bad_request(f"missing query parameter 'value'; allowed: {allowed}")
        percent: float | None = None
        if raw.strip().lower() != "auto":
            try:
                percent = float(raw)
            except ValueError:
                return _bad_request(f"query parameter 'value'={raw!r} is not a number; allowed: {allowed}")
            if not (math.isfinite(percent) and 0 <= percent <= 100):
                return _bad_request(f"query parameter 'value'={raw!r} is out of range; allowed: {allowed}")
        self.set_load(pod, percent)
        return web.json_response({"changed": {"pod": pod, "pinned": percent}, **self.state()})

    def _load_inference_pod(self, pod: str, query: Any) -> web.Response:
        """`/load` for an inference pod: running= and/or waiting=, or value=N (in flight), or value=auto."""
        load = read_inference_load(pod, query)
        if isinstance(load, str):
            return _bad_request(load)
        if load.release:
            self.set_load(pod, None)
            return web.json_response({"changed": {"pod": pod, "pinned": None}, **self.state()})
        counts, kv_percent = load.counts or {}, load.kv_cache_percent
        if "value" in counts:
            self.set_in_flight(pod, counts["value"], kv_percent)
        else:
            self.set_requests(pod, counts.get("running", 0), counts.get("waiting", 0), kv_percent)
        pin = self._request_pins[pod]
        changed = {"running": pin.running, "waiting": pin.waiting, "kv_cache": pin.kv_cache_percent}
        return web.json_response({"changed": {"pod": pod, "pinned": changed}, **self.state()})


def _check_count(what: str, count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_PINNED_REQUESTS:
        raise ValueError(f"{what} must be a whole number from 0 to {MAX_PINNED_REQUESTS}, got {count!r}")


def _bad_request(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)


def _url_host(address: str) -> str:
    # A wildcard bind is reachable on loopback; IPv6 literals need brackets in a URL.
    if address in ("0.0.0.0", ""):
        return "127.0.0.1"
    if address == "::":
        return "[::1]"
    return f"[{address}]" if ":" in address else address
