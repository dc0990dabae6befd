"""Exporter faults: the process keeps serving, affected triggers get UNAVAILABLE (never 0 or false),
unaffected triggers keep their exact values."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from faults import FAULTS, OTHER_FAULTS, TENANT_PROPERTIES, Fault, FaultyExporter, reliability_markdown
from support import GpuLine, dcgm_page, eventually

from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

AFFECTED = {"podNamePrefix": "vllm-", "threshold": "70"}
UNAFFECTED = {"podNamePrefix": "other-", "threshold": "70"}
DOC = Path(__file__).resolve().parents[2] / "docs" / "RELIABILITY.md"


def request(namespace: str, metadata: dict[str, str]) -> pb.GetMetricsRequest:
    ref = pb.ScaledObjectRef(name="so", namespace=namespace, scalerMetadata=metadata)
    return pb.GetMetricsRequest(scaledObjectRef=ref, metricName="gpu-utilization")


@pytest.fixture
async def faulty() -> AsyncIterator[FaultyExporter]:
    exporter = FaultyExporter()
    await exporter.start()
    yield exporter
    await exporter.stop()


async def outcome(stub, namespace: str, metadata: dict[str, str]) -> str | float:  # type: ignore[no-untyped-def]
    try:
        response = await stub.GetMetrics(request(namespace, metadata))
    except grpc.aio.AioRpcError as error:
        if error.code() is grpc.StatusCode.UNAVAILABLE:
            return "UNAVAILABLE"
        raise
    (value,) = response.metricValues
    return value.metricValueFloat


async def is_active(stub, namespace: str, metadata: dict[str, str]) -> str | bool:  # type: ignore[no-untyped-def]
    try:
        return (
            await stub.IsActive(pb.ScaledObjectRef(name="so", namespace=namespace, scalerMetadata=metadata))
        ).result
    except grpc.aio.AioRpcError as error:
        return error.code().name


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
async def test_fault(fault: Fault, faulty: FaultyExporter, make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    healthy = await make_exporter(dcgm_page([GpuLine("team-b", "other-0", 55)], host="healthy-node"))
    scaler = await make_scaler(faulty, healthy, max_page_bytes=1024 * 1024)
    stub = scaler.stub

    async def before() -> None:
        assert await outcome(stub, "llm", AFFECTED) == 60
        assert await outcome(stub, "team-b", UNAFFECTED) == 55

    await eventually(before)
    if fault.name == "refused" or fault.name == "restart":
        port = faulty.port
        await faulty.stop()
    else:
        faulty.fault = fault.name

    async def during_for(expected: str | float) -> None:
        assert await outcome(stub, "llm", AFFECTED) == expected
        assert await outcome(stub, "team-b", UNAFFECTED) == 55
        if expected == "UNAVAILABLE":
            assert await is_active(stub, "llm", AFFECTED) == "UNAVAILABLE"

    # Every UNAVAILABLE fault must be recorded with its own reason (a fault missing here is a KeyError,
    # so no fault can pass with just any message). NaN/Inf pages are valid pages without usable values.
    reasons: dict[str, tuple[str, ...]] = {
        "huge": ("limit",),
        "truncated": ("line",),
        "slow": ("timed out",),
        "http_500": ("HTTP 500",),
        "conflicting": ("printed again with another value",),
        "gzip_bomb": ("limit of 1048576 bytes",),
        "redirect": ("/elsewhere",),
        "not_an_exporter": ("no GPU exporter metrics on this page",),
        "refused": ("Cannot connect", "Connect call failed"),
        "restart": ("Cannot connect", "Connect call failed"),
        "reset": ("disconnected", "reset", "ClientOSError", "cut short"),
        # (Bytes 0-255 over and over end without a newline: refused before their UTF-8 is looked at.)
        "garbage": ("not a valid metrics page", "does not end with a newline"),
        "gzip_cut": ("gzip body ends before its end of stream (truncated)",),
        "gzip_invalid": ("not valid gzip",),
        "many_series": ("more than 20,000 series on this page",),
    }

    async def failure_recorded() -> None:
        failures = [s.last_error for s in scaler.app.store.sources() if s.last_error]
        assert failures, "the failure must be recorded with its reason"
        assert any(any(r in f for r in reasons[fault.name]) for f in failures), failures

    if fault.name == "restart":
        await eventually(lambda: during_for("UNAVAILABLE"))
        await eventually(failure_recorded)
        await faulty.start(port)
        await eventually(lambda: during_for(60.0), timeout=90)  # failed scrapes back off: allow for it
    else:
        await eventually(lambda: during_for(fault.expected))
        if fault.expected == "UNAVAILABLE" and fault.name != "nan_inf":
            await eventually(failure_recorded)


def test_reliability_doc_matches_the_fault_table() -> None:
    assert DOC.read_text() == reliability_markdown(), "docs/RELIABILITY.md is out of date: run `make docs`"


def test_other_faults_name_tests_that_exist() -> None:
    here = Path(__file__).resolve().parent
    for _, _, tests in (*OTHER_FAULTS, *TENANT_PROPERTIES):
        module, _, names = tests.partition("::")
        # Named by file: an integration test here, or a unit test.
        path = here / module if (here / module).exists() else here.parent / "unit" / module
        source = path.read_text()
        for name in names.split(", "):
            assert f"def {name}(" in source, f"{module}::{name} does not exist"


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("gzip_cut", "gzip body ends before its end of stream (truncated)"),
        ("gzip_invalid", "not valid gzip"),
        ("many_series", "more than 20,000 series on this page"),
    ],
)
async def test_unavailable_names_the_exporter_and_what_was_wrong(  # type: ignore[no-untyped-def]
    fault: str, reason: str, faulty: FaultyExporter, make_scaler
) -> None:
    faulty.fault = fault
    scaler = await make_scaler(faulty, max_page_bytes=1024 * 1024)

    async def said() -> None:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await scaler.stub.GetMetrics(request("llm", AFFECTED))
        assert error.value.code() is grpc.StatusCode.UNAVAILABLE
        assert faulty.url in (error.value.details() or "") and reason in (error.value.details() or "")

    await eventually(said)
