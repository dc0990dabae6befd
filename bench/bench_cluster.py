"""Kubernetes discovery at cluster scale: thousands of pods under churn while KEDA polls every ScaledObject.

Three processes besides the scaler: the cluster (a loopback Kubernetes API server speaking the API's JSON,
tests/fake_kube.py, plus one dcgm-exporter page per node, and the pod churn), the KEDA-shaped load
generator, and this one (which also measures how long a pod that became Ready takes to show in
GetMetrics). `python -m bench.bench_cluster serve …` and `… client …` are the first two.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from aiohttp import web

from bench.harness import (
    GC_PROBE,
    READY_LINE,
    ROOT,
    Child,
    Section,
    categorise,
    median,
    percentile,
    profile,
    rss_mib,
    shares,
)
from bench.pages import dcgm_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

EXPORTER_NAMESPACE = "gpu-operator"
EXPORTER_LABELS = {"app": "bench-dcgm-exporter"}
SCALER_ADDRESS = "keda-gpu-scaler.keda:6000"
METADATA = {"scalerAddress": SCALER_ADDRESS, "threshold": "70", "activationThreshold": "5"}
SCRAPE_INTERVAL = 5.0
PROFILE_RULES = (
    ("Kubernetes discovery (keda_gpu_scaler/kubernetes: watches, pod caches, target sets)", "/kubernetes/"),
    ("evaluation and telemetry (evaluator.py, scaling.py, telemetry.py)", "Evaluator."),
    ("scrapes: fetching and parsing exporter pages", "collect/"),
    ("servicer methods (service.py)", "ExternalScalerService"),
)
PROFILE_REST = "gRPC runtime and event loop"
COOLDOWN = 15.0
PROBE_EVERY = 3
PROBE_SECONDS = 0.1
SCALER_CPU = 0
OTHERS_CPU = 1
CLUSTER_NICE = 10  # the simulated cluster's priority on the core it shares with the client (see cluster())


@dataclass(frozen=True)
class Plan:
    namespaces: int = 50
    workloads_per_namespace: int = 10  # ScaledObjects: half Deployments, half StatefulSets
    pods_per_workload: int = 10
    nodes: int = 500
    events_per_second: float = 20.0
    rate: float = 500.0  # RPC/s offered by the KEDA-shaped client, over every ScaledObject
    window: float = 20.0
    windows: int = 3  # measured windows of each kind (steady, churn)
    # Whole dcgm-exporter pages (every default family, one GPU per pod, idle GPUs up to 8) instead of
    # GPU_UTIL lines alone; refresh: seconds between a node's new values (0: only when its pods change),
    # each node at its own phase, as dcgm-exporter's collection interval does.
    full_pages: bool = False
    refresh: float = 0.0

    @property
    def pods(self) -> int:
        return self.namespaces * self.workloads_per_namespace * self.pods_per_workload

    @property
    def objects(self) -> int:
        return self.namespaces * self.workloads_per_namespace


PLANS = (Plan(), Plan(pods_per_workload=100))
QUICK = (Plan(namespaces=10, nodes=100, window=8.0, rate=200.0, windows=1),)


def workloads(plan: Plan) -> list[tuple[str, str, str]]:
    """(namespace, name, kind) of every scale target; each has one ScaledObject of the same name."""
    out = []
    for n in range(plan.namespaces):
        for w in range(plan.workloads_per_namespace):
            out.append((f"ns-{n:02d}", f"w-{w}", "Deployment" if w % 2 == 0 else "StatefulSet"))
    return out


# --- the cluster process ------------------------------------------------------------------------------


@dataclass
class _Pod:
    namespace: str
    name: str
    workload: str
    node: str | None
    util: int
    phase: str = "Pending"
    ready: bool = False
    deleting: bool = False


@dataclass
class ClusterState:
    """The cluster as the fake API server and the exporter pages show it; churn changes both together."""

    plan: Plan
    kube: Any
    fake: Any  # the fake_kube module
    pods: dict[tuple[str, str], _Pod] = field(default_factory=dict)
    by_node: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    pages: dict[str, bytes] = field(default_factory=dict)  # node → cached page
    readies: list[dict[str, Any]] = field(default_factory=list)
    events: int = 0
    rolling: set[tuple[str, str]] = field(default_factory=set)
    serial: int = 0
    members: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (namespace, workload) → pods

    def node(self, index: int) -> str:
        return f"node-{index:05d}"

    def put(self, pod: _Pod, *, count: bool = True) -> None:
        obj = self.fake.pod(
            pod.name,
            pod.namespace,
            {"app": pod.workload},
            pod.node,
            phase=pod.phase,
            ready=pod.ready,
            deleting=pod.deleting,
            ports=[("http", 8000)],
        )
        self.kube.put(self.fake.POD, obj)
        if count:
            self.events += 1

    def place(self, pod: _Pod) -> None:
        self.pods[(pod.namespace, pod.name)] = pod
        self.members.setdefault((pod.namespace, pod.workload), set()).add(pod.name)
        if pod.node is not None:
            self.by_node.setdefault(pod.node, set()).add((pod.namespace, pod.name))
            self.forget_page(pod.node)

    def unplace(self, pod: _Pod) -> None:
        self.pods.pop((pod.namespace, pod.name), None)
        self.members.get((pod.namespace, pod.workload), set()).discard(pod.name)
        if pod.node is not None:
            self.by_node.get(pod.node, set()).discard((pod.namespace, pod.name))
            self.forget_page(pod.node)

    def forget_page(self, node: str) -> None:
        self.pages.pop(node, None)
        for key in [k for k in self.pages if k.startswith(node + "@")]:
            del self.pages[key]

    def page(self, node: str) -> bytes:
        if self.plan.full_pages:
            return self.full_page(node)
        cached = self.pages.get(node)
        if cached is None:
            lines = [
                "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
                "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
            ]
            for gpu, key in enumerate(sorted(self.by_node.get(node, ()))):
                pod = self.pods[key]
                if pod.deleting or pod.phase != "Running":
                    continue  # the GPU is no longer (or not yet) allocated to the pod
                lines.append(
                    f'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",UUID="GPU-{node}-{gpu}",device="nvidia{gpu}",'
                    f'modelName="NVIDIA H100 80GB HBM3",Hostname="{node}",container="main",'
                    f'namespace="{pod.namespace}",pod="{pod.name}"}} {pod.util}'
                )
            cached = ("\n".join(lines) + "\n").encode()
            self.pages[node] = cached
        return cached

    def full_page(self, node: str) -> bytes:
        index = int(node.rpartition("-")[2])
        refresh = self.plan.refresh
        # Each node's values move every `refresh` seconds, at a phase of its own.
        epoch = int((time.time() + index * 7.919) // refresh) if refresh > 0 else 0
        key = f"{node}@{epoch}"
        cached = self.pages.get(key)
        if cached is None:
            for old in [k for k in self.pages if k.startswith(node + "@")]:
                del self.pages[old]
            # (Their utilisations are the page's own draws, not the pods' `util`: no Ready probe reads them.)
            placed = [self.pods[pod_key] for pod_key in sorted(self.by_node.get(node, ()))]
            running = [pod for pod in placed if pod.phase == "Running" and not pod.deleting]
            text = dcgm_page(
                max(8, len(running)),
                seed=index,
                pods=[("main", pod.namespace, pod.name) for pod in running],
                hostname=node,
                values_seed=epoch,
            )
            cached = self.pages[key] = text.encode()
        return cached

    def expected(self, namespace: str, workload: str) -> int:
        pods = [self.pods[(namespace, name)] for name in self.members.get((namespace, workload), ())]
        return sum(p.util for p in pods if p.ready and not p.deleting)


def populate(state: ClusterState, exporter_ports: list[int]) -> None:
    fake, kube, plan = state.fake, state.kube, state.plan
    rng = random.Random(1)
    for index, port in enumerate(exporter_ports):
        node = state.node(index)
        kube.put(
            fake.POD,
            fake.pod(
                f"dcgm-exporter-{node}", EXPORTER_NAMESPACE, EXPORTER_LABELS, node, ports=[("metrics", port)]
            ),
        )
    for namespace, name, kind in workloads(plan):
        labels = {"app": name}
        target = fake.deployment(name, namespace, labels, replicas=plan.pods_per_workload)
        kube.put(fake.DEPLOYMENT if kind == "Deployment" else fake.STATEFULSET, target)
        trigger = {"type": "external", "metadata": METADATA}
        ref = {"name": name, "kind": kind, "apiVersion": "apps/v1"}
        kube.put(fake.SCALED_OBJECT, fake.scaled_object(name, namespace, ref, [trigger]))
        for i in range(plan.pods_per_workload):
            pod = _Pod(
                namespace, f"{name}-{i}", name, state.node(rng.randrange(plan.nodes)), rng.randint(10, 90)
            )
            pod.phase, pod.ready = "Running", True
            state.place(pod)
            state.put(pod, count=False)
    kube.compact()  # the start-up history is not needed by any watch


async def replace_one(state: ClusterState, rng: random.Random) -> None:
    """One rollout step of a workload: its old pod terminates and goes, a new one is scheduled and turns Ready."""
    candidates = [w for w in workloads(state.plan) if (w[0], w[1]) not in state.rolling]
    namespace, workload, kind = rng.choice(candidates)
    state.rolling.add((namespace, workload))
    try:
        old = state.pods[(namespace, min(state.members[(namespace, workload)]))]
        old.deleting = True
        state.put(old)  # MODIFIED: terminating
        state.forget_page(old.node or "")
        await asyncio.sleep(0.2)
        state.unplace(old)
        state.kube.delete(state.fake.POD, namespace, old.name)  # DELETED
        state.events += 1
        state.serial += 1
        name = old.name if kind == "StatefulSet" else f"{workload}-r{state.serial}"
        util = rng.randint(10, 90)
        while util == old.util:
            util = rng.randint(10, 90)
        new = _Pod(namespace, name, workload, None, util)
        state.place(new)
        state.put(new)  # ADDED: Pending, not scheduled
        await asyncio.sleep(0.2)
        new.node = state.node(rng.randrange(state.plan.nodes))
        new.phase = "Running"
        state.place(new)
        state.put(new)  # MODIFIED: scheduled, containers starting (its GPU shows on the node's page)
        await asyncio.sleep(0.4)
        new.ready = True
        state.put(new)  # MODIFIED: Ready
        state.readies.append(
            {
                "namespace": namespace,
                "name": workload,
                "at": time.monotonic(),
                "value": state.expected(namespace, workload),
            }
        )
        # The probe compares with this value: no other rollout of the workload until it has had its chance.
        await asyncio.sleep(COOLDOWN)
    finally:
        state.rolling.discard((namespace, workload))


async def churn(state: ClusterState, events_per_second: float) -> None:
    rng = random.Random(2)
    loop = asyncio.get_running_loop()
    interval = 5 / events_per_second  # each replacement is 5 pod events
    start, n = loop.time(), 0
    tasks: set[asyncio.Task[None]] = set()
    while True:
        n += 1
        await asyncio.sleep(max(0.0, start + n * interval - loop.time()))
        task = asyncio.create_task(replace_one(state, rng))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def serve_cluster(plan: Plan, directory: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import fake_kube

    kube = fake_kube.FakeKube()
    await kube.start()
    state = ClusterState(plan, kube, fake_kube)

    async def metrics(request: web.Request) -> web.Response:
        port = request.transport.get_extra_info("sockname")[1]  # type: ignore[union-attr]
        return web.Response(body=state.page(nodes[port]), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    for _ in range(plan.nodes):
        await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024).start()
    ports = [address[1] for address in runner.addresses]
    nodes = {port: state.node(i) for i, port in enumerate(ports)}
    populate(state, ports)

    churning: asyncio.Task[None] | None = None

    async def control_churn(request: web.Request) -> web.Response:
        nonlocal churning
        if churning is not None:
            churning.cancel()
            churning = None
        rate = float(request.query.get("rate", "0"))
        if rate > 0:
            churning = asyncio.create_task(churn(state, rate))
        return web.json_response({"events": state.events})

    async def control_stats(request: web.Request) -> web.Response:
        after = int(request.query.get("after", "0"))
        return web.json_response({"events": state.events, "readies": state.readies[after:]})

    control = web.Application()
    control.router.add_post("/churn", control_churn)
    control.router.add_get("/stats", control_stats)
    control_runner = web.AppRunner(control, access_log=None)
    await control_runner.setup()
    await web.TCPSite(control_runner, "127.0.0.1", 0).start()
    kubeconfig = kube.kubeconfig(directory)
    print(json.dumps({"kubeconfig": str(kubeconfig), "control": control_runner.addresses[0][1]}), flush=True)
    gc.freeze()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    if churning is not None:
        churning.cancel()
    await control_runner.cleanup()
    await runner.cleanup()
    await kube.stop()


# --- the KEDA-shaped client process -------------------------------------------------------------------


def requests_for(plan: Plan) -> list[tuple[bytes, bytes]]:
    out = []
    for namespace, name, _ in workloads(plan):
        ref = pb.ScaledObjectRef(name=name, namespace=namespace, scalerMetadata=METADATA)
        metrics = pb.GetMetricsRequest(scaledObjectRef=ref, metricName="gpu-utilization")
        out.append((ref.SerializeToString(), metrics.SerializeToString()))
    random.Random(3).shuffle(out)
    return out


async def client_main(plan: Plan, target: str, duration: float, health_only: bool = False) -> dict[str, Any]:
    from bench.loadgen import Client, open_loop

    requests = requests_for(plan)
    async with grpc.aio.insecure_channel(target) as channel:
        client = Client(channel, health_only)
        gc.collect()
        gc.freeze()
        gc.disable()
        print("start", flush=True)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        lag = await open_loop(client, requests, plan.rate, duration)
        cpu1, wall1 = time.process_time(), time.perf_counter()
    return {
        "calls": len(client.latencies),
        "errors": client.errors,
        "seconds": wall1 - wall0,
        "client_cpu": cpu1 - cpu0,
        "lag": lag,
        "latencies": client.latencies,
    }


# --- the benchmark ------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _child(
    args: list[str],
    *,
    cpu: int | None,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    nice: int = 0,
) -> AsyncIterator[Child]:
    command = [sys.executable, *args]
    if nice:
        command = ["nice", "-n", str(nice), *command]
    if cpu is not None:
        command = ["taskset", "-c", str(cpu), *command]
    process = await asyncio.create_subprocess_exec(
        *command, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    child = Child(process)
    try:
        yield child
    finally:
        await child.stop()


@contextlib.asynccontextmanager
async def cluster(plan: Plan) -> AsyncIterator[tuple[Child, str, int]]:
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        args = ["-m", "bench.bench_cluster", "serve", "--plan", json.dumps(plan.__dict__), "--dir", tmp]
        # The client shares its core with this process: at a lower priority here, the client's calls go
        # first when both are ready, so less of its own waiting is counted as the scaler's latency.
        async with _child(args, cpu=OTHERS_CPU, nice=CLUSTER_NICE) as child:
            assert child.process.stdout is not None
            line = await asyncio.wait_for(child.process.stdout.readline(), 600)
            if not line:
                err = await child.process.stderr.read() if child.process.stderr else b""
                raise RuntimeError("cluster process exited: " + err.decode()[-2000:])
            info = json.loads(line)
            child.drain(child.process.stdout, child.process.stderr)
            yield child, info["kubeconfig"], info["control"]


@contextlib.asynccontextmanager
async def scaler(
    kubeconfig: str, extra_env: dict[str, str] | None = None
) -> AsyncIterator[tuple[Child, str]]:
    # BENCH_SCALER_ROOT: run another checkout's scaler (e.g. a worktree of an older commit) for comparison.
    root = Path(os.environ.get("BENCH_SCALER_ROOT", str(ROOT)))
    args = [
        "-m", "keda_gpu_scaler", "serve", "--grpc-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0",
        "--kubernetes", "on", "--kubeconfig", kubeconfig, "--scrape-interval", f"{SCRAPE_INTERVAL:g}",
        "--exporter-selector", "app=bench-dcgm-exporter:metrics",
    ]  # fmt: skip
    # The GC probe (bench/gcprobe) reports every collection of 1 ms or more: long pauses show in the tail.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join((str(GC_PROBE), str(root))),
        "BENCH_GC_PROBE": "1",
        "BENCH_LOOP_PROBE": "1",
        **(extra_env or {}),
    }
    async with _child(args, cpu=SCALER_CPU, cwd=root, env=env) as child:
        assert child.process.stderr is not None
        async with asyncio.timeout(120):
            while True:
                text = (await child.process.stderr.readline()).decode()
                if not text:
                    raise RuntimeError("serve exited before it was ready: " + "\n".join(child.tail))
                child.tail.append(text.rstrip())
                if match := READY_LINE.search(text):
                    break
        child.drain(child.process.stdout, child.process.stderr)
        yield child, f"127.0.0.1:{match.group(1)}"


async def _value(stub: Any, namespace: str, name: str) -> float | None:
    ref = pb.ScaledObjectRef(name=name, namespace=namespace, scalerMetadata=METADATA)
    try:
        response = await stub.GetMetrics(
            pb.GetMetricsRequest(scaledObjectRef=ref, metricName="gpu-utilization")
        )
    except grpc.aio.AioRpcError:
        return None
    return float(response.metricValues[0].metricValueFloat)


async def warm(stub: Any, plan: Plan, deadline: float) -> float:
    """Poll every ScaledObject until each has a value; returns the seconds that took."""
    started = time.monotonic()
    pending = [(n, w) for n, w, _ in workloads(plan)]
    while pending:
        if time.monotonic() - started > deadline:
            raise RuntimeError(f"{len(pending)} ScaledObjects still without a value after {deadline:.0f} s")
        values = await asyncio.gather(*(_value(stub, n, w) for n, w in pending))
        pending = [p for p, v in zip(pending, values, strict=True) if v is None]
        if pending:
            await asyncio.sleep(1.0)
    return time.monotonic() - started


async def watch_readies(
    stub: Any, session: aiohttp.ClientSession, control: int, stop: asyncio.Event, seen: int
) -> tuple[list[float], int]:
    """Seconds from a pod's Ready to its ScaledObject's GetMetrics including it (inf: not within 15 s),
    for the pods that turn Ready after the first `seen`; and how many have turned Ready by the end.

    One pod in PROBE_EVERY is followed, polled every PROBE_SECONDS: the probe's own calls stay a small
    part of the load."""
    started = time.monotonic()  # the cluster process stamps Readies with the same system-wide clock
    delays: list[float] = []
    probes: set[asyncio.Task[None]] = set()

    async def probe(ready: dict[str, Any]) -> None:
        while time.monotonic() - ready["at"] < 15:
            if await _value(stub, ready["namespace"], ready["name"]) == ready["value"]:
                delays.append(time.monotonic() - ready["at"])
                return
            await asyncio.sleep(PROBE_SECONDS)
        delays.append(float("inf"))

    while not stop.is_set():
        async with session.get(f"http://127.0.0.1:{control}/stats", params={"after": str(seen)}) as response:
            data = await response.json()
        for i, ready in enumerate(data["readies"], start=seen):
            # (A rollout that finished between windows is not this window's: its probe would start late.)
            if i % PROBE_EVERY or ready["at"] < started:
                continue
            task = asyncio.create_task(probe(ready))
            probes.add(task)
            task.add_done_callback(probes.discard)
        seen += len(data["readies"])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)
    await asyncio.gather(*probes)
    return delays, seen


@dataclass
class Window:
    calls: int
    errors: int
    p50_ms: float
    p99_ms: float
    scaler_cpu: float  # share of one core
    events: int
    seconds: float
    lag_ms: float
    longest_gc_ms: float  # the scaler's longest garbage collection in the window
    loop_late_p99_ms: float  # how late the scaler's event loop ran a task due then (bench/gcprobe), p99


async def load_window(
    plan: Plan,
    target: str,
    scaler_child: Child,
    session: aiohttp.ClientSession,
    control: int,
    churn_rate: float,
    profile_for: float = 0.0,
    health_only: bool = False,
) -> tuple[Window, list[tuple[list[str], int]]]:
    args = ["-m", "bench.bench_cluster", "client", "--plan", json.dumps(plan.__dict__), "--target", target]
    args += ["--duration", str(plan.window)] + (["--health-only"] if health_only else [])
    async with _child(args, cpu=OTHERS_CPU) as client:
        assert client.process.stdout is not None
        line = await asyncio.wait_for(client.process.stdout.readline(), 120)
        if line.strip() != b"start":
            raise RuntimeError(f"client failed: {line!r}")
        async with session.post(f"http://127.0.0.1:{control}/churn", params={"rate": str(churn_rate)}) as r:
            events0 = (await r.json())["events"]
        cpu0, t0, pauses0 = scaler_child.cpu(), time.monotonic(), len(scaler_child.gc_pauses)
        late0 = len(scaler_child.loop_late)
        profiled = asyncio.create_task(profile(scaler_child.pid, profile_for)) if profile_for else None
        out = await asyncio.wait_for(client.process.stdout.read(), plan.window + 120)
        cpu1, t1 = scaler_child.cpu(), time.monotonic()
        async with session.post(f"http://127.0.0.1:{control}/churn", params={"rate": "0"}) as r:
            events1 = (await r.json())["events"]
        stacks = await profiled if profiled else []
        pauses = [ms for _, ms in scaler_child.gc_pauses[pauses0:]]
        late = scaler_child.loop_late[late0:] or [float("nan")]
    data = json.loads(out)
    latencies = data["latencies"] or [float("nan")]
    return (
        Window(
            calls=data["calls"],
            errors=data["errors"],
            p50_ms=1000 * percentile(latencies, 50),
            p99_ms=1000 * percentile(latencies, 99),
            scaler_cpu=(cpu1 - cpu0) / (t1 - t0),
            events=events1 - events0,
            seconds=t1 - t0,
            lag_ms=1000 * data["lag"],
            longest_gc_ms=max(pauses, default=0.0),
            loop_late_p99_ms=percentile(late, 99),
        ),
        stacks,
    )


@dataclass
class Result:
    plan: Plan
    warm_seconds: float
    steady: Window  # the window whose RPC p99 is the median of the steady windows
    churn: Window  # the same among the churn windows
    floor: Window  # the same among the floor windows: the gRPC health Check, during churn
    steady_p99s: list[float]  # every window's RPC p99, ms
    churn_p99s: list[float]
    floor_p99s: list[float]
    discovery_share: float  # of the scaler's samples during churn
    rss: tuple[float, float]
    ready_delays: list[float]
    stacks: list[tuple[list[str], int]]


async def measure(plan: Plan) -> Result:
    async with contextlib.AsyncExitStack() as stack:
        _, kubeconfig, control = await stack.enter_async_context(cluster(plan))
        running, target = await stack.enter_async_context(scaler(kubeconfig))
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(target))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        stub = pb_grpc().ExternalScalerStub(channel)
        warm_seconds = await warm(stub, plan, deadline=300)
        # Steady, churn and floor windows alternate, plan.windows of each: on a shared machine one window's
        # p99 moves several-fold from run to run, so the table shows the median window and every window's p99.
        # A floor window is a churn window in which the client calls the gRPC health service's Check (a
        # handler that does next to nothing) instead: the same client, runtime, machine and churn, none of the
        # servicer's or the evaluation's work, measured minutes apart from the KEDA-shaped calls.
        steadies: list[Window] = []
        churns: list[Window] = []
        floors: list[Window] = []
        delays: list[float] = []
        readies_seen = 0  # the cluster counts Readies from its start: each window probes only its own
        for _ in range(plan.windows):
            steadies.append((await load_window(plan, target, running, session, control, 0.0))[0])
            stop = asyncio.Event()
            readies = asyncio.create_task(watch_readies(stub, session, control, stop, readies_seen))
            churns.append(
                (await load_window(plan, target, running, session, control, plan.events_per_second))[0]
            )
            stop.set()
            window_delays, readies_seen = await readies
            delays += window_delays
            floors.append(
                (
                    await load_window(
                        plan, target, running, session, control, plan.events_per_second, health_only=True
                    )
                )[0]
            )
        rss = rss_mib(running.pid)
        # The profile comes from a window of its own: py-spy's sampling takes CPU from the machine the
        # measured window runs on, and its figures would carry that.
        _, stacks = await load_window(
            plan, target, running, session, control, plan.events_per_second, profile_for=plan.window - 2
        )
    found = shares(stacks, PROFILE_RULES, PROFILE_REST)
    return Result(
        plan,
        warm_seconds,
        _median_window(steadies),
        _median_window(churns),
        _median_window(floors),
        [w.p99_ms for w in steadies],
        [w.p99_ms for w in churns],
        [w.p99_ms for w in floors],
        found.get(PROFILE_RULES[0][0], 0.0),
        rss,
        delays,
        stacks,
    )


def _median_window(windows: list[Window]) -> Window:
    return sorted(windows, key=lambda w: w.p99_ms)[(len(windows) - 1) // 2]


def _p99s(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def pb_grpc() -> Any:
    from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc

    return externalscaler_pb2_grpc


def _delays(values: list[float]) -> str:
    finite = [v for v in values if v != float("inf")]
    if not values:
        return "–"
    late = len(values) - len(finite)
    text = f"{median(finite):.2f} / {max(finite):.2f}" if finite else "never"
    return text + (f" ({late} of {len(values)} not within 15 s)" if late else "")


def render(results: list[Result]) -> Section:
    rows = []
    headlines: list[tuple[str, str, str, bool | None]] = []
    for r in results:
        p = r.plan
        per_event = (r.churn.scaler_cpu - r.steady.scaler_cpu) * r.churn.seconds / max(r.churn.events, 1)
        discovery_core = r.discovery_share * r.churn.scaler_cpu
        finite = [v for v in r.ready_delays if v != float("inf")]
        worst_ready = max(r.ready_delays, default=float("nan"))
        rows.append(
            f"| {p.pods:,} pods / {p.objects} ScaledObjects / {p.nodes} nodes | {r.warm_seconds:.0f} |"
            f" {r.steady.p50_ms:.2f} / {r.steady.p99_ms:.2f} | {r.churn.p50_ms:.2f} / {r.churn.p99_ms:.2f} |"
            f" {r.floor.p50_ms:.2f} / {r.floor.p99_ms:.2f} |"
            f" {_p99s(r.steady_p99s)} / {_p99s(r.churn_p99s)} / {_p99s(r.floor_p99s)} |"
            f" {r.steady.loop_late_p99_ms:.2f} / {r.churn.loop_late_p99_ms:.2f} |"
            f" {r.steady.lag_ms:.0f} / {r.churn.lag_ms:.0f} |"
            f" {r.steady.longest_gc_ms:.0f} / {r.churn.longest_gc_ms:.0f} |"
            f" {r.churn.errors + r.steady.errors} | {r.churn.events / r.churn.seconds:.1f} |"
            f" {1000 * per_event:.2f} | {100 * r.steady.scaler_cpu:.0f} % / {100 * r.churn.scaler_cpu:.0f} % |"
            f" {100 * discovery_core:.0f} % | {r.rss[0]:.0f} / {r.rss[1]:.0f} | {_delays(r.ready_delays)} |"
        )
        if p is results[0].plan:
            goal_ready = SCRAPE_INTERVAL + 0.5
            headlines += [
                (
                    f"Cluster {p.pods:,} pods, RPC p99 during churn (median of {len(r.churn_p99s)} windows)",
                    f"{r.churn.p99_ms:.1f} ms ({_p99s(r.churn_p99s)})",
                    "≤ 2 ms",
                    r.churn.p99_ms <= 2,
                ),
                (
                    f"Cluster {p.pods:,} pods, the same client's p99 for the gRPC health Check during churn"
                    " (the runtime's floor here)",
                    f"{r.floor.p99_ms:.1f} ms ({_p99s(r.floor_p99s)})",
                    "–",
                    None,
                ),
                (
                    f"Cluster {p.pods:,} pods, scaler event loop late p99 during churn (inside the scaler)",
                    f"{r.churn.loop_late_p99_ms:.1f} ms",
                    "–",
                    None,
                ),
                (
                    "Cluster: discovery CPU during churn",
                    f"{100 * discovery_core:.0f} % of a core",
                    "≤ 20 %",
                    discovery_core <= 0.2,
                ),
                ("Cluster: scaler RSS (peak)", f"{r.rss[1]:.0f} MiB", "≤ 250 MiB", r.rss[1] <= 250),
                (
                    "Cluster: pod Ready → in GetMetrics (worst)",
                    f"{worst_ready:.2f} s",
                    f"≤ {goal_ready:g} s",
                    bool(finite) and worst_ready <= goal_ready,
                ),
            ]
    first = results[0]
    table = "\n".join(rows)
    return Section(
        f"""## Kubernetes discovery at cluster scale

`{" ".join([".venv/bin/python", "-m", "bench", "--only", "cluster"])}`. A loopback Kubernetes API server
(`tests/fake_kube.py`: the API's JSON, list + watch with bookmarks) in a process of its own serves
ScaledObjects (half on Deployments, half on StatefulSets, {first.plan.workloads_per_namespace} per
namespace), their pods spread at random over the nodes, and one dcgm-exporter pod per node whose page (served
by the same process) lists the GPUs of the pods running there. `keda-gpu-scaler serve --kubernetes on`
(pinned to core {SCALER_CPU}, scrapes every {SCRAPE_INTERVAL:g} s) finds everything through the API. A
KEDA-shaped client (`GetMetricSpec`, `GetMetrics`, `IsActive` per poll, open loop) polls every ScaledObject
at {first.plan.rate:g} RPC/s in total, in {first.plan.window:g} s windows without pod events ("steady") and
with pod churn of {first.plan.events_per_second:g} events/s, and "floor" windows (the same churn, the same client
calling the gRPC health service's `Check`, a handler that does next to nothing, three times per poll at the
same rate: what the gRPC runtime, the machine and the churn give without any of the scaler's RPC work),
alternating, {first.plan.windows} of each. Churn is rollouts of one pod
at a time (terminating → deleted → created Pending → scheduled and Running, its GPU on the node's page →
Ready). The cluster process and the client share core {OTHERS_CPU}, the cluster process at nice {CLUSTER_NICE}
so that the client's calls go first when both are ready (the pod events per second show it kept up).

"CPU per pod event" is the scaler's extra CPU during churn over steady, per event. "Discovery" is the share
of py-spy samples in `keda_gpu_scaler/discovery` frames times the scaler's CPU during churn; py-spy samples
one more window with the same churn and load, after the measured ones, so its own CPU is in no figure. The
other columns come from the steady, the churn and the floor window whose p99 is the median. "Ready → in
GetMetrics" is measured for one pod in {PROBE_EVERY} of those that turned Ready during the churn windows (so that
the probe's calls stay a small part of the load): a separate probe polls its ScaledObject every {1000 * PROBE_SECONDS:.0f} ms
until the value includes the new pod (median / worst, seconds). The pod's GPU is on its node's page from
the moment it runs, so the wait is for discovery and the next scrape. "Longest GC pause" comes from a
probe in the scaler's process (`bench/gcprobe`) that reports each garbage collection of 1 ms or more; the
same probe runs a task on the scaler's event loop that sleeps 5 ms at a time, and "scaler loop late" is
how late it woke (p99): the wait a call arriving then had inside the scaler. The client's latencies
also carry its own delays: it shares core {OTHERS_CPU} with the cluster process, and "client behind
schedule" is how late it started its worst poll.

| cluster | warm-up s | steady p50 / p99 ms | churn p50 / p99 ms | floor (health Check, churn) p50 / p99 ms | every window's p99, steady / churn / floor ms | scaler loop late p99 steady / churn ms | client behind schedule, worst, steady / churn ms | longest GC pause steady / churn ms | RPC errors | pod events/s | scaler CPU ms per pod event | scaler CPU steady / churn | discovery CPU (of a core) | RSS now / peak MiB | Ready → in GetMetrics s |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{table}

Where the scaler's CPU went during churn ({first.plan.pods:,} pods):

{categorise(first.stacks, PROFILE_RULES, PROFILE_REST)}
""",
        headlines,
    )


async def run(quick: bool = False, plans: tuple[Plan, ...] | None = None) -> Section:
    # This process (the Ready probe) keeps off the scaler's core, as the cluster and the client do.
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {OTHERS_CPU})
    plans = plans or (QUICK if quick else PLANS)
    results = []
    try:
        for plan in plans:
            try:
                results.append(await measure(plan))
            except Exception as error:
                if not results:
                    raise
                print(f"bench cluster: {plan.pods:,} pods: {error!r}", file=sys.stderr)
    finally:
        os.sched_setaffinity(0, affinity)
    return render(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("--plan", required=True)
    serve.add_argument("--dir", required=True)
    client = sub.add_parser("client")
    client.add_argument("--plan", required=True)
    client.add_argument("--target", required=True)
    client.add_argument("--duration", type=float, required=True)
    client.add_argument("--health-only", action="store_true", help="call the gRPC health Check instead")
    run_parser = sub.add_parser("run", help="run the benchmark and print its markdown")
    run_parser.add_argument("--quick", action="store_true")
    run_parser.add_argument("--small-only", action="store_true", help=f"only {PLANS[0].pods:,} pods")
    args = parser.parse_args()
    if args.command == "run":
        print(asyncio.run(run(args.quick, PLANS[:1] if args.small_only else None)).markdown)
        return
    plan = Plan(**json.loads(args.plan))
    if args.command == "serve":
        asyncio.run(serve_cluster(plan, Path(args.dir)))
    else:
        print(json.dumps(asyncio.run(client_main(plan, args.target, args.duration, args.health_only))))


if __name__ == "__main__":
    main()
