"""Inference metrics (SPEC §6) end to end: real loopback inference-server pages, real gRPC calls."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from support import ExporterServer, eventually, tgi_page

from keda_gpu_scaler.demo.engines import EngineLoad, vllm_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

REQUESTS = {"metric": "requests", "threshold": "8", "podNamePrefix": "chat-"}


def ref(metadata: dict[str, str], name: str = "chat") -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name=name, namespace="llm", scalerMetadata=metadata)


async def value(scaler, metadata: dict[str, str], metric: str = "inference-requests") -> float:  # type: ignore[no-untyped-def]
    response = await scaler.stub.GetMetrics(
        pb.GetMetricsRequest(scaledObjectRef=ref(metadata), metricName=metric)
    )
    assert len(response.metricValues) == 1
    return response.metricValues[0].metricValueFloat


async def code_of(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    """The status a call ends with (OK when it answers): for polling until an error shows."""
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


async def pod_pages(make_exporter, *pages: str) -> list[ExporterServer]:  # type: ignore[no-untyped-def]
    return [await make_exporter(page) for page in pages]


def inference_urls(servers: list[ExporterServer], prefix: str = "chat-") -> tuple[tuple[str, str, str], ...]:
    return tuple(("llm", f"{prefix}{index}", server.url) for index, server in enumerate(servers))


async def test_requests_is_running_plus_waiting_summed_over_pods(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    servers = await pod_pages(
        make_exporter,
        vllm_page("llama", [EngineLoad(12, 8, 0.5)]),  # 20 in flight
        vllm_page("llama", [EngineLoad(6, 2, 0.3), EngineLoad(4, 2, 0.4)]),  # data-parallel: 14
        vllm_page("llama", [EngineLoad(9, 0, 0.2)]),  # 9
    )
    scaler = await make_scaler(inference_urls=inference_urls(servers))
    spec = await scaler.stub.GetMetricSpec(ref(REQUESTS))
    assert spec.metricSpecs[0].metricName == "inference-requests"
    assert spec.metricSpecs[0].targetSizeFloat == 8

    async def total() -> None:
        assert await value(scaler, REQUESTS) == 43  # → ceil(43 / 8) = 6 replicas

    await eventually(total)
    queue = {**REQUESTS, "metric": "queue", "threshold": "5"}
    assert await value(scaler, queue, "inference-queue") == 12
    kv = {**REQUESTS, "metric": "kv_cache", "threshold": "80"}
    assert await value(scaler, kv, "kv-cache") == pytest.approx(50 + 35 + 20)
    assert (await scaler.stub.IsActive(ref(REQUESTS))).result is True


async def test_a_server_whose_engine_has_not_started_is_a_missing_pod_not_a_zero(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    servers = await pod_pages(
        make_exporter,
        vllm_page("llama", [EngineLoad(4, 0, 0.1)]),
        vllm_page("llama", []),  # no vLLM family yet
    )
    scaler = await make_scaler(inference_urls=inference_urls(servers))

    async def one_missing_at_threshold() -> None:
        # 4 reported; the starting pod counts as the target (8): a gap never scales down.
        assert await value(scaler, REQUESTS) == 12

    await eventually(one_missing_at_threshold)
    servers[0].page = vllm_page("llama", [])

    async def unavailable() -> None:
        assert await code_of(value(scaler, REQUESTS)) is grpc.StatusCode.UNAVAILABLE

    await eventually(unavailable)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await value(scaler, REQUESTS)
    assert "no inference-server metrics" in (raised.value.details() or "")


async def test_an_engine_without_the_metric_is_unavailable_naming_it(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    servers = await pod_pages(make_exporter, tgi_page(EngineLoad(3, 1, 0.0)))
    scaler = await make_scaler(inference_urls=inference_urls(servers))
    kv = {**REQUESTS, "metric": "kv_cache", "threshold": "80"}

    async def unavailable_naming_the_engine() -> None:
        try:
            answer = await value(scaler, kv, "kv-cache")
        except grpc.aio.AioRpcError as error:
            assert error.code() is grpc.StatusCode.UNAVAILABLE, error
            # "no data yet" until the first page is in (then polled again); never a value in between.
            assert "tgi" in (error.details() or "").lower(), error.details()
            return
        pytest.fail(f"a value ({answer}) for a metric the engine does not export")

    await eventually(unavailable_naming_the_engine)
    # Named explicitly, the same trigger is a metadata error at once.
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await scaler.stub.GetMetricSpec(ref({**kv, "engine": "tgi"}))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_a_named_engine_on_another_engines_page_is_unavailable_naming_the_page(  # type: ignore[no-untyped-def]
    make_exporter, make_scaler
) -> None:
    servers = await pod_pages(make_exporter, vllm_page("llama", [EngineLoad(3, 1, 0.2)]))
    scaler = await make_scaler(inference_urls=inference_urls(servers))
    sglang = {**REQUESTS, "engine": "sglang"}

    async def unavailable_naming_vllm() -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await value(scaler, sglang)
        assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "the page is recognised as engine vllm" in (raised.value.details() or ""), (
            raised.value.details()
        )

    await eventually(unavailable_naming_vllm)


async def test_a_failing_inference_page_keeps_its_pod_missing(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    servers = await pod_pages(
        make_exporter,
        vllm_page("llama", [EngineLoad(2, 0, 0.1)]),
        vllm_page("llama", [EngineLoad(3, 0, 0.1)]),
    )
    scaler = await make_scaler(inference_urls=inference_urls(servers))

    async def both() -> None:
        assert await value(scaler, REQUESTS) == 5

    await eventually(both)
    servers[1].status = 503

    async def missing_counts_as_target() -> None:
        assert await value(scaler, REQUESTS) == 2 + 8

    await eventually(missing_counts_as_target)


async def test_model_filter_reads_only_that_models_series(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    servers = await pod_pages(make_exporter, vllm_page("llama", [EngineLoad(5, 1, 0.2)]))
    scaler = await make_scaler(inference_urls=inference_urls(servers))

    async def llama_only() -> None:
        assert await value(scaler, {**REQUESTS, "model": "llama"}) == 6

    await eventually(llama_only)

    assert await code_of(value(scaler, {**REQUESTS, "model": "qwen"})) is grpc.StatusCode.UNAVAILABLE


async def test_a_page_declaring_a_gauge_family_as_a_counter_is_refused_naming_it(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    page = vllm_page("llama", [EngineLoad(4, 1, 0.1)]).replace(
        "# TYPE vllm:num_requests_waiting gauge", "# TYPE vllm:num_requests_waiting counter"
    )
    servers = await pod_pages(make_exporter, page)
    scaler = await make_scaler(inference_urls=inference_urls(servers))

    async def refused() -> None:
        assert await code_of(value(scaler, REQUESTS)) is grpc.StatusCode.UNAVAILABLE
        assert any(
            "vllm:num_requests_waiting is a counter" in (s.last_error or "")
            for s in scaler.app.store.sources()
        )

    await eventually(refused)


ENGINE_PAGES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"


def fixture_page(name: str) -> str:
    return (ENGINE_PAGES / name).read_text()


async def test_underscore_sglang_llamacpp_and_trtllm_serve_pods_are_summed(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    servers = await pod_pages(
        make_exporter,
        fixture_page("sglang_router_underscore.prom"),  # 4 waiting + 26 running
        fixture_page("sglang_both_spellings.prom"),  # 2 + 9, each gauge printed twice, counted once
        fixture_page("llamacpp.prom"),  # 5 deferred + 3 processing
        fixture_page("trtllm_serve.prom"),  # 4 + 22
    )
    scaler = await make_scaler(inference_urls=inference_urls(servers))

    async def total() -> None:
        assert await value(scaler, REQUESTS) == 30 + 11 + 8 + 26

    await eventually(total)
    queue = {**REQUESTS, "metric": "queue", "threshold": "5"}
    assert await value(scaler, queue, "inference-queue") == 4 + 2 + 5 + 4


async def test_llamacpp_kv_cache_is_unavailable_under_auto_and_refused_when_named(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    servers = await pod_pages(make_exporter, fixture_page("llamacpp.prom"))
    scaler = await make_scaler(inference_urls=inference_urls(servers))
    kv = {**REQUESTS, "metric": "kv_cache", "threshold": "80"}

    async def unavailable_naming_the_family() -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await value(scaler, kv, "kv-cache")
        assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
        # Until the first page is in, "no data yet"; then the family the build does not print.
        assert "llamacpp:kv_cache_usage_ratio" in (raised.value.details() or "")

    await eventually(unavailable_naming_the_family)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await scaler.stub.GetMetricSpec(ref({**kv, "engine": "llamacpp"}))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "llamacpp" in (raised.value.details() or "") and "requests, queue" in (
        raised.value.details() or ""
    )
    # The metrics it does export work when it is named.
    assert await value(scaler, {**REQUESTS, "engine": "llamacpp"}) == 8


async def test_an_idle_pod_beside_a_broken_page_answers_its_value_but_not_whether_it_is_idle(  # type: ignore[no-untyped-def]
    make_exporter, make_scaler
) -> None:
    """SPEC §4: activity is decided on the fresh pods. Nothing in flight on the pod that answers while the
    other's page fails: the value (0 + the missing pod's 8) stands, never a scale-down, but `false` would
    let KEDA scale to zero on what it cannot see, so IsActive is UNAVAILABLE until the page is back."""
    servers = await pod_pages(
        make_exporter,
        vllm_page("llama", [EngineLoad(0, 0, 0.0)]),
        vllm_page("llama", [EngineLoad(4, 0, 0.1)]),
    )
    scaler = await make_scaler(inference_urls=inference_urls(servers))

    async def both() -> None:
        assert await value(scaler, REQUESTS) == 4

    await eventually(both)
    servers[1].status = 503

    async def activity_unknown() -> None:
        assert await value(scaler, REQUESTS) == 0 + 8
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await scaler.stub.IsActive(ref(REQUESTS))
        assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "whether the workload is idle cannot be told" in (raised.value.details() or "")

    await eventually(activity_unknown)
    servers[1].status = 200
    servers[1].page = vllm_page("llama", [EngineLoad(0, 0, 0.0)])

    async def idle() -> None:
        assert (await scaler.stub.IsActive(ref(REQUESTS))).result is False

    await eventually(idle)


async def test_without_discovery_another_prefixs_failing_page_is_not_named(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    """Without Kubernetes the prefix tells the workloads' pages apart: chat-* names its own pages' problems,
    never code-0's."""
    chat, code = await pod_pages(
        make_exporter,
        vllm_page("llama", [EngineLoad(3, 1, 0.2)]),
        vllm_page("coder", [EngineLoad(2, 0, 0.1)]),
    )
    code.status = 500
    scaler = await make_scaler(inference_urls=(("llm", "chat-0", chat.url), ("llm", "code-0", code.url)))

    async def answered() -> None:
        assert await value(scaler, REQUESTS) == 4

    await eventually(answered)
    chat.status = 500

    async def unavailable() -> None:
        assert await code_of(value(scaler, REQUESTS)) is grpc.StatusCode.UNAVAILABLE

    await eventually(unavailable)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await value(scaler, REQUESTS)
    details = raised.value.details() or ""
    assert f"chat-0: {chat.url}" in details and code.url not in details and "code-0" not in details, details


async def test_unavailable_never_names_another_workloads_failing_page(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    # code-0 and code-1 read, without the counter demand needs; chat-2, another workload's pod, still
    # loading: its failing page was named to `code`'s ScaledObject (its pages failed none).
    code0 = await make_exporter(vllm_page("qwen", [EngineLoad(2, 0, 0.1)]))
    code1 = await make_exporter(vllm_page("qwen", [EngineLoad(2, 0, 0.1)]))
    chat2 = await make_exporter(vllm_page("llama", []))
    urls = (("llm", "code-0", code0.url), ("llm", "code-1", code1.url), ("llm", "chat-2", chat2.url))
    scaler = await make_scaler(inference_urls=urls)
    demand = {"metric": "demand", "threshold": "2", "podNamePrefix": "code-"}
    ref = pb.ScaledObjectRef(name="code", namespace="llm", scalerMetadata=demand)
    await scaler.stub.GetMetricSpec(ref)

    async def unavailable() -> str:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await scaler.stub.GetMetrics(
                pb.GetMetricsRequest(scaledObjectRef=ref, metricName="inference-demand")
            )
        assert error.value.code() is grpc.StatusCode.UNAVAILABLE and "code-0" in (error.value.details() or "")
        return error.value.details() or ""

    assert "chat-2" not in await eventually(unavailable)
