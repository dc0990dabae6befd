"""Simulated GPU fleet on loopback: NVIDIA and AMD exporter pages and LLM inference servers' pages whose
load moves, and a load control."""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from keda_gpu_scaler import pagetext
from keda_gpu_scaler.demo_gateway import DemoGateway
from keda_gpu_scaler.engines.simulated import EngineLoad, load_for, sglang_page, split, vllm_page

# What the real exporters answer with; scrapers look at the media type, not only at the body.
_EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_H100_MODEL = "NVIDIA H100 80GB HBM3"
_NVIDIA_DRIVER = "550.144.03"
# nvidia-smi's "Total" for an H100 80GB HBM3; used + free + reserved add up to it.
_H100_TOTAL_MIB = 81559
_H100_RESERVED_MIB = 480
# PCI addresses of the GPUs on an HGX H100 baseboard, in nvidia-smi order.
_HGX_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")

_MI300X_CARD_MODEL = "102-G30211-0C"
_MI300X_TOTAL_MB = 196592
# VRAM the driver and firmware hold on an MI300X with nothing running.
_MI300X_IDLE_USED_MB = 283

# Characters Kubernetes uses for generated name suffixes (no vowels, no look-alikes).
_K8S_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

# A serving pod is idle (exactly 0 %) while its traffic wave is below this level: with
# -0.2 a bit less than half of each period is idle, so activity flips every minute or so.
_SERVING_IDLE_BELOW = -0.2

# Inference pods: a workload's requests are zero (night, nobody asking) while its daily wave is below this.
_REQUESTS_IDLE_BELOW = -0.25
# The largest running/waiting count the load control accepts for one pod.
_MAX_PINNED_REQUESTS = 10_000

# What /load takes, and what the control server's / says about it.
_INFERENCE_LOAD_PARAMETERS = ("running", "waiting", "kv_cache")
_GATEWAY_LOAD_PARAMETERS = ("pool", "pending")
_LOAD_PARAMETERS = ("pod", "value", *_INFERENCE_LOAD_PARAMETERS, *_GATEWAY_LOAD_PARAMETERS)
_LOAD_USAGE = (
    "GPU pods: GET /load?pod=NAME&value=PERCENT pins a pod's GPU utilisation (0-100). Inference pods:"
    " GET /load?pod=NAME&running=N&waiting=N pins its requests running and waiting (the one left out is 0),"
    " value=N pins N requests in flight (split as the server would), kv_cache=PERCENT pins its KV-cache"
    " too. value=auto returns a pod to the moving pattern. The gateway: GET /load?pool=NAME&pending=N"
    " queues N requests at the pool's endpoint picker (its model server is at zero replicas)"
)

# (name, TYPE, HELP) in the order of dcgm-exporter's etc/default-counters.csv.
_DCGM_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
)

# (name, HELP) as device-metrics-exporter registers them; client_golang prints families sorted by name.
_AMD_FAMILIES: tuple[tuple[str, str], ...] = (
    ("gpu_energy_consumed", "Accumulated energy consumed by the GPU in uJ"),
    ("gpu_free_vram", "Free VRAM memory of the GPU (in MB)"),
    ("gpu_gfx_activity", "Graphics engine usage in Percentage (0-100)"),
    ("gpu_junction_temperature", "Current junction/hotspot temperature in Celsius"),
    ("gpu_package_power", "Current socket power in Watts"),
    ("gpu_total_vram", "Total VRAM memory of the GPU (in MB)"),
    ("gpu_umc_activity", "Memory engine usage in Percentage (0-100)"),
    ("gpu_used_vram", "Used VRAM memory of the GPU (in MB)"),
)


@dataclass(frozen=True)
class DemoWorkload:
    """One scale target of the demo: its pods are named f"{name}-<suffix>" in namespace ``demo``."""

    name: str
    vendor: str
    gpus_per_pod: int
    pods: tuple[str, ...]


@dataclass(frozen=True)
class DemoInferenceWorkload:
    """One scale target served by an LLM inference server; each pod's page is at the fleet's own URL.

    ``engines_per_pod`` gives, pod by pod, the data-parallel engines (vLLM ``engine``, SGLang ``dp_rank``).
    """

    name: str
    engine: str
    model: str
    pods: tuple[str, ...]
    engines_per_pod: tuple[int, ...]


@dataclass(frozen=True)
class _Traffic:
    """A workload's requests in flight over time: a compressed day plus bursts, summed over its pods."""

    period_s: float
    phase: float
    # Requests in flight over all pods at the top of the day, and what a burst adds on top.
    peak: float
    burst_extra: float
    burst_every_s: float
    burst_first_s: float


@dataclass(frozen=True)
class _InferencePod:
    name: str
    workload: str
    engine: str  # "vllm" or "sglang": which page it prints
    model: str
    engines: int  # data-parallel engines
    tp_size: int  # SGLang: tensor-parallel ranks repeating each engine's values
    share: float  # the pod's share of the workload's requests (a DP pod takes more)
    max_running: int  # per engine: vLLM --max-num-seqs, SGLang --max-running-requests
    kv_per_request: float  # KV-cache fraction one running request holds
    starts_after_s: float  # vLLM prints its families only once its engine is up (weights loaded)
    traffic: _Traffic


@dataclass(frozen=True)
class _RequestPin:
    running: int
    waiting: int
    kv_cache_percent: float | None


@dataclass(frozen=True)
class _Pod:
    name: str
    workload: str
    container: str
    node: str
    gpus: tuple[int, ...]
    training: bool
    period_s: float
    # Serving: phase of the traffic wave in radians. Training: seconds into the checkpoint cycle at t=0.
    phase: float
    peak: float


@dataclass(frozen=True)
class _Gpu:
    index: int
    # NVIDIA: the GPU UUID; AMD: the board serial number. Both identify the device on the page.
    identity: str
    pci_bus_id: str
    pod: _Pod | None
    # Position of this GPU among its pod's GPUs, so the GPUs of one pod get their own noise.
    slot: int
    # Energy counter at t=0 (J) and the mean draw used to advance it, so it only ever grows.
    energy_at_start_j: float
    mean_power_w: float


@dataclass(frozen=True)
class _Node:
    name: str
    vendor: str
    gpus: tuple[_Gpu, ...]


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
        self._seed = seed
        self._pins: dict[str, float] = {}
        self._request_pins: dict[str, _RequestPin] = {}
        self._runners: list[web.AppRunner] = []
        self._exporter_urls: dict[str, str] = {}
        self._control_url: str | None = None
        rng = random.Random(seed)
        self._nodes, pods = _build_layout(rng)
        self._pods: dict[str, _Pod] = {pod.name: pod for pod in pods}
        self.workloads: tuple[DemoWorkload, ...] = _workloads_of(pods, self._nodes)
        self.nodes: tuple[str, ...] = tuple(self._nodes)
        # A separate random stream, so the GPU fleet is the same with or without the inference servers.
        inference_pods = _build_inference_layout(random.Random(f"{seed}/inference"), engine_start_s)
        self._inference_pods: dict[str, _InferencePod] = {pod.name: pod for pod in inference_pods}
        self.inference_workloads: tuple[DemoInferenceWorkload, ...] = _inference_workloads_of(inference_pods)
        # The inference gateway in front of a model server scaled to zero (SPEC §7).
        self.gateway = DemoGateway(clock)

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
        self._request_pins[pod] = _RequestPin(running, waiting, kv_cache_percent)

    def set_in_flight(self, pod: str, requests: int, kv_cache_percent: float | None = None) -> None:
        """Pin an inference pod at ``requests`` in flight, split as its engines would: each runs up to its
        batch limit and queues the rest."""
        info = self._inference_pod(pod)
        _check_count(f"requests in flight for pod {pod!r}", requests)
        loads = [load_for(share, max_running=info.max_running) for share in split(requests, info.engines)]
        running = sum(int(load.running) for load in loads)
        self.set_requests(pod, running, requests - running, kv_cache_percent)

    def _inference_pod(self, pod: str) -> _InferencePod:
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

    def _noise(self, key: str, t: float, step_s: float) -> float:
        """Smooth pseudo-random value in [-1, 1]: seeded knots every ``step_s`` seconds, eased between."""
        position = t / step_s
        knot = math.floor(position)
        frac = position - knot
        eased = frac * frac * (3 - 2 * frac)
        before, after = self._knot(key, knot), self._knot(key, knot + 1)
        return before + (after - before) * eased

    def _knot(self, key: str, knot: int) -> float:
        # A hash instead of a shared RNG: the value at a time must not depend on what was rendered before.
        digest = hashlib.blake2b(f"{self._seed}/{key}/{knot}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / (1 << 63) - 1.0

    def _utilisation(self, gpu: _Gpu, t: float) -> float:
        pod = gpu.pod
        if pod is None:
            return 0.0
        pinned = self._pins.get(pod.name)
        if pinned is not None:
            return pinned
        noise = self._noise(f"{pod.name}/{gpu.slot}/util", t, 4.0)
        if pod.training:
            # Training runs flat out, except while a checkpoint is written: the GPUs then wait on storage.
            in_cycle = (t + pod.phase) % pod.period_s
            if in_cycle >= pod.period_s - 30.0:
                return max(0.0, 1.0 + noise)
            return min(100.0, pod.peak + 4.0 * noise)
        wave = math.sin(2 * math.pi * t / pod.period_s + pod.phase)
        demand = (wave - _SERVING_IDLE_BELOW) / (1 - _SERVING_IDLE_BELOW)
        if demand <= 0:
            # An inference server with no request runs no kernel at all: exactly 0 %.
            return 0.0
        # GPU_UTIL is a duty cycle, so a trickle of requests already reads high: hence the power < 1.
        return min(100.0, max(0.0, pod.peak * math.pow(demand, 0.6) + 6.0 * noise))

    def _memory_used_fraction(self, gpu: _Gpu, t: float) -> float:
        pod = gpu.pod
        if pod is None:
            return 0.0
        noise = self._noise(f"{pod.name}/{gpu.slot}/memory", t, 7.0)
        if pod.training:
            # Activations and optimizer state come and go with the step; the weights stay.
            swing = 0.5 + 0.5 * math.sin(2 * math.pi * t / 75.0 + gpu.slot)
            return 0.72 + 0.16 * swing + 0.01 * noise
        # vLLM reserves --gpu-memory-utilization (0.9) of the GPU at start, whatever the traffic.
        return 0.9 + 0.0003 * noise

    def pod_load(self, pod: str) -> float:
        """The pod's utilisation now: the mean of its GPUs, as the exporters print it."""
        if pod not in self._pods:
            raise ValueError(f"unknown pod {pod!r}; the demo fleet's pods are: {', '.join(self._pods)}")
        info = self._pods[pod]
        t = self._elapsed()
        gpus = [gpu for gpu in self._nodes[info.node].gpus if gpu.pod is info]
        return sum(round(self._utilisation(gpu, t)) for gpu in gpus) / len(gpus)

    def _in_flight(self, pod: _InferencePod, t: float) -> int:
        """Requests in flight on ``pod`` at ``t``: its share of the workload's day wave and bursts."""
        traffic = pod.traffic
        wave = math.sin(2 * math.pi * t / traffic.period_s + traffic.phase)
        day = max(0.0, (wave - _REQUESTS_IDLE_BELOW) / (1 - _REQUESTS_IDLE_BELOW))
        demand = traffic.peak * day + traffic.burst_extra * _burst(t, traffic)
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
        if info.engine == "sglang":
            return sglang_page(info.model, loads, tp_size=info.tp_size)
        return vllm_page(info.model, loads)

    def render_page(self, node: str) -> str:
        """The /metrics page ``node``'s exporter prints now, in that vendor's exporter format."""
        if node not in self._nodes:
            raise ValueError(f"unknown node {node!r}; the demo fleet's nodes are: {', '.join(self._nodes)}")
        spec = self._nodes[node]
        t = self._elapsed()
        if spec.vendor == "nvidia":
            return self._render_dcgm(spec, t)
        return self._render_amd(spec, t)

    def _power_w(self, gpu: _Gpu, t: float, util: float, idle_w: float, per_percent_w: float) -> float:
        return idle_w + per_percent_w * util + 6.0 * self._noise(f"{gpu.identity}/power", t, 3.0)

    def _render_dcgm(self, node: _Node, t: float) -> str:
        rows: list[tuple[str, dict[str, str]]] = []
        for gpu in node.gpus:
            util = self._utilisation(gpu, t)
            training = gpu.pod is not None and gpu.pod.training
            used = round(self._memory_used_fraction(gpu, t) * (_H100_TOTAL_MIB - _H100_RESERVED_MIB))
            # GPU_UTIL counts any kernel running; the engine is busy a little less of the time than that.
            gr_active = min(1.0, util / 100 * (0.93 + 0.03 * self._noise(f"{gpu.identity}/gr", t, 5.0)))
            # Decode is memory-bound: serving keeps the copy engines and DRAM busier than the tensor cores.
            tensor_share, dram_share, copy_share = (0.55, 0.4, 0.35) if training else (0.25, 0.6, 0.55)
            energy_j = gpu.energy_at_start_j + gpu.mean_power_w * t
            values = {
                "DCGM_FI_DEV_SM_CLOCK": str(1980 if util > 0 else 345),
                "DCGM_FI_DEV_MEM_CLOCK": "2619",
                "DCGM_FI_DEV_MEMORY_TEMP": str(round(34 + 0.3 * util)),
                "DCGM_FI_DEV_GPU_TEMP": str(round(31 + 0.38 * util + self._noise(gpu.identity, t, 9.0))),
                "DCGM_FI_DEV_POWER_USAGE": f"{self._power_w(gpu, t, util, 72.0, 6.2):.6f}",
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": str(int(energy_j * 1000)),
                "DCGM_FI_DEV_GPU_UTIL": str(round(util)),
                "DCGM_FI_DEV_MEM_COPY_UTIL": str(round(util * copy_share)),
                "DCGM_FI_DEV_XID_ERRORS": "0",
                "DCGM_FI_DEV_FB_FREE": str(_H100_TOTAL_MIB - _H100_RESERVED_MIB - used),
                "DCGM_FI_DEV_FB_USED": str(used),
                "DCGM_FI_DEV_FB_RESERVED": str(_H100_RESERVED_MIB),
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": f"{gr_active:.6f}",
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": f"{gr_active * tensor_share:.6f}",
                "DCGM_FI_PROF_DRAM_ACTIVE": f"{gr_active * dram_share:.6f}",
            }
            rows.append((pagetext.label_text(_dcgm_labels(node.name, gpu, self.NAMESPACE)), values))
        return pagetext.render(
            (name, kind, help_text, [(labels, values[name]) for labels, values in rows])
            for name, kind, help_text in _DCGM_FAMILIES
        )

    def _render_amd(self, node: _Node, t: float) -> str:
        rows: list[tuple[tuple[str, ...], str, dict[str, float]]] = []
        for gpu in node.gpus:
            util = self._utilisation(gpu, t)
            fraction = self._memory_used_fraction(gpu, t)
            used = round(fraction * _MI300X_TOTAL_MB) if gpu.pod is not None else _MI300X_IDLE_USED_MB
            values = {
                "gpu_energy_consumed": float(int((gpu.energy_at_start_j + gpu.mean_power_w * t) * 1e6)),
                "gpu_free_vram": float(_MI300X_TOTAL_MB - used),
                "gpu_gfx_activity": float(round(util)),
                "gpu_junction_temperature": float(
                    round(41 + 0.45 * util + self._noise(gpu.identity, t, 9.0))
                ),
                "gpu_package_power": float(round(self._power_w(gpu, t, util, 142.0, 5.9))),
                "gpu_total_vram": float(_MI300X_TOTAL_MB),
                "gpu_umc_activity": float(round(util * 0.5)),
                "gpu_used_vram": float(used),
            }
            labels = sorted(_amd_labels(node.name, gpu, self.NAMESPACE).items())
            rows.append((tuple(value for _, value in labels), pagetext.label_text(labels), values))
        # client_golang orders the series of a family by their label values: idle GPUs (container="") first.
        rows.sort(key=lambda row: row[0])
        return pagetext.render(
            (
                name,
                "gauge",
                help_text,
                [(labels, pagetext.go_float(values[name])) for _, labels, values in rows],
            )
            for name, help_text in _AMD_FAMILIES
        )

    # -- HTTP ---------------------------------------------------------------------------------------

    def _exporter_handler(self, node: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            return web.Response(
                body=self.render_page(node).encode(), headers={"Content-Type": _EXPOSITION_CONTENT_TYPE}
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
            body=self.render_inference_page(pod).encode(), headers={"Content-Type": _EXPOSITION_CONTENT_TYPE}
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
            "usage": _LOAD_USAGE,
        }

    async def _handle_state(self, request: web.Request) -> web.Response:
        return web.json_response(self.state())

    async def _handle_load(self, request: web.Request) -> web.Response:
        query = request.query
        unknown = sorted(set(query) - set(_LOAD_PARAMETERS))
        if unknown:
            return _bad_request(
                f"unknown query parameter {unknown[0]!r}; allowed: {', '.join(_LOAD_PARAMETERS)} ({_LOAD_USAGE})"
            )
        repeated = next((key for key in _LOAD_PARAMETERS if len(query.getall(key, [])) > 1), None)
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
        inference_only = [key for key in _INFERENCE_LOAD_PARAMETERS if key in query]
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
        raw_value = query.get("value")
        given = [key for key in _INFERENCE_LOAD_PARAMETERS if key in query]
        allowed = (
            f"running=N and/or waiting=N (whole numbers from 0 to {_MAX_PINNED_REQUESTS}; the other one is 0),"
            " or value=N (N requests in flight, split as the server would), optionally kv_cache=PERCENT;"
            " or value=auto alone to return to the moving pattern"
        )
        if raw_value is not None and raw_value.strip().lower() == "auto":
            if given:
                return _bad_request(
                    f"query parameter 'value'='auto' releases pod {pod!r} and takes no {given[0]!r}; allowed: {allowed}"
                )
            self.set_load(pod, None)
            return web.json_response({"changed": {"pod": pod, "pinned": None}, **self.state()})
        counts: dict[str, int] = {}
        for key in ("value", "running", "waiting"):
            raw = query.get(key)
            if raw is None:
                continue
            try:
                count = int(raw.strip())
            except ValueError:
                return _bad_request(
                    f"query parameter {key!r}={raw!r} is not a whole number of requests; allowed: {allowed}"
                )
            if not 0 <= count <= _MAX_PINNED_REQUESTS:
                return _bad_request(f"query parameter {key!r}={raw!r} is out of range; allowed: {allowed}")
            counts[key] = count
        if "value" in counts and ("running" in counts or "waiting" in counts):
            other = "running" if "running" in counts else "waiting"
            return _bad_request(
                f"query parameters 'value' and {other!r} both set the requests of pod {pod!r}; give one;"
                f" allowed: {allowed}"
            )
        if not counts:
            what = (
                "only 'kv_cache' given"
                if "kv_cache" in query
                else "missing query parameter 'running' or 'waiting'"
            )
            return _bad_request(f"{what} for inference pod {pod!r}; allowed: {allowed}")
        kv_percent: float | None = None
        raw_kv = query.get("kv_cache")
        if raw_kv is not None:
            try:
                kv_percent = float(raw_kv)
            except ValueError:
                return _bad_request(
                    f"query parameter 'kv_cache'={raw_kv!r} is not a number; allowed: a percentage from 0 to 100"
                )
            if not (math.isfinite(kv_percent) and 0 <= kv_percent <= 100):
                return _bad_request(
                    f"query parameter 'kv_cache'={raw_kv!r} is out of range; allowed: a percentage from 0 to 100"
                )
        if "value" in counts:
            self.set_in_flight(pod, counts["value"], kv_percent)
        else:
            self.set_requests(pod, counts.get("running", 0), counts.get("waiting", 0), kv_percent)
        pin = self._request_pins[pod]
        changed = {"running": pin.running, "waiting": pin.waiting, "kv_cache": pin.kv_cache_percent}
        return web.json_response({"changed": {"pod": pod, "pinned": changed}, **self.state()})


def _check_count(what: str, count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= _MAX_PINNED_REQUESTS:
        raise ValueError(f"{what} must be a whole number from 0 to {_MAX_PINNED_REQUESTS}, got {count!r}")


def _bad_request(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)


def _url_host(address: str) -> str:
    # A wildcard bind is reachable on loopback; IPv6 literals need brackets in a URL.
    if address in ("0.0.0.0", ""):
        return "127.0.0.1"
    if address == "::":
        return "[::1]"
    return f"[{address}]" if ":" in address else address


def _dcgm_labels(node: str, gpu: _Gpu, namespace: str) -> list[tuple[str, str]]:
    labels = [
        ("gpu", str(gpu.index)),
        ("UUID", gpu.identity),
        ("pci_bus_id", gpu.pci_bus_id),
        ("device", f"nvidia{gpu.index}"),
        ("modelName", _H100_MODEL),
        ("Hostname", node),
        ("DCGM_FI_DRIVER_VERSION", _NVIDIA_DRIVER),
    ]
    # dcgm-exporter leaves the pod labels out entirely on a GPU no pod holds.
    if gpu.pod is not None:
        labels += [("container", gpu.pod.container), ("namespace", namespace), ("pod", gpu.pod.name)]
    return labels


def _amd_labels(node: str, gpu: _Gpu, namespace: str) -> dict[str, str]:
    pod = gpu.pod
    # The mandatory labels are always printed, empty when no pod holds the GPU.
    return {
        "card_model": _MI300X_CARD_MODEL,
        "container": pod.container if pod else "",
        "deployment_mode": "baremetal",
        "gpu_compute_partition_type": "spx",
        "gpu_id": str(gpu.index),
        "gpu_memory_partition_type": "nps1",
        "gpu_partition_id": "0",
        "hostname": node,
        "job_id": "",
        "job_partition": "",
        "job_user": "",
        "namespace": namespace if pod else "",
        "pod": pod.name if pod else "",
        "serial_number": gpu.identity,
    }


def _k8s_suffix(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(_K8S_NAME_ALPHABET) for _ in range(length))


def _nvidia_uuid(rng: random.Random) -> str:
    hex_digits = f"{rng.getrandbits(128):032x}"
    return "GPU-" + "-".join(
        (hex_digits[:8], hex_digits[8:12], hex_digits[12:16], hex_digits[16:20], hex_digits[20:])
    )


def _build_layout(rng: random.Random) -> tuple[dict[str, _Node], list[_Pod]]:
    """The fleet: two H100 nodes (vllm-qwen across both, trainer on b, one idle GPU on a), one MI300X node."""
    pods: list[_Pod] = []

    def serving(workload: str, pod: str, node: str, gpu: int, period_s: float, phase: float) -> None:
        # Replicas behind one Service see the same traffic, give or take load-balancing luck.
        jitter = rng.uniform(-0.25, 0.25)
        pods.append(
            _Pod(
                name=pod,
                workload=workload,
                container="vllm",
                node=node,
                gpus=(gpu,),
                training=False,
                period_s=period_s,
                phase=phase + jitter,
                peak=rng.uniform(85.0, 97.0),
            )
        )

    # vllm-qwen, a Deployment: busy and rising at start, idle about a minute of every 2.5 minutes.
    template_hash = _k8s_suffix(rng, 10)
    for node, gpu in (("gpu-node-a", 0), ("gpu-node-b", 0), ("gpu-node-b", 1)):
        pod = f"vllm-qwen-{template_hash}-{_k8s_suffix(rng, 5)}"
        serving("vllm-qwen", pod, node, gpu, period_s=150.0, phase=0.35)
    # trainer, a StatefulSet of one 4-GPU pod: flat out, first checkpoint pause 90 s after start.
    pods.append(
        _Pod(
            name="trainer-0",
            workload="trainer",
            container="pytorch",
            node="gpu-node-b",
            gpus=(2, 3, 4, 5),
            training=True,
            period_s=240.0,
            phase=120.0,
            peak=rng.uniform(92.0, 97.0),
        )
    )
    # vllm-llama, a StatefulSet: idle at start (so a newcomer sees activation happen), busy after ~45 s.
    llama_phase = math.asin(_SERVING_IDLE_BELOW) - 2 * math.pi * 45.0 / 180.0
    for index in range(2):
        serving(
            "vllm-llama", f"vllm-llama-{index}", "mi300x-node-1", index, period_s=180.0, phase=llama_phase
        )

    nodes: dict[str, _Node] = {}
    for name, vendor, count in (
        ("gpu-node-a", "nvidia", 2),
        ("gpu-node-b", "nvidia", 6),
        ("mi300x-node-1", "amd", 8),
    ):
        gpus = []
        for index in range(count):
            owner = next((pod for pod in pods if pod.node == name and index in pod.gpus), None)
            if vendor == "nvidia":
                identity, bus = _nvidia_uuid(rng), f"00000000:{_HGX_BUS_IDS[index]}:00.0"
                mean_power_w = 450.0 if owner else 72.0
            else:
                identity, bus = str(rng.randrange(692409000000, 692410000000)), ""
                mean_power_w = 520.0 if owner else 142.0
            uptime_s = rng.uniform(3, 20) * 86400
            gpus.append(
                _Gpu(
                    index=index,
                    identity=identity,
                    pci_bus_id=bus,
                    pod=owner,
                    slot=owner.gpus.index(index) if owner else 0,
                    energy_at_start_j=uptime_s * mean_power_w,
                    mean_power_w=mean_power_w,
                )
            )
        nodes[name] = _Node(name, vendor, tuple(gpus))
    return nodes, pods


def _workloads_of(pods: list[_Pod], nodes: dict[str, _Node]) -> tuple[DemoWorkload, ...]:
    names = list(dict.fromkeys(pod.workload for pod in pods))
    result = []
    for name in names:
        members = [pod for pod in pods if pod.workload == name]
        vendor = nodes[members[0].node].vendor
        result.append(DemoWorkload(name, vendor, len(members[0].gpus), tuple(pod.name for pod in members)))
    return tuple(result)


def _burst(t: float, traffic: _Traffic) -> float:
    """0-1: a burst of traffic (a launch, a batch job) every ``burst_every_s``: up in 6 s, held, gone in 15 s."""
    if t < traffic.burst_first_s:
        return 0.0
    into = (t - traffic.burst_first_s) % traffic.burst_every_s
    if into < 6.0:
        return into / 6.0
    if into < 30.0:
        return 1.0
    if into < 45.0:
        return (45.0 - into) / 15.0
    return 0.0


def _build_inference_layout(rng: random.Random, engine_start_s: float) -> list[_InferencePod]:
    """vllm-chat: three vLLM pods, the first data-parallel with 2 engines; sglang-code: two SGLang pods."""
    pods: list[_InferencePod] = []
    # vllm-chat, a StatefulSet: busy and rising at start, a burst at ~50 s and then every 3 minutes,
    # nobody asking for about a minute of every 4 (its "night"). Total at the top of the day ~64 in
    # flight, ~160 in a burst: with 16 per pod, 4 and 10 replicas.
    chat = _Traffic(
        period_s=240.0, phase=0.35, peak=64.0, burst_extra=96.0, burst_every_s=180.0, burst_first_s=50.0
    )
    for index, (engines, share) in enumerate(((2, 0.5), (1, 0.25), (1, 0.25))):
        pods.append(
            _InferencePod(
                name=f"vllm-chat-{index}",
                workload="vllm-chat",
                engine="vllm",
                model="meta-llama/Llama-3.1-8B-Instruct",
                engines=engines,
                tp_size=1,
                share=share * rng.uniform(0.95, 1.05),
                max_running=24,
                kv_per_request=0.03,
                # The last replica is still loading its weights when the demo starts.
                starts_after_s=engine_start_s if index == 2 else 0.0,
                traffic=chat,
            )
        )
    # sglang-code, a StatefulSet of two tensor-parallel (tp 2) pods: idle at start, busy after ~30 s.
    code = _Traffic(
        period_s=200.0,
        phase=math.asin(_REQUESTS_IDLE_BELOW) - 2 * math.pi * 30.0 / 200.0,
        peak=48.0,
        burst_extra=40.0,
        burst_every_s=150.0,
        burst_first_s=110.0,
    )
    for index in range(2):
        pods.append(
            _InferencePod(
                name=f"sglang-code-{index}",
                workload="sglang-code",
                engine="sglang",
                model="Qwen/Qwen2.5-Coder-32B-Instruct",
                engines=1,
                tp_size=2,
                share=0.5 * rng.uniform(0.95, 1.05),
                max_running=32,
                kv_per_request=0.02,
                starts_after_s=0.0,
                traffic=code,
            )
        )
    return pods


def _inference_workloads_of(pods: list[_InferencePod]) -> tuple[DemoInferenceWorkload, ...]:
    result = []
    for name in dict.fromkeys(pod.workload for pod in pods):
        members = [pod for pod in pods if pod.workload == name]
        result.append(
            DemoInferenceWorkload(
                name,
                members[0].engine,
                members[0].model,
                tuple(pod.name for pod in members),
                tuple(pod.engines for pod in members),
            )
        )
    return tuple(result)
