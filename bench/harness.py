"""Processes the benchmarks start (page server, `serve`, Prometheus) and what they read from /proc."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
READY_LINE = re.compile(r"serving gRPC on \S+ \(port (\d+), \w+\), HTTP on \S+ \(port (\d+)\)")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all threads, from /proc (10 ms resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    # After the ")" of the command name, utime and stime are the 12th and 13th fields.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) in MiB."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): a value that was really observed."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def trigger_ref(name: str, namespace: str, **metadata: str) -> pb.ScaledObjectRef:
    meta = {"podNamePrefix": "vllm-", "threshold": "70", **metadata}
    return pb.ScaledObjectRef(name=name, namespace=namespace, scalerMetadata=meta)


GC_PROBE = Path(__file__).resolve().parent / "gcprobe"
GC_PAUSE = "bench-gc-pause "
LOOP_LATE = "bench-loop-late "


async def _drain(
    stream: asyncio.StreamReader, keep: deque[str], pauses: list[tuple[int, float]], late: list[float]
) -> None:
    # The child blocks once a pipe it writes to is full: keep reading, remember the tail for errors.
    while line := await stream.readline():
        text = line.decode(errors="replace").rstrip()
        if text.startswith(GC_PAUSE):
            generation, milliseconds = text.removeprefix(GC_PAUSE).split()
            pauses.append((int(generation), float(milliseconds)))
        elif text.startswith(LOOP_LATE):
            late.extend(float(ms) for ms in text.removeprefix(LOOP_LATE).split())
        else:
            keep.append(text)


@dataclass
class Child:
    """A subprocess whose output is drained in the background; stop() ends it by its own pid."""

    process: asyncio.subprocess.Process
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=50))
    gc_pauses: list[tuple[int, float]] = field(default_factory=list)  # (generation, ms), with gc_probe
    loop_late: list[float] = field(default_factory=list)  # ms, with BENCH_LOOP_PROBE (bench/gcprobe)
    _drains: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def drain(self, *streams: asyncio.StreamReader | None) -> None:
        for stream in streams:
            if stream is not None:
                self._drains.append(
                    asyncio.create_task(_drain(stream, self.tail, self.gc_pauses, self.loop_late))
                )

    def cpu(self) -> float:
        try:
            return cpu_seconds(self.pid)
        except FileNotFoundError:
            raise RuntimeError(
                f"process {self.pid} exited; its last lines:\n" + "\n".join(self.tail)
            ) from None

    async def stop(self, grace: float = 10.0) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), grace)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        for task in self._drains:
            task.cancel()
        await asyncio.gather(*self._drains, return_exceptions=True)


@dataclass
class PageServer:
    child: Child
    ports: list[int]
    control: int

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index]}/metrics"

    async def requests(self, session: aiohttp.ClientSession) -> int:
        async with session.get(f"http://127.0.0.1:{self.control}/stats") as response:
            return int((await response.json())["requests"])

    async def set_util(self, session: aiohttp.ClientSession, index: int, value: float) -> None:
        query = {"port": str(self.ports[index]), "value": str(value)}
        async with session.post(f"http://127.0.0.1:{self.control}/set", params=query) as response:
            response.raise_for_status()


@contextlib.asynccontextmanager
async def page_server(
    count: int,
    *,
    namespace_per_port: bool = False,
    cpu: int | None = None,
    refresh: float | None = None,
    every_value: bool = False,
) -> AsyncIterator[PageServer]:
    args = [sys.executable, "-m", "bench.pageserver", "--count", str(count)]
    if refresh is not None:
        args += ["--refresh", f"{refresh:g}"]
    if every_value:
        args.append("--every-value")
    if namespace_per_port:
        args.append("--namespace-per-port")
    if cpu is not None:
        args = ["taskset", "-c", str(cpu), *args]
    process = await asyncio.create_subprocess_exec(
        *args, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    child = Child(process)
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 120)
        if not line:
            raise RuntimeError("page server exited before it was ready")
        info = json.loads(line)
        child.drain(process.stdout, process.stderr)
        yield PageServer(child, info["ports"], info["control"])
    finally:
        await child.stop()


@dataclass
class Scaler:
    child: Child
    grpc_port: int
    http_port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@contextlib.asynccontextmanager
async def scaler(
    urls: Sequence[str],
    *,
    cpu: int | None = None,
    gc_probe: bool = False,
    extra_env: Mapping[str, str] | None = None,
    **flags: str,
) -> AsyncIterator[Scaler]:
    """A real `keda-gpu-scaler serve` subprocess on loopback; flags as name=value (scrape_interval="1").

    gc_probe: report the process's garbage-collection pauses (Child.gc_pauses) through a sitecustomize
    module put first on its PYTHONPATH; the scaler's own code is not touched."""
    args = ["serve", "--grpc-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", "--kubernetes", "off"]
    for name, value in flags.items():
        args += [f"--{name.replace('_', '-')}", value]
    # Exporter URLs go through the environment: 1,000 of them would make an unwieldy command line.
    env = {**os.environ, "KEDA_GPU_SCALER_EXPORTER_URL": ",".join(urls), **(extra_env or {})}
    if gc_probe:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(GC_PROBE), env.get("PYTHONPATH")) if p)
        env["BENCH_GC_PROBE"] = "1"
    command = [sys.executable, "-m", "keda_gpu_scaler", *args]
    if cpu is not None:
        command = ["taskset", "-c", str(cpu), *command]
    process = await asyncio.create_subprocess_exec(
        *command, cwd=ROOT, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    child = Child(process)
    try:
        assert process.stderr is not None
        async with asyncio.timeout(60):
            while True:
                line = (await process.stderr.readline()).decode()
                if not line:
                    raise RuntimeError("serve exited before it was ready: " + "\n".join(child.tail))
                child.tail.append(line.rstrip())
                if match := READY_LINE.search(line):
                    break
        child.drain(process.stderr)
        yield Scaler(child, int(match.group(1)), int(match.group(2)))
    finally:
        await child.stop()


@dataclass
class Prometheus:
    child: Child
    port: int

    async def query(self, session: aiohttp.ClientSession, expr: str) -> float | None:
        url = f"http://127.0.0.1:{self.port}/api/v1/query"
        async with session.get(url, params={"query": expr}) as response:
            data = await response.json()
        result = data["data"]["result"]
        return float(result[0]["value"][1]) if result else None


def prometheus_available() -> bool:
    return shutil.which("prometheus") is not None


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _duration(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


@contextlib.asynccontextmanager
async def prometheus(jobs: Mapping[str, tuple[float, Sequence[str]]]) -> AsyncIterator[Prometheus]:
    """A real Prometheus server on loopback. jobs: name → (scrape interval in seconds, host:port targets)."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("prometheus is not installed (Debian package `prometheus`)")
    with tempfile.TemporaryDirectory(prefix="bench-prometheus-") as tmp:
        lines = ["global:", "  evaluation_interval: 1m", "scrape_configs:"]
        for name, (interval, targets) in jobs.items():
            lines += [
                f"  - job_name: {name}",
                f"    scrape_interval: {_duration(interval)}",
                f"    scrape_timeout: {_duration(min(interval, 10.0))}",
                "    static_configs:",
                f"      - targets: {json.dumps(list(targets))}",
            ]
        config = _write(Path(tmp, "prometheus.yml"), "\n".join(lines) + "\n")
        port = free_port()
        process = await asyncio.create_subprocess_exec(
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp}/data",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        child = Child(process)
        child.drain(process.stdout, process.stderr)
        try:
            async with aiohttp.ClientSession() as session:
                deadline = time.monotonic() + 60
                while True:
                    if process.returncode is not None:
                        raise RuntimeError("prometheus exited: " + "\n".join(child.tail))
                    with contextlib.suppress(aiohttp.ClientError):
                        async with session.get(f"http://127.0.0.1:{port}/-/ready") as response:
                            if response.status == 200:
                                break
                    if time.monotonic() > deadline:
                        raise RuntimeError("prometheus was not ready within 60 s")
                    await asyncio.sleep(0.2)
            yield Prometheus(child, port)
        finally:
            await child.stop()


def py_spy() -> str | None:
    """The py-spy binary of this venv (the `bench` extra), or one on PATH."""
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


async def profile(pid: int, seconds: float) -> list[tuple[list[str], int]]:
    """Sample a running process with py-spy (only threads holding the GIL, i.e. running Python or C code
    called from it); returns (stack from root to leaf, samples). Empty when py-spy is missing or fails."""
    binary = py_spy()
    if binary is None:
        return []
    with tempfile.TemporaryDirectory(prefix="bench-py-spy-") as tmp:
        out = Path(tmp, "profile.txt")
        process = await asyncio.create_subprocess_exec(
            binary,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(round(seconds)),
            "--rate",
            "250",
            "--format",
            "raw",
            "--output",
            str(out),
            "--nonblocking",
            "--gil",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await process.wait()
        if keep := os.environ.get("BENCH_PROFILE_DIR"):  # the raw stacks, for a closer look
            with contextlib.suppress(OSError):
                shutil.copy(out, Path(keep, f"py-spy-{pid}-{time.time():.0f}.txt"))
        return _read_stacks(out)


def _read_stacks(path: Path) -> list[tuple[list[str], int]]:
    if not path.exists():
        return []
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def shares(
    stacks: list[tuple[list[str], int]], rules: Sequence[tuple[str, str]], rest: str
) -> dict[str, float]:
    """Fraction of the samples per label: the first rule whose text is in one of a sample's frames wins."""
    total = sum(count for _, count in stacks)
    counts: dict[str, int] = {label: 0 for label, _ in rules}
    counts[rest] = 0
    for frames, count in stacks:
        label = next((lbl for lbl, text in rules if any(text in frame for frame in frames)), rest)
        counts[label] += count
    return {label: n / total for label, n in counts.items()} if total else {}


def categorise(stacks: list[tuple[list[str], int]], rules: Sequence[tuple[str, str]], rest: str) -> str:
    """A markdown table of where the samples went (see shares)."""
    found = shares(stacks, rules, rest)
    if not found:
        return "(no profile: py-spy is not installed or could not attach)"
    total = sum(count for _, count in stacks)
    rows = "\n".join(f"| {label} | {100 * f:.0f} % |" for label, f in found.items() if f >= 0.005)
    return f"| where the CPU went (py-spy, {total} samples) | share |\n|---|---|\n{rows}"


@dataclass
class Section:
    """One benchmark's part of docs/BENCHMARKS.md, and its headline figures for the README's table."""

    markdown: str
    # (what, measured, goal, met: True/False, or None where there is no goal)
    headlines: list[tuple[str, str, str, bool | None]] = field(default_factory=list)
