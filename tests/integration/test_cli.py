"""The command line as a user runs it: serve (flags, env, SIGTERM), explain, --help."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from support import GpuLine, dcgm_page

from keda_gpu_scaler import __version__
from keda_gpu_scaler.config.flags import FLAGS
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc

READY_LINE = re.compile(r"serving gRPC on \S+ \(port (\d+), \w+\), HTTP on \S+ \(port (\d+)\)")
METADATA = {"podNamePrefix": "vllm-", "threshold": "70"}


async def start_serve(
    *args: str, env: dict[str, str] | None = None, logged: list[str] | None = None
) -> tuple[asyncio.subprocess.Process, int]:
    """serve on free ports; `logged` gets the lines it printed until it was ready."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "keda_gpu_scaler",
        "serve",
        "--grpc-address",
        "127.0.0.1:0",
        "--http-address",
        "127.0.0.1:0",
        "--kubernetes",
        "off",
        *args,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    assert process.stderr is not None
    async with asyncio.timeout(20):
        while True:
            line = (await process.stderr.readline()).decode()
            assert line, "serve exited before it was ready"
            if logged is not None:
                logged.append(line)
            if match := READY_LINE.search(line):
                return process, int(match.group(1))


@pytest.fixture
async def processes() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    started: list[asyncio.subprocess.Process] = []
    yield started
    for process in started:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_sigterm_ends_streams_ok_and_exits_zero(make_exporter, processes) -> None:  # type: ignore[no-untyped-def]
    exporter = await make_exporter(dcgm_page([GpuLine("llm", "vllm-0", 90)]))
    process, port = await start_serve("--exporter-url", exporter.url, "--scrape-interval", "0.2")
    processes.append(process)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        ref = pb.ScaledObjectRef(name="vllm", namespace="llm", scalerMetadata=METADATA)
        await stub.GetMetricSpec(ref)
        stream = stub.StreamIsActive(ref)
        first = await asyncio.wait_for(stream.read(), 10)
        assert first.result is True
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(stream.read(), 10) is grpc.aio.EOF
        assert await stream.code() is grpc.StatusCode.OK
    assert await asyncio.wait_for(process.wait(), 20) == 0


async def test_environment_variables_configure_serve_and_flags_win(make_exporter, processes) -> None:  # type: ignore[no-untyped-def]
    a = await make_exporter(dcgm_page([GpuLine("llm", "vllm-0", 30)]))
    b = await make_exporter(dcgm_page([GpuLine("llm", "vllm-1", 40)], host="gpu-node-b"))
    env = {
        "KEDA_GPU_SCALER_EXPORTER_URL": f"{a.url},{b.url}",
        "KEDA_GPU_SCALER_SCRAPE_INTERVAL": "0.2",
        # Both conflict with the flags start_serve gives (--kubernetes off, --grpc-address 127.0.0.1:0):
        # were the environment to win, start-up would fail (no cluster) or listen on another port.
        "KEDA_GPU_SCALER_KUBERNETES": "on",
        "KEDA_GPU_SCALER_GRPC_ADDRESS": "127.0.0.1:1",
    }
    process, port = await start_serve(env=env)
    assert port != 1
    processes.append(process)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        request = pb.GetMetricsRequest(
            scaledObjectRef=pb.ScaledObjectRef(name="vllm", namespace="llm", scalerMetadata=METADATA),
            metricName="gpu-utilization",
        )
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            try:
                value = (await stub.GetMetrics(request)).metricValues[0].metricValueFloat
                if value == 70:
                    break
            except grpc.aio.AioRpcError:
                pass
            assert asyncio.get_running_loop().time() < deadline, "never saw both exporters' pods"
            await asyncio.sleep(0.05)
    process.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(process.wait(), 20) == 0


async def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "keda_gpu_scaler",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_serve_help_lists_every_flag_and_its_environment_variable() -> None:
    code, out, _ = await run_cli("serve", "--help")
    assert code == 0
    for flag in FLAGS:
        assert flag.name in out
        assert flag.env in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scrape-interval", "0"], "--scrape-interval='0' must be a finite number > 0"),
        (["--grpc-address", "6000"], "--grpc-address='6000' is not an address"),
        (["--exporter-url", "node-a:9400"], "--exporter-url='node-a:9400' is not an http(s) URL"),
        (["--tls-cert-file", "/nonexistent.pem", "--tls-key-file", "/nonexistent.key"], "no such file"),
        (["--tls-cert-file", "/etc/hostname"], "must be given together"),
        (["--keepalive-time", "3000000"], "--keepalive-time='3000000' is out of range"),
        (["--grpc-address", "127.0.0.1:٦٠٠٠"], "--grpc-address='127.0.0.1:٦٠٠٠' is not an address"),
    ],
)
async def test_bad_flags_are_clear_errors(args: list[str], message: str) -> None:
    code, _, err = await run_cli("serve", "--kubernetes", "off", *args)
    assert code == 2
    assert message in err


async def test_explain_prints_the_table(make_exporter) -> None:  # type: ignore[no-untyped-def]
    page = dcgm_page([GpuLine("llm", f"vllm-{i}", 90, gpu=i) for i in range(4)])
    exporter = await make_exporter(page)
    code, out, _ = await run_cli(
        "explain", "--exporter-url", exporter.url, "--namespace", "llm", "podNamePrefix=vllm-", "threshold=70"
    )
    assert code == 0, out
    assert "vllm-3" in out
    assert "value = 360.00 (sum over 4 pods)" in out
    assert "HPA would ask for 6 replicas with metricType AverageValue" in out
    assert "GPU%" in out and "POD%" in out


async def test_explain_reports_bad_metadata_and_dead_exporters(make_exporter) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = await run_cli(
        "explain",
        "--exporter-url",
        "http://127.0.0.1:9/metrics",
        "--namespace",
        "llm",
        "podNamePrefix=a-",
        "threshold=70",
    )
    assert code == 1
    assert "no source has fresh data" in out
    code, out, _ = await run_cli(
        "explain", "--exporter-url", "http://127.0.0.1:9/metrics", "--namespace", "llm", "threshold=700"
    )
    assert code == 1
    assert "threshold='700' is out of range" in out


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("KEDA_GPU_SCALER_KUBERNETES", "yes"),
        ("KEDA_GPU_SCALER_KUBERNETES", "ON"),
        ("KEDA_GPU_SCALER_LOG_LEVEL", "verbose"),
        ("KEDA_GPU_SCALER_LOG_FORMAT", "xml"),
    ],
)
async def test_a_bad_choice_in_the_environment_is_one_line_and_exit_2(variable: str, value: str) -> None:
    code, _, err = await run_cli(
        "serve", "--grpc-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", env={variable: value}
    )
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert repr(value) in lines[0] and variable in lines[0]


async def test_a_taken_port_is_one_line_naming_the_address_and_no_second_scaler_shares_it(processes) -> None:  # type: ignore[no-untyped-def]
    process, port = await start_serve()
    processes.append(process)
    # gRPC's default SO_REUSEPORT would let a second scaler share the port and answer every other call.
    code, _, err = await run_cli(
        "serve", "--kubernetes", "off", "--grpc-address", f"127.0.0.1:{port}", "--http-address", "127.0.0.1:0"
    )
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err
    assert f"127.0.0.1:{port}" in last and "--grpc-address" in last


async def test_a_taken_http_port_is_one_line_naming_the_address() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        code, _, err = await run_cli(
            "serve", "--kubernetes", "off", "--grpc-address", "127.0.0.1:0", "--http-address", address
        )
    assert code == 2
    assert "Traceback" not in err and address in err and "--http-address" in err


@pytest.mark.parametrize("flag", ["--control-port", "--grpc-address", "--http-address"])
async def test_a_second_demo_on_a_taken_port_is_one_line_naming_the_flag(flag: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"--control-port": "0", "--grpc-address": "127.0.0.1:0", "--http-address": "127.0.0.1:0"}
        ports[flag] = str(port) if flag == "--control-port" else f"127.0.0.1:{port}"
        code, _, err = await run_cli(
            "demo", "--watch-interval", "0", *(part for item in ports.items() for part in item)
        )
    assert code == 2
    assert "Traceback" not in err
    # As with serve: the last line says it (gRPC's own library may log a line of its own before).
    last = err.strip().splitlines()[-1]
    assert last.startswith("keda-gpu-scaler: ") and flag in last and str(port) in last


@pytest.mark.parametrize(
    ("args", "named", "not_named"),
    [
        (
            ["--gateway-url", "llm/pool=http://127.0.0.1:9/metrics"],
            ["--exporter-url", "--inference-url"],
            ["--gateway-url"],
        ),
        (
            ["--inference-url", "llm/vllm-0=http://127.0.0.1:9/metrics"],
            ["--exporter-url", "--gateway-url"],
            ["--inference-url"],
        ),
        (
            ["--exporter-url", "http://127.0.0.1:9/metrics"],
            ["--inference-url", "--gateway-url"],
            ["--exporter-url"],
        ),
    ],
)
async def test_serve_names_only_the_pages_it_was_not_given(
    processes: list[asyncio.subprocess.Process], args: list[str], named: list[str], not_named: list[str]
) -> None:
    logged: list[str] = []
    process, _ = await start_serve(*args, logged=logged)
    processes.append(process)
    text = "".join(logged)
    assert "every call will answer UNAVAILABLE" not in text
    (line,) = [line for line in logged if "answer UNAVAILABLE" in line]
    assert all(flag in line for flag in named), line
    assert not any(flag in line for flag in not_named), line


async def test_serve_with_no_page_at_all_says_every_call_answers_unavailable(
    processes: list[asyncio.subprocess.Process],
) -> None:
    logged: list[str] = []
    process, _ = await start_serve(logged=logged)
    processes.append(process)
    (line,) = [line for line in logged if "answer UNAVAILABLE" in line]
    assert "no --exporter-url or --inference-url or --gateway-url given: every call will answer" in line


async def test_version() -> None:
    code, out, _ = await run_cli("--version")
    assert code == 0 and out.strip() == f"keda-gpu-scaler {__version__}"


@pytest.mark.parametrize(
    ("metric", "threshold", "value_column", "value", "replicas"),
    [
        ("requests", "50", "IN FLIGHT", "42.00", "1 replica with"),
        ("queue", "8", "QUEUED", "30.00", "4 replicas with"),
        ("kv_cache", "80", "POD KV%", "50.00", "1 replica with"),
    ],
)
async def test_explain_shows_an_inference_servers_inputs_in_columns_of_its_own(  # type: ignore[no-untyped-def]
    make_exporter, metric: str, threshold: str, value_column: str, value: str, replicas: str
) -> None:
    from keda_gpu_scaler.demo.engines import EngineLoad, vllm_page

    server = await make_exporter(vllm_page("llama", [EngineLoad(12, 30, 0.5)]))
    code, out, err = await run_cli(
        "explain",
        "--inference-url",
        f"llm/chat-0={server.url}",
        "--namespace",
        "llm",
        f"metric={metric}",
        f"threshold={threshold}",
        "podNamePrefix=chat-",
    )
    assert code == 0, out + err
    header = next(line for line in out.splitlines() if line.strip().startswith("POD"))
    assert header.split()[:5] == ["POD", "ENGINE", "RUNNING", "WAITING", "KV-CACHE%"]
    assert header.rstrip().endswith(value_column)
    assert "GPU" not in header and "HOST" not in header
    (row,) = (line for line in out.splitlines() if line.strip().startswith("chat-0"))
    assert row.split()[:5] == ["chat-0", "vllm", "12", "30", "50"]
    assert f"value = {value} (sum over 1 pod)" in out
    assert f"HPA would ask for {replicas} metricType AverageValue" in out


async def test_explain_shows_each_trigger_of_a_scaledobject_from_one_scrape(make_exporter) -> None:  # type: ignore[no-untyped-def]
    from keda_gpu_scaler.demo.engines import EngineLoad, vllm_page

    server = await make_exporter(vllm_page("llama", [EngineLoad(12, 30, 0.5)]))
    common = ["--inference-url", f"llm/chat-0={server.url}", "--namespace", "llm", "--name", "chat"]
    requests = ["metric=requests", "threshold=16", "podNamePrefix=chat-"]
    kv_cache = ["metric=kv_cache", "threshold=80", "podNamePrefix=chat-"]
    code, out, err = await run_cli("explain", *common, *requests, "--trigger", *kv_cache, "--json")
    assert code == 0, out + err
    shown = json.loads(out)
    assert (shown["namespace"], shown["scaledObject"]) == ("llm", "chat")
    assert [(t["trigger"]["metric"], t["value"]) for t in shown["triggers"]] == [
        ("requests", 42),
        ("kv_cache", 50),
    ]
    code, out, _ = await run_cli("explain", *common, *requests, "--trigger", *kv_cache, "--trigger", "x=1")
    assert code == 1
    assert "metric=requests threshold=16" in out and "metric=kv_cache threshold=80" in out
    assert "'x'" in out  # the third trigger's own error, beside the two tables


async def test_explain_without_a_page_to_read_names_the_flags() -> None:
    code, _, err = await run_cli("explain", "--namespace", "llm", "threshold=70", "podNamePrefix=a-")
    assert code == 2 and "--inference-url" in err


async def test_explain_shows_each_endpoint_picker_replica(make_exporter) -> None:  # type: ignore[no-untyped-def]
    from keda_gpu_scaler.demo.epp import Queued, epp_page

    fresh = await make_exporter(epp_page("chat-pool", {Queued("llama"): 2, Queued("other", "x"): 1}))
    dead = await make_exporter("")
    dead.status = 403
    code, out, err = await run_cli(
        "explain",
        "--gateway-url",
        f"llm/chat-pool={fresh.url}",
        "--gateway-url",
        f"llm/chat-pool={dead.url}",
        "--namespace",
        "llm",
        "metric=pending",
        "threshold=1",
        "inferencePool=chat-pool",
        "model=llama",
    )
    assert code == 0, out + err
    assert f"{fresh.url}" in out and "llama=2, other=1" in out
    assert f"{dead.url}" in out and "lower bound" in out and "403" in out
    assert "value = 3 requests held for InferencePool chat-pool" in out


async def test_explain_reads_the_pages_twice_to_show_a_rate() -> None:
    from aiohttp import web

    from keda_gpu_scaler.demo.engines import EngineLoad, EngineTotals, vllm_page

    served = 0

    async def page(_: web.Request) -> web.Response:
        # 10 more requests finished at every read, none more in flight: the rate is 10 over the span.
        nonlocal served
        served += 1
        totals = [EngineTotals(10 * served, 0, 0)]
        return web.Response(text=vllm_page("llama", [EngineLoad(2, 0, 0.1)], totals))

    app = web.Application()
    app.router.add_get("/metrics", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    try:
        common = ["explain", "--inference-url", f"llm/chat-0={url}", "--namespace", "llm"]
        trigger = ["--rate-interval", "0.3", "metric=demand", "threshold=5", "podNamePrefix=chat-"]
        code, out, err = await run_cli(*common, *trigger, "--json")
        assert code == 0, out + err
        shown = json.loads(out)
        (pod,) = shown["pods"]
        assert served == 2  # read exactly twice: no scrape loop of its own reads in between
        assert pod["inputs"]["samplesUsed"] == 2
        assert pod["value"] == pytest.approx(10 / pod["inputs"]["spanSeconds"])
        assert shown["readTwiceSecondsApart"] == 0.3
        code, out, err = await run_cli(*common, *trigger)
        assert code == 0, out + err
        assert "read twice, 0.3 s apart, for a rate" in out
    finally:
        await runner.cleanup()


async def test_explain_refuses_a_metadata_key_given_twice_naming_both_values() -> None:
    # A ScaledObject's map cannot hold a key twice: the last one must not win silently.
    code, _, err = await run_cli(
        "explain",
        "--exporter-url",
        "http://127.0.0.1:9/metrics",
        "--namespace",
        "llm",
        "podNamePrefix=vllm-",
        "threshold=10",
        "threshold=20",
    )
    assert code == 2, err
    assert "'threshold' is given twice" in err and "'10'" in err and "'20'" in err, err


@pytest.mark.parametrize("value", ["inf", "1e309", "nan", "0", "601"])
async def test_explain_refuses_a_rate_interval_that_is_not_a_finite_bounded_number(value: str) -> None:
    # inf was accepted, and explain slept for ever between a demand trigger's two reads.
    code, _, err = await run_cli(
        "explain",
        "--inference-url",
        "llm/chat-0=http://127.0.0.1:9/metrics",
        "--namespace",
        "llm",
        "--rate-interval",
        value,
        "metric=demand",
        "threshold=5",
        "podNamePrefix=chat-",
    )
    assert code == 2, err
    assert f"--rate-interval={value}" in err, err
    assert "0 < --rate-interval <= 600" in err or "a finite decimal number" in err, err


async def test_explain_refuses_a_rate_interval_longer_than_a_demand_window_before_reading() -> None:
    # Its two reads are --rate-interval apart: past the window the rate spanned more than it says.
    started = time.monotonic()
    code, out, _ = await run_cli(
        "explain", "--inference-url", "llm/chat-0=http://127.0.0.1:9/metrics", "--namespace", "llm",
        "--rate-interval", "10.5", "metric=demand", "threshold=5", "window=10", "podNamePrefix=chat-",
    )  # fmt: skip
    assert code == 1 and "--rate-interval 10.5 is longer than metadata window=10" in out, out
    assert time.monotonic() - started < 5, "it read the pages before refusing"


async def test_explain_says_activity_is_unknown_where_isactive_cannot_tell(make_exporter) -> None:  # type: ignore[no-untyped-def]
    from keda_gpu_scaler.demo.engines import EngineLoad, vllm_page

    # vllm-0 idle and fresh, vllm-1's page unreadable: IsActive answers UNAVAILABLE (SPEC §4), and the
    # table printed `active = false` there.
    idle = await make_exporter(vllm_page("llama", [EngineLoad(0, 0, 0)]))
    code, out, err = await run_cli(
        "explain",
        "--inference-url",
        f"llm/vllm-0={idle.url}",
        "--inference-url",
        "llm/vllm-1=http://127.0.0.1:9/metrics",
        "--namespace",
        "llm",
        "metric=requests",
        "podNamePrefix=vllm-",
        "threshold=10",
    )
    assert code == 0 and "(no fresh data)" in out, out + err  # the value is answered (GetMetrics)
    assert "active = false" not in out, out
    assert "active = unknown (IsActive answers UNAVAILABLE: " in out and "vllm-1" in out, out


@pytest.mark.parametrize("port", ["70000", "-1"])
async def test_demo_control_port_out_of_range_is_one_line_naming_the_flag(port: str) -> None:
    # bind() raised OverflowError: a traceback, where every other address problem is one line.
    code, _, err = await run_cli(
        "demo", "--control-port", port, "--grpc-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0"
    )
    assert code == 2 and "Traceback" not in err, err[-500:]
    assert f"--control-port={port} is out of range; allowed: 0 to 65535" in err, err


async def test_sigterm_with_a_health_watch_open_exits_at_once_and_the_watch_ends_ok() -> None:
    # A client with client-side health checking holds a Watch open: it got NOT_SERVING but never ended,
    # and the server waited the whole --shutdown-grace with nothing in flight, then cut it (UNAVAILABLE).
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    ready = re.compile(r"serving gRPC on \S+ \(port (\d+), \w+\)")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "keda_gpu_scaler", "serve", "--grpc-address", "127.0.0.1:0",
        "--http-address", "127.0.0.1:0", "--kubernetes", "off", "--exporter-url",
        "http://127.0.0.1:9/metrics", "--shutdown-grace", "8", stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        async with asyncio.timeout(20):
            while not (match := ready.search((await process.stderr.readline()).decode())):
                pass
        async with grpc.aio.insecure_channel(f"127.0.0.1:{match.group(1)}") as channel:
            request = health_pb2.HealthCheckRequest(service="readiness")
            watch = health_pb2_grpc.HealthStub(channel).Watch(request)
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
            assert await asyncio.wait_for(process.wait(), 20) == 0
            assert time.monotonic() - started < 4, "it waited out --shutdown-grace 8 with nothing in flight"
            assert await asyncio.wait_for(watch.read(), 5) is grpc.aio.EOF
            assert await watch.code() is grpc.StatusCode.OK
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
