"""The ExternalScaler over real gRPC on loopback, fed by real loopback exporters."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support import GpuLine, dcgm_page, eventually

from keda_gpu_scaler.demo.engines import EngineLoad, vllm_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

METADATA = {"podNamePrefix": "vllm-", "threshold": "70", "scalerAddress": "keda-gpu-scaler.keda:6000"}


def ref(
    metadata: dict[str, str] | None = None, name: str = "vllm", namespace: str = "llm"
) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name=name, namespace=namespace, scalerMetadata=metadata or METADATA)


def metrics_request(
    metadata: dict[str, str] | None = None, name: str = "gpu-utilization"
) -> pb.GetMetricsRequest:
    return pb.GetMetricsRequest(scaledObjectRef=ref(metadata), metricName=name)


def four_pods_at(util: float) -> str:
    return dcgm_page([GpuLine("llm", f"vllm-{i}", util, gpu=i) for i in range(4)])


async def value_of(scaler, metadata=None) -> float:  # type: ignore[no-untyped-def]
    response = await scaler.stub.GetMetrics(metrics_request(metadata))
    assert len(response.metricValues) == 1
    return response.metricValues[0].metricValueFloat


async def test_get_metric_spec_fills_int_and_float(make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler()
    response = await scaler.stub.GetMetricSpec(ref(METADATA | {"threshold": "70.5"}))
    assert len(response.metricSpecs) == 1
    spec = response.metricSpecs[0]
    assert (spec.metricName, spec.targetSize, spec.targetSizeFloat) == ("gpu-utilization", 71, 70.5)


async def test_get_metric_spec_needs_no_data(make_scaler) -> None:  # type: ignore[no-untyped-def]
    # No exporter at all: GetMetricSpec still answers (KEDA's fallback needs it to), GetMetrics does not.
    scaler = await make_scaler()
    assert (await scaler.stub.GetMetricSpec(ref())).metricSpecs[0].targetSizeFloat == 70
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await scaler.stub.GetMetrics(metrics_request())
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_four_pods_at_90_give_360(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    exporter = await make_exporter(four_pods_at(90))
    scaler = await make_scaler(exporter)

    async def check() -> None:
        response = await scaler.stub.GetMetrics(metrics_request(name="GPU-Utilization"))
        assert len(response.metricValues) == 1
        value = response.metricValues[0]
        assert (value.metricName, value.metricValue, value.metricValueFloat) == (
            "gpu-utilization",
            360,
            360.0,
        )

    await eventually(check)
    assert (await scaler.stub.IsActive(ref())).result is True
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{scaler.http}/explain", params={"namespace": "llm", "name": "vllm", "metric": "utilization"}
        ) as r,
    ):
        explanation = json.loads(await r.text())
    assert explanation["value"] == 360
    assert explanation["hpa"] == {
        "currentReplicas": 4,
        "readyReplicas": 4,
        "desiredReplicasAverageValue": 6,
        "desiredReplicasValue": 21,
    }
    assert [p["pod"] for p in explanation["pods"]] == ["vllm-0", "vllm-1", "vllm-2", "vllm-3"]


async def get_explain(scaler, **params: str) -> tuple[int, dict]:  # type: ignore[no-untyped-def,type-arg]
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{scaler.http}/explain", params={"namespace": "llm", "name": "vllm", **params}) as r,
    ):
        return r.status, json.loads(await r.text())


async def test_explain_shows_every_trigger_with_its_own_inputs_and_metric_selects_one(  # type: ignore[no-untyped-def]
    make_exporter, make_scaler
) -> None:
    scaler = await make_scaler(await make_exporter(four_pods_at(90)))
    memory = METADATA | {"metric": "memory", "threshold": "50"}
    busy = METADATA | {"threshold": "80", "metricName": "gpu-busy"}

    async def both_evaluated() -> None:
        assert await value_of(scaler) == 360
        response = await scaler.stub.GetMetrics(metrics_request(memory, name="gpu-memory"))
        assert response.metricValues[0].metricValueFloat == pytest.approx(4 * 100 * 40000 / 81000)

    await eventually(both_evaluated)
    status, whole = await get_explain(scaler)
    assert status == 200 and (whole["namespace"], whole["scaledObject"]) == ("llm", "vllm")
    by_name = {entry["trigger"]["metricName"]: entry for entry in whole["triggers"]}
    assert list(by_name) == ["gpu-memory", "gpu-utilization"]
    assert by_name["gpu-utilization"]["value"] == 360 and by_name["gpu-utilization"]["threshold"] == 70
    assert by_name["gpu-memory"]["threshold"] == 50
    assert by_name["gpu-memory"]["pods"][0]["gpus"][0]["value"] == pytest.approx(100 * 40000 / 81000)
    assert by_name["gpu-utilization"]["pods"][0]["gpus"][0]["value"] == 90

    status, one = await get_explain(scaler, metric="memory")
    assert status == 200 and one == by_name["gpu-memory"] | {"evaluatedAt": one["evaluatedAt"]}
    status, one = await get_explain(scaler, metric="GPU-Utilization")  # a metricName, as GetMetrics takes it
    assert status == 200 and one["trigger"]["metric"] == "utilization" and one["value"] == 360

    status, answer = await get_explain(scaler, metric="requests")
    assert status == 404 and "'requests'" in answer["error"]
    assert [(e["index"], e["metric"], e["metricName"]) for e in answer["triggers"]] == [
        (0, "memory", "gpu-memory"),
        (1, "utilization", "gpu-utilization"),
    ]

    await eventually(lambda: scaler.stub.GetMetrics(metrics_request(busy, name="gpu-busy")))
    status, answer = await get_explain(scaler, metric="utilization")
    assert status == 400 and "2 triggers have metric or metricName 'utilization'" in answer["error"]
    status, one = await get_explain(scaler, metric="gpu-busy")
    assert status == 200 and one["threshold"] == 80


async def test_value_rounded_half_up(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    exporter = await make_exporter(dcgm_page([GpuLine("llm", "vllm-0", 40.5)]))
    scaler = await make_scaler(exporter)

    async def check() -> None:
        value = (await scaler.stub.GetMetrics(metrics_request())).metricValues[0]
        assert (value.metricValue, value.metricValueFloat) == (41, 40.5)

    await eventually(check)


@pytest.mark.parametrize(
    ("value", "rounded"),
    [(0.49999999999999994, 0), (0.5, 1), (2.5, 3), (2.4999, 2), (0.0, 0), (1e15, 10**15)],
)
def test_the_int_value_is_rounded_half_up_even_where_adding_a_half_rounds_up(
    value: float, rounded: int
) -> None:
    # KEDA before 2.17 reads only this field: 0.49999999999999994 read 1.
    from keda_gpu_scaler.server.service import round_half_up

    assert round_half_up(value) == rounded


async def test_unknown_metric_name_is_not_found(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler(await make_exporter(four_pods_at(90)))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await scaler.stub.GetMetrics(metrics_request(name="gpu-memory"))
    assert raised.value.code() is grpc.StatusCode.NOT_FOUND
    assert "gpu-memory" in (raised.value.details() or "")


async def test_other_namespace_and_other_prefix_never_counted(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    page = dcgm_page(
        [
            GpuLine("llm", "vllm-0", 50, gpu=0),
            GpuLine("other", "vllm-0", 99, gpu=1),  # same pod name, another tenant
            GpuLine("llm", "trainer-0", 99, gpu=2),
            GpuLine("", "", 77, gpu=3),  # a GPU with no pod
        ]
    )
    scaler = await make_scaler(await make_exporter(page))

    async def check() -> None:
        assert await value_of(scaler) == 50

    await eventually(check)


async def test_another_tenants_pod_labels_never_move_its_gpu_into_a_workload(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    # dcgm-exporter with --kubernetes-enable-pod-labels copies each pod's own labels onto its series, before
    # its own namespace/pod: team-a labels its pod exported_namespace=llm, exported_pod=vllm-0.
    page = dcgm_page([GpuLine("llm", "vllm-0", 90, gpu=0), GpuLine("team-a", "evil-0", 0, gpu=1)])
    page = page.replace(
        'namespace="team-a"', 'exported_namespace="llm",exported_pod="vllm-0",namespace="team-a"'
    )
    scaler = await make_scaler(await make_exporter(page))

    async def check() -> None:
        assert await value_of(scaler) == 90  # vllm-0's own GPU only, never averaged with team-a's idle one

    await eventually(check)
    _, explained = await get_explain(scaler)
    shown = json.dumps(explained)
    assert "GPU-gpu-node-a-0" in shown and "GPU-gpu-node-a-1" not in shown


async def test_zero_matching_pods_is_zero_and_inactive(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler(await make_exporter(dcgm_page([GpuLine("llm", "trainer-0", 99)])))
    # Wait until the exporter has been scraped (the zero must come from fresh data, not from no data).
    await eventually(lambda: _has_page(scaler))
    assert await value_of(scaler) == 0
    assert (await scaler.stub.IsActive(ref())).result is False


async def _has_page(scaler) -> None:  # type: ignore[no-untyped-def]
    await scaler.stub.GetMetricSpec(ref())  # as KEDA does first; starts collection
    assert any(s.last_page is not None for s in scaler.app.store.sources())


@pytest.mark.parametrize("failure", ["status", "stopped"])
async def test_exporter_down_is_unavailable_never_zero(make_exporter, make_scaler, failure: str) -> None:  # type: ignore[no-untyped-def]
    exporter = await make_exporter(four_pods_at(90))
    scaler = await make_scaler(exporter)

    async def fresh() -> None:
        assert await value_of(scaler) == 360

    await eventually(fresh)
    if failure == "status":
        exporter.status = 500
    else:
        await exporter.stop()

    async def unavailable() -> None:
        for call in (scaler.stub.GetMetrics(metrics_request()), scaler.stub.IsActive(ref())):
            try:
                await call
            except grpc.aio.AioRpcError as error:
                assert error.code() is grpc.StatusCode.UNAVAILABLE
                assert "fresh" in (error.details() or "")
            else:
                raise AssertionError("answered with a value while the exporter is down")

    await eventually(unavailable)


async def test_one_dead_exporter_cannot_shrink_the_value(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    a = await make_exporter(
        dcgm_page([GpuLine("llm", "vllm-0", 30, gpu=0), GpuLine("llm", "vllm-1", 30, gpu=1)])
    )
    b = await make_exporter(dcgm_page([GpuLine("llm", "vllm-2", 30)], host="gpu-node-b"))
    scaler = await make_scaler(a, b)

    async def both() -> None:
        assert await value_of(scaler) == 90

    await eventually(both)
    b.status = 503

    async def with_missing() -> None:
        # vllm-2 is now missing; the two reporting pods (60) do not call for more than 3 replicas,
        # so it counts as the threshold (70): 130, never 60.
        assert await value_of(scaler) == 130

    await eventually(with_missing)


async def test_change_at_exporter_reaches_get_metrics(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    exporter = await make_exporter(four_pods_at(10))
    scaler = await make_scaler(exporter)

    async def at(value: float) -> None:
        assert await value_of(scaler) == value

    await eventually(lambda: at(40))
    exporter.page = four_pods_at(80)
    await eventually(lambda: at(320), timeout=5)


BAD_METADATA = [
    ({"threshold": "70", "podNamePrefix": "vllm-", "thresold": "1"}, "thresold"),
    ({"podNamePrefix": "vllm-"}, "threshold"),
    ({"threshold": "abc", "podNamePrefix": "vllm-"}, "threshold"),
    ({"threshold": "170", "podNamePrefix": "vllm-"}, "threshold"),
    ({"threshold": "0.8", "podNamePrefix": "vllm-", "metric": "kv_cache"}, 'threshold: "80"'),
    ({"threshold": "70", "podNamePrefix": "vllm-", "aggregation": "avg"}, "aggregation"),
    ({"threshold": "70"}, "podNamePrefix"),
    ({"threshold": "70", "podSelector": "app=vllm"}, "podSelector"),
    ({"threshold": "70", "podNamePrefix": "vllm-", "source": "prometheus"}, "source"),
    # Without Kubernetes the pages are --inference-url's and --gateway-url's: read by nothing, refused.
    (
        {"metric": "requests", "threshold": "8", "podNamePrefix": "vllm-", "metricsPort": "8001"},
        "metricsPort",
    ),
    ({"metric": "requests", "threshold": "8", "podNamePrefix": "vllm-", "metricsPath": "/m"}, "metricsPath"),
    (
        {"metric": "pending", "threshold": "8", "inferencePool": "p", "gatewayMetricsPort": "9443"},
        "gatewayMetricsPort=9443 needs Kubernetes",
    ),
]


@pytest.mark.parametrize(("metadata", "key"), BAD_METADATA)
async def test_bad_metadata_is_invalid_argument_on_every_rpc(make_scaler, metadata, key) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler()
    calls = [
        scaler.stub.GetMetricSpec(ref(metadata)),
        scaler.stub.GetMetrics(metrics_request(metadata)),
        scaler.stub.IsActive(ref(metadata)),
    ]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call
        assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert key in (raised.value.details() or "")
    stream = scaler.stub.StreamIsActive(ref(metadata))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stream.read()
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_stream_pushes_true_once_per_activation(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    exporter = await make_exporter(four_pods_at(0))
    scaler = await make_scaler(exporter)
    await eventually(lambda: _has_page(scaler))
    stream = scaler.stub.StreamIsActive(ref(METADATA | {"activationThreshold": "5"}))
    received: list[bool] = []

    async def reader() -> None:
        async for message in stream:
            received.append(message.result)

    task = asyncio.create_task(reader())
    pushes = scaler.app.telemetry.stream_pushes

    async def scrapes_after(count: int) -> int:
        start = exporter.requests

        async def check() -> int:
            assert exporter.requests >= start + count
            return exporter.requests

        return await eventually(check)

    await scrapes_after(3)  # inactive for several collections: nothing sent
    assert received == []
    exporter.page = four_pods_at(50)

    async def one_true() -> None:
        assert received == [True]

    await eventually(one_true)
    await scrapes_after(4)  # stays active: no repeat (each true restarts KEDA's cooldown)
    assert received == [True]
    exporter.page = four_pods_at(0)
    await eventually(lambda: _inactive(scaler))
    await scrapes_after(2)
    exporter.page = four_pods_at(60)

    async def two_trues() -> None:
        assert received == [True, True]

    await eventually(two_trues)
    assert pushes._value.get() == 2
    scaler.app.service.close_streams()
    await asyncio.wait_for(task, 5)  # the stream ended without error
    assert await stream.code() is grpc.StatusCode.OK


async def _inactive(scaler) -> None:  # type: ignore[no-untyped-def]
    assert (await scaler.stub.IsActive(ref(METADATA | {"activationThreshold": "5"}))).result is False


async def test_stream_opened_on_active_workload_sends_true_at_once(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler(await make_exporter(four_pods_at(50)))
    await eventually(lambda: _has_page(scaler))
    stream = scaler.stub.StreamIsActive(ref())
    first = await asyncio.wait_for(stream.read(), 5)
    assert first.result is True
    stream.cancel()


async def test_shutdown_health_not_serving_and_streams_end_ok(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler(await make_exporter(four_pods_at(50)))
    health = health_pb2_grpc.HealthStub(scaler.channel)
    for service in ("", "liveness", "readiness", "externalscaler.ExternalScaler"):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    await eventually(lambda: _has_page(scaler))
    stream = scaler.stub.StreamIsActive(ref())
    assert (await asyncio.wait_for(stream.read(), 5)).result is True
    watch = health.Watch(health_pb2.HealthCheckRequest(service="readiness"))
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
    stopping = asyncio.create_task(scaler.app.stop())
    assert (await asyncio.wait_for(watch.read(), 5)).status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert await asyncio.wait_for(stream.read(), 5) is grpc.aio.EOF
    assert await stream.code() is grpc.StatusCode.OK
    await asyncio.wait_for(stopping, 10)


async def test_metrics_endpoint(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler(await make_exporter(four_pods_at(90)))
    await eventually(lambda: value_of(scaler))
    with pytest.raises(grpc.aio.AioRpcError):
        await scaler.stub.GetMetrics(metrics_request(name="nope"))
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{scaler.http}/metrics") as r:
            text = await r.text()
        async with session.get(f"{scaler.http}/readyz") as r:
            assert r.status == 200
    assert 'keda_gpu_scaler_rpc_requests_total{code="OK",method="GetMetrics"}' in text
    assert 'keda_gpu_scaler_rpc_requests_total{code="NOT_FOUND",method="GetMetrics"}' in text
    assert (
        'keda_gpu_scaler_trigger_value{metric="gpu-utilization",namespace="llm",scaledobject="vllm"} 360.0'
        in text
    )
    assert "keda_gpu_scaler_rpc_duration_seconds_bucket" in text
    assert "keda_gpu_scaler_open_streams 0.0" in text
    assert 'keda_gpu_scaler_scrapes_total{result="ok"}' in text


async def test_no_scraping_without_interest(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    exporter = await make_exporter(four_pods_at(90))
    scaler = await make_scaler(exporter)
    # Nothing has asked for data: a few intervals pass and the exporter is never fetched.
    store = scaler.app.store
    await asyncio.wait_for(store.wait_for_change("llm", store.version("llm"), 0.6), 2)
    assert exporter.requests == 0
    await eventually(lambda: value_of(scaler))
    assert exporter.requests >= 1


async def test_stream_limit_is_resource_exhausted(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler(await make_exporter(four_pods_at(0)), max_streams=2)
    streams = [scaler.stub.StreamIsActive(ref()) for _ in range(2)]

    async def two_open() -> None:
        assert scaler.app.telemetry.open_streams._value.get() == 2

    await eventually(two_open)
    third = scaler.stub.StreamIsActive(ref())
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await third.read()
    assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-streams" in (raised.value.details() or "")
    streams[0].cancel()

    async def one_open() -> None:
        assert scaler.app.telemetry.open_streams._value.get() == 1

    await eventually(one_open)
    fourth = scaler.stub.StreamIsActive(ref())
    await eventually(two_open)
    for stream in (streams[1], fourth):
        stream.cancel()


async def test_unchanged_page_is_not_parsed_again_but_stays_fresh(
    make_exporter, make_scaler, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from keda_gpu_scaler.collect import scrape

    parsed: list[int] = []
    real_parse = scrape.parse_exposition

    def counting_parse(page, names=None):  # type: ignore[no-untyped-def]
        parsed.append(1)
        return real_parse(page, names)

    monkeypatch.setattr(scrape, "parse_exposition", counting_parse)
    exporter = await make_exporter(four_pods_at(50))
    scaler = await make_scaler(exporter)

    async def value_is(expected: float) -> None:
        assert await value_of(scaler) == expected

    await eventually(lambda: value_is(200))
    parses, scrapes = len(parsed), exporter.requests

    async def several_scrapes_later() -> None:
        assert exporter.requests >= scrapes + 5  # well past max staleness (3 intervals)
        assert await value_of(scaler) == 200  # still fresh: the unchanged page's age was renewed

    await eventually(several_scrapes_later)
    assert len(parsed) == parses
    exporter.page = four_pods_at(70)
    await eventually(lambda: value_is(280))
    assert len(parsed) > parses


async def test_an_exporter_failing_since_start_is_not_read_as_zero_pods(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    # The namespace's only exporter answers 500 from the start; another exporter is fresh but names no pod
    # of it. Zero pods cannot be told from an outage: UNAVAILABLE, never 0 / false.
    broken = await make_exporter(four_pods_at(90))
    broken.status = 500
    other = await make_exporter(dcgm_page([GpuLine("other", "train-0", 50)]))
    scaler = await make_scaler(broken, other)
    await scaler.stub.GetMetricSpec(ref())

    async def other_is_read() -> None:
        assert scaler.app.store.view("other", 0, 1e9).readings

    await eventually(other_is_read)
    for call in (scaler.stub.GetMetrics(metrics_request()), scaler.stub.IsActive(ref())):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call
        assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
    broken.status = 200  # it recovers: the real value, not an invented one

    async def recovered() -> None:
        assert await value_of(scaler) == 360

    await eventually(recovered)


async def test_a_namespace_filling_the_cap_leaves_room_for_another_and_is_refused_beyond_its_share(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    # 5,000 ScaledObjects of one namespace, each polled every 30 s, once locked every other namespace out.
    exporter = await make_exporter(four_pods_at(90))
    scaler = await make_scaler(exporter, max_scaledobjects=2)
    await scaler.stub.GetMetricSpec(ref(name="one"))
    await scaler.stub.GetMetricSpec(ref(name="two"))
    # Another namespace's first ScaledObject is served: llm's least recently called gives way.
    await scaler.stub.GetMetricSpec(ref(name="new", namespace="other"))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await scaler.stub.GetMetricSpec(ref(name="one"))
    assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert raised.value.details() == (
        "namespace llm follows 1 ScaledObjects, at or above its fair share of 1 (the --max-scaledobjects"
        " limit of 2 shared by 2 namespaces); room is made when a ScaledObject has not been called for 60s"
    )
    await scaler.stub.GetMetricSpec(ref(name="two"))  # the followed ones are still served
    await scaler.stub.GetMetricSpec(ref(name="new", namespace="other"))


@pytest.mark.parametrize(("namespace", "name"), [("LLM", "vllm"), ("llm", "x" * 300), ("", "vllm")])
async def test_impossible_names_are_invalid_argument(make_scaler, namespace: str, name: str) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await scaler.stub.GetMetricSpec(ref(name=name, namespace=namespace))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert len(raised.value.details() or "") < 400
    assert len(scaler.app.registry) == 0


async def test_forgotten_scaledobjects_leave_no_series_behind(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    exporter = await make_exporter(four_pods_at(90))
    scaler = await make_scaler(exporter, interest_ttl=0.5)
    for index in range(20):

        async def answered(i: int = index) -> None:
            assert await value_of_named(scaler, f"so-{i}") == 360

        await eventually(answered)
    async with aiohttp.ClientSession() as session:

        async def series() -> int:
            async with session.get(f"{scaler.http}/metrics") as response:
                return (await response.text()).count('scaledobject="so-')

        assert await series() > 0

        async def all_gone() -> None:
            assert await series() == 0
            assert len(scaler.app.registry) == 0

        await eventually(all_gone)


async def value_of_named(scaler, name: str) -> float:  # type: ignore[no-untyped-def]
    response = await scaler.stub.GetMetrics(
        pb.GetMetricsRequest(scaledObjectRef=ref(name=name), metricName="gpu-utilization")
    )
    return response.metricValues[0].metricValueFloat


@pytest.mark.parametrize("method", ["GetMetricSpec", "GetMetrics", "IsActive", "StreamIsActive"])
async def test_bytes_that_are_not_the_request_message_are_invalid_argument(make_scaler, method: str) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler()
    path = f"/externalscaler.ExternalScaler/{method}"
    garbage = b"\xff\xff\xff\xff\x0f"  # a field tag that no protobuf parser accepts
    call = (
        scaler.channel.unary_stream(path)(garbage)
        if method == "StreamIsActive"
        else scaler.channel.unary_unary(path)(garbage)
    )
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        if method == "StreamIsActive":
            async for _ in call:
                pass
        else:
            await call
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid externalscaler." in (raised.value.details() or "")


async def test_metrics_series_stay_bounded_when_one_scaledobject_sends_ever_new_metric_names(  # type: ignore[no-untyped-def]
    make_exporter, make_scaler
) -> None:
    from keda_gpu_scaler.server.registry import MAX_TRIGGERS_PER_SCALEDOBJECT

    exporter = await make_exporter(four_pods_at(90))
    scaler = await make_scaler(exporter)
    await eventually(lambda: value_of(scaler))
    for i in range(MAX_TRIGGERS_PER_SCALEDOBJECT * 4):
        metadata = dict(METADATA, metricName=f"gpu-util-{i}")
        await scaler.stub.GetMetrics(metrics_request(metadata, name=f"gpu-util-{i}"))
    async with aiohttp.ClientSession() as session, session.get(f"{scaler.http}/metrics") as response:
        page = await response.text()
    series = [line for line in page.splitlines() if line.startswith("keda_gpu_scaler_trigger_value{")]
    assert 0 < len(series) <= MAX_TRIGGERS_PER_SCALEDOBJECT
    newest = f"gpu-util-{MAX_TRIGGERS_PER_SCALEDOBJECT * 4 - 1}"
    assert any(newest in line for line in series)


async def test_concurrent_scrapes_of_metrics_share_one_render(make_scaler, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Each render runs on a thread competing with the event loop for the interpreter: scrapes arriving
    while one renders get that render's page, so a crowd of scrapers cannot hold gRPC answers up."""
    from keda_gpu_scaler.server import http_endpoints

    rendering, most = [0], [0]
    real = http_endpoints.generate_latest

    def counted(registry):  # type: ignore[no-untyped-def]
        rendering[0] += 1
        most[0] = max(most[0], rendering[0])
        time.sleep(0.2)
        rendering[0] -= 1
        return real(registry)

    monkeypatch.setattr(http_endpoints, "generate_latest", counted)
    scaler = await make_scaler()
    async with aiohttp.ClientSession() as session:

        async def scrape() -> bytes:
            async with session.get(f"{scaler.http}/metrics") as response:
                assert response.status == 200
                return await response.read()

        pages = await asyncio.gather(*(scrape() for _ in range(8)))
    assert most[0] == 1 and len(set(pages)) == 1


# The page serves "Llama"; the trigger asks for "llama": differs only by case, INVALID_ARGUMENT.
CASE_META = {"metric": "requests", "threshold": "8", "podNamePrefix": "chat-", "model": "llama"}


def case_ref() -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="chat", namespace="llm", scalerMetadata=CASE_META)


async def test_a_stream_whose_trigger_the_data_shows_wrong_ends_invalid_argument_as_is_active_answers(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    server = await make_exporter(vllm_page("Llama", [EngineLoad(12, 8, 0.5)]))
    scaler = await make_scaler(inference_urls=(("llm", "chat-0", server.url),))

    async def unary_is_invalid_argument() -> None:
        try:
            await scaler.stub.IsActive(case_ref())
        except grpc.aio.AioRpcError as error:
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error
            return
        raise AssertionError("IsActive answered")

    await eventually(unary_is_invalid_argument)
    stream = scaler.stub.StreamIsActive(case_ref())
    try:
        async for _ in stream:
            pass
    except grpc.aio.AioRpcError:
        pass
    code = await asyncio.wait_for(stream.code(), 5)
    assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, await stream.details())


async def test_explain_naming_only_a_namespace_lists_that_namespace_only(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    exporter = await make_exporter(
        dcgm_page([GpuLine("llm", "vllm-0", 50), GpuLine("team-b", "secret-0", 40, gpu=1)])
    )
    scaler = await make_scaler(exporter)
    for namespace, name, prefix in (("llm", "vllm", "vllm-"), ("team-b", "secret-project", "secret-")):
        request = pb.GetMetricsRequest(
            scaledObjectRef=pb.ScaledObjectRef(
                name=name, namespace=namespace, scalerMetadata={"podNamePrefix": prefix, "threshold": "70"}
            ),
            metricName="gpu-utilization",
        )

        async def answered(r: pb.GetMetricsRequest = request) -> None:
            try:
                await scaler.stub.GetMetrics(r)
            except grpc.aio.AioRpcError as error:
                raise AssertionError(error.details()) from None

        await eventually(answered)
    async with aiohttp.ClientSession() as session:

        async def explained(params: dict[str, str]) -> dict:  # type: ignore[type-arg]
            async with session.get(f"{scaler.http}/explain", params=params) as response:
                assert response.status == 400
                return await response.json()  # type: ignore[no-any-return]

        body = await explained({"namespace": "llm"})
        assert {entry["namespace"] for entry in body["known"]} <= {"llm"}, body["known"]
        # Only a bare /explain lists every namespace's: a request naming none lists none.
        for params in ({"name": "vllm"}, {"namespace": "", "name": "vllm"}):
            assert (await explained(params))["known"] == [], params
        # An unknown parameter is named, whatever else is missing (it listed every namespace's before).
        body = await explained({"namespace": "llm", "nmae": "vllm"})
        assert "'nmae' is not a parameter of /explain" in body["error"] and "known" not in body, body
        assert {entry["namespace"] for entry in (await explained({}))["known"]} == {"llm", "team-b"}


async def test_a_forgotten_trigger_sharing_a_metric_name_leaves_the_series_to_the_one_still_followed(  # type: ignore[no-untyped-def]
    make_exporter, make_scaler
) -> None:
    """Two triggers of one ScaledObject may share a metric name (KEDA tells them apart as s0-/s1-), so
    they share one /metrics series: once one is forgotten, the series shows the other's value again."""
    exporter = await make_exporter(
        dcgm_page([GpuLine("llm", "vllm-0", 90.0, gpu=0), GpuLine("llm", "vllm-0", 10.0, gpu=1)])
    )
    scaler = await make_scaler(exporter, interest_ttl=1.0)
    mean, peak = dict(METADATA, gpuAggregation="mean"), dict(METADATA, gpuAggregation="max")
    await eventually(lambda: value_of(scaler, mean))
    assert await value_of(scaler, mean) == 50.0
    assert await value_of(scaler, peak) == 90.0  # the last published under the shared labels
    followed = scaler.app.registry.get("llm", "vllm")

    async def only_the_mean_trigger_is_followed() -> None:
        assert await value_of(scaler, mean) == 50.0  # KEDA calls only this one now
        assert len(followed.triggers) == 1

    await eventually(only_the_mean_trigger_is_followed, timeout=10)
    async with aiohttp.ClientSession() as session, session.get(f"{scaler.http}/metrics") as response:
        page = await response.text()
    assert (
        'keda_gpu_scaler_trigger_value{metric="gpu-utilization",namespace="llm",scaledobject="vllm"} 50.0'
        in page
    )


async def test_a_forgotten_triggers_value_leaves_a_shared_series_the_other_cannot_fill(  # type: ignore[no-untyped-def]
    make_exporter, make_scaler
) -> None:
    """The trigger still followed has no value (its exporter fails): the forgotten one's value goes all
    the same, never shown as the shared series' value."""
    first = await make_exporter(dcgm_page([GpuLine("llm", "a-0", 20.0)], host="node-a"))
    second = await make_exporter(dcgm_page([GpuLine("llm", "b-0", 77.0)], host="node-b"))
    scaler = await make_scaler(first, second, interest_ttl=1.0)
    a, b = dict(METADATA, podNamePrefix="a-"), dict(METADATA, podNamePrefix="b-")
    assert await eventually(lambda: value_of(scaler, a)) == 20.0
    assert await value_of(scaler, b) == 77.0  # the last published under the shared labels
    first.status = 500
    followed = scaler.app.registry.get("llm", "vllm")

    async def only_a_failing_trigger_is_followed() -> None:
        try:
            await value_of(scaler, a)  # KEDA calls only this one now
        except grpc.aio.AioRpcError as error:
            assert error.code() is grpc.StatusCode.UNAVAILABLE
        else:
            raise AssertionError("the failing exporter still answers")
        assert len(followed.triggers) == 1

    await eventually(only_a_failing_trigger_is_followed, timeout=10)
    async with aiohttp.ClientSession() as session, session.get(f"{scaler.http}/metrics") as response:
        page = await response.text()
    shown = [line for line in page.splitlines() if line.startswith("keda_gpu_scaler_trigger_value{")]
    assert not any(line.endswith(" 77.0") for line in shown), shown


async def test_metrics_show_nan_not_the_last_answer_once_the_trigger_is_unavailable(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    """SPEC §4: missing data is never 0 or `false`. An evaluation that failed outright (the only
    exporter answering 500: IsActive UNAVAILABLE) left /metrics at the last answer: inactive, value 0."""
    exporter = await make_exporter(dcgm_page([GpuLine("llm", "vllm-0", 0)]))
    scaler = await make_scaler(exporter)

    async def series() -> dict[str, str]:
        async with aiohttp.ClientSession() as session, session.get(f"{scaler.http}/metrics") as response:
            page = await response.text()
        names = ("trigger_active", "trigger_value")
        return {
            n: line.rsplit(" ", 1)[1]
            for line in page.splitlines()
            for n in names
            if line.startswith(f"keda_gpu_scaler_{n}{{")
        }

    async def inactive() -> None:
        assert (await scaler.stub.IsActive(ref())).result is False

    await eventually(inactive)
    assert await series() == {"trigger_active": "0.0", "trigger_value": "0.0"}
    exporter.status = 500

    async def unavailable() -> None:
        try:
            answer = await scaler.stub.IsActive(ref())
        except grpc.aio.AioRpcError as error:
            assert error.code() is grpc.StatusCode.UNAVAILABLE
        else:
            raise AssertionError(f"IsActive still answers {answer.result}")

    await eventually(unavailable)
    assert await series() == {"trigger_active": "NaN", "trigger_value": "NaN"}


async def test_a_stream_of_a_scaledobject_the_fair_share_forgot_ends_and_frees_its_place(make_scaler) -> None:  # type: ignore[no-untyped-def]
    # Namespace busy fills --max-scaledobjects, each ScaledObject with its StreamIsActive; team-b comes and
    # one of busy's gives way. Its stream kept its --max-streams place for a ScaledObject no longer
    # collected, and team-b's push wake was refused RESOURCE_EXHAUSTED for as long as it stayed open.
    # A scrape interval (the streams' recheck) longer than the test waits: the stream must be woken.
    scaler = await make_scaler(max_scaledobjects=2, max_streams=2, scrape_interval=30.0, max_staleness=90.0)
    busy = {name: scaler.stub.StreamIsActive(ref(name=name, namespace="busy")) for name in ("one", "two")}

    async def open_streams(count: int) -> None:
        assert scaler.app.service.open_streams == count

    await eventually(lambda: open_streams(2))
    await scaler.stub.GetMetricSpec(ref(name="wake", namespace="team-b"))
    (evicted,) = [name for name in busy if scaler.app.registry.get("busy", name) is None]
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await asyncio.wait_for(busy[evicted].read(), 5)  # its recheck is 30 s
    assert ended.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    await eventually(lambda: open_streams(1))
    wake = scaler.stub.StreamIsActive(ref(name="wake", namespace="team-b"))
    try:
        await eventually(lambda: open_streams(2))  # opened, not refused
    finally:
        wake.cancel()
        for stream in busy.values():
            stream.cancel()


async def test_at_max_streams_a_namespace_below_its_share_takes_a_place_from_the_one_holding_most(
    make_scaler,
) -> None:  # type: ignore[no-untyped-def]
    # KEDA opens a StreamIsActive per external-push trigger: busy's one ScaledObject with four such
    # triggers held every --max-streams place, and team-b's push wake was refused RESOURCE_EXHAUSTED.
    scaler = await make_scaler(max_scaledobjects=10, max_streams=4)
    busy = [scaler.stub.StreamIsActive(ref(name="one", namespace="busy")) for _ in range(4)]
    endings = [asyncio.ensure_future(_end_of(stream)) for stream in busy]

    async def open_streams(count: int) -> None:
        assert scaler.app.service.open_streams == count

    async def ended(count: int) -> list[grpc.aio.AioRpcError]:
        done = [ending.result() for ending in endings if ending.done()]
        assert len(done) == count, done
        return done

    await eventually(lambda: open_streams(4))
    wake = scaler.stub.StreamIsActive(ref(name="wake", namespace="team-b"))
    second = None
    try:
        # One of busy's ends RESOURCE_EXHAUSTED naming the share; team-b's stays open.
        (first,) = await eventually(lambda: ended(1), timeout=15)
        assert first.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "fair share of --max-streams" in (first.details() or "")
        await eventually(lambda: open_streams(4))
        assert not wake.done()
        # busy, holding 3 of a share of 2, gets no more: its next stream is refused and none ends.
        refused_call = scaler.stub.StreamIsActive(ref(name="one", namespace="busy"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await refused_call.read()
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "at or above its fair share of 2" in (refused.value.details() or "")
        # team-b, below its share, takes a second place from busy.
        second = scaler.stub.StreamIsActive(ref(name="wake", namespace="team-b"))
        await eventually(lambda: ended(2), timeout=15)
        assert not second.done() and not wake.done()
    finally:
        for call in (wake, second, *busy):
            if call is not None:
                call.cancel()


async def _end_of(stream) -> grpc.aio.AioRpcError:  # type: ignore[no-untyped-def]
    """The error that ends `stream` (read until it ends)."""
    try:
        while await stream.read() is not grpc.aio.EOF:
            pass
    except grpc.aio.AioRpcError as error:
        return error
    raise AssertionError("the stream ended OK")


async def test_a_stream_whose_place_was_taken_ends_at_once_not_at_its_next_round(make_scaler) -> None:  # type: ignore[no-untyped-def]
    # Ended only at its next round (one --scrape-interval, up to 300 s), the victim stayed open beyond
    # --max-streams while the count said the limit held.
    scaler = await make_scaler(max_streams=2, scrape_interval=30.0, max_staleness=90.0)
    busy = [scaler.stub.StreamIsActive(ref(name="one", namespace="busy")) for _ in range(2)]

    async def open_streams(count: int) -> None:
        assert scaler.app.service.open_streams == count

    await eventually(lambda: open_streams(2))
    wake = scaler.stub.StreamIsActive(ref(name="wake", namespace="team-b"))
    try:
        reads = [asyncio.ensure_future(_end_of(stream)) for stream in busy]
        done, _ = await asyncio.wait(reads, timeout=10.0, return_when=asyncio.FIRST_COMPLETED)
        assert done, "no stream of busy ended within 10 s (the scrape interval is 30 s)"
        assert next(iter(done)).result().code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        for call in (wake, *busy):
            call.cancel()


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code


class _Context:
    """The servicer context as grpc.aio hands it to a handler: abort raises, as grpc's does."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Aborted(code, details)


async def test_a_stream_whose_place_is_taken_while_its_message_is_sent_ends_at_once(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    # grpc.aio awaits the send after each `yield`, and other calls run meanwhile: a place taken then found
    # no waiter to wake, and the stream ended at its next recheck (--scrape-interval, 30 s here).
    exporter = await make_exporter(dcgm_page([GpuLine("llm", "vllm-0", 90)]))
    scaler = await make_scaler(exporter, max_streams=2, scrape_interval=30.0, max_staleness=90.0)

    async def active() -> None:
        assert (await scaler.stub.IsActive(ref())).result is True

    await eventually(active)
    other = scaler.stub.StreamIsActive(ref(name="other"))
    assert (await other.read()).result is True
    # The newest stream of the namespace holding the most, held at its yield as while grpc sends it.
    victim = scaler.app.service.StreamIsActive(ref(), _Context())
    assert (await victim.__anext__()).result is True
    wake = scaler.stub.StreamIsActive(ref(name="wake", namespace="team-b"))
    try:

        async def place_taken() -> None:
            assert scaler.app.registry.get("team-b", "wake") is not None
            assert scaler.app.service.open_streams == 2

        await eventually(place_taken)
        with pytest.raises(_Aborted) as ended:
            await asyncio.wait_for(victim.__anext__(), 5)
        assert ended.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert not wake.done() and not other.done()
    finally:
        wake.cancel()
        other.cancel()
        await victim.aclose()
