"""Waking from zero (SPEC §7) end to end: real loopback endpoint-picker pages, real gRPC calls."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import grpc
from support import ExporterServer, eventually, latest_trigger

from keda_gpu_scaler.collect.wanted import EppPool
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

FIXTURES = Path(__file__).parent.parent / "fixtures" / "gateways"
PENDING = {"metric": "pending", "threshold": "4", "inferencePool": "chat-pool"}


def ref(metadata: dict[str, str] = PENDING, namespace: str = "llm") -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="chat", namespace=namespace, scalerMetadata=metadata)


async def value(scaler, metadata: dict[str, str] = PENDING, namespace: str = "llm") -> float:  # type: ignore[no-untyped-def]
    request = pb.GetMetricsRequest(scaledObjectRef=ref(metadata, namespace), metricName="gateway-pending")
    response = await scaler.stub.GetMetrics(request)
    assert len(response.metricValues) == 1
    return response.metricValues[0].metricValueFloat


async def error_of(call) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def urls(*servers: ExporterServer, pool: str = "chat-pool") -> tuple[tuple[str, str, str], ...]:
    return tuple(("llm", pool, server.url) for server in servers)


async def explain(scaler) -> dict:  # type: ignore[no-untyped-def,type-arg]
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{scaler.http}/explain", params={"namespace": "llm", "name": "chat"}) as r,
    ):
        return latest_trigger(json.loads(await r.text()))


async def unavailable_saying(
    scaler, *words: str, metadata: dict[str, str] = PENDING, namespace: str = "llm"
) -> str:  # type: ignore[no-untyped-def]
    async def check() -> str:
        code, message = await error_of(scaler.stub.IsActive(ref(metadata, namespace)))
        assert code is grpc.StatusCode.UNAVAILABLE, (code, message)
        for word in words:
            assert word in message, message
        return message

    return await eventually(check)


async def test_pending_is_summed_over_replicas_and_wakes_the_workload(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    a = await make_exporter(epp_page("chat-pool", {Queued("llama", "team-a"): 3, Queued("qwen"): 1}))
    b = await make_exporter(epp_page("chat-pool", {Queued("llama", "team-b", "10"): 2}))
    scaler = await make_scaler(gateway_urls=urls(a, b))
    spec = await scaler.stub.GetMetricSpec(ref())
    assert (spec.metricSpecs[0].metricName, spec.metricSpecs[0].targetSizeFloat) == ("gateway-pending", 4)

    async def six() -> None:
        assert await value(scaler) == 6

    await eventually(six)
    assert (await scaler.stub.IsActive(ref())).result is True
    assert await value(scaler, {**PENDING, "model": "llama"}) == 5


async def test_pages_are_read_only_while_a_pending_trigger_reads_their_pool(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    wanted = await make_exporter(epp_page("chat-pool", {Queued("llama"): 1}))
    other = await make_exporter(epp_page("code-pool", {Queued("coder"): 1}))
    scaler = await make_scaler(gateway_urls=(*urls(wanted), *urls(other, pool="code-pool")))

    async def one() -> None:
        assert await value(scaler) == 1

    await eventually(one)

    async def read_again_and_again() -> None:
        assert wanted.requests >= 3  # several gateway rounds since its pool became wanted

    await eventually(read_again_and_again)
    assert other.requests == 0  # no trigger reads code-pool: its picker was never fetched


async def test_stream_sends_true_when_requests_queue_and_only_on_each_transition(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    epp = await make_exporter(epp_page("chat-pool", {}))
    scaler = await make_scaler(gateway_urls=urls(epp))

    async def inactive() -> None:
        assert (await scaler.stub.IsActive(ref())).result is False

    await eventually(inactive)
    stream = scaler.stub.StreamIsActive(ref())
    received: list[bool] = []

    async def read() -> None:
        async for response in stream:
            received.append(response.result)

    reader = asyncio.ensure_future(read())
    try:
        epp.page = epp_page("chat-pool", {Queued("llama"): 2})

        async def woken() -> None:
            assert received == [True]

        await eventually(woken)
        epp.page = epp_page("chat-pool", {Queued("llama"): 5})
        await eventually(lambda: _value_is(scaler, 5))
        assert received == [True]  # still active: no second true
        epp.page = epp_page("chat-pool", {Queued("llama"): 0})
        await eventually(inactive)
        epp.page = epp_page("chat-pool", {Queued("llama"): 1})

        async def woken_again() -> None:
            assert received == [True, True]

        await eventually(woken_again)
    finally:
        stream.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def _value_is(scaler, expected: float) -> None:  # type: ignore[no-untyped-def]
    assert await value(scaler) == expected


async def test_a_failing_replica_leaves_a_lower_bound_or_unavailable_never_zero(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    good = await make_exporter(epp_page("chat-pool", {Queued("llama"): 3}))
    bad = await make_exporter(epp_page("chat-pool", {Queued("llama"): 9}))
    bad.status = 500
    scaler = await make_scaler(gateway_urls=urls(good, bad))

    async def lower_bound() -> None:
        assert await value(scaler) == 3

    await eventually(lower_bound)
    assert (await scaler.stub.IsActive(ref())).result is True
    entry = await explain(scaler)
    assert any("lower bound" in note for note in entry["notes"]), entry
    fresh = {r["replica"]: r["fresh"] for r in entry["gatewayReplicas"]}
    assert fresh == {good.url: True, bad.url: False}
    good.page = epp_page("chat-pool", {Queued("llama"): 0})
    message = await unavailable_saying(scaler, "cannot be read", "500")
    assert "chat-pool" in message


async def test_a_lower_bound_at_or_below_the_activation_threshold_is_the_value_and_activity_is_unknown(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    """SPEC §7: GetMetrics returns the fresh replicas' sum when above 0 (a lower bound); at or below
    activationThreshold the unread replica may hold what would wake the workload: IsActive is UNAVAILABLE,
    never false, and /explain says both."""
    from keda_gpu_scaler.explain import render_table

    good = await make_exporter(epp_page("chat-pool", {Queued("llama"): 2}))
    bad = await make_exporter(epp_page("chat-pool", {Queued("llama"): 9}))
    bad.status = 500
    metadata = {**PENDING, "activationThreshold": "5"}
    scaler = await make_scaler(gateway_urls=urls(good, bad))

    async def lower_bound() -> None:
        assert await value(scaler, metadata) == 2

    await eventually(lower_bound)
    message = await unavailable_saying(scaler, "not above activationThreshold 5", "500", metadata=metadata)
    assert "chat-pool" in message
    entry = await explain(scaler)
    assert entry["value"] == 2 and "not above activationThreshold" in entry["activityUnknown"], entry
    assert entry["active"] is None, entry  # as IsActive answers: never the false it was computed as
    assert any(note.startswith("value is a lower bound") for note in entry["notes"]), entry
    assert "active = unknown (IsActive answers UNAVAILABLE" in render_table(entry)
    async with aiohttp.ClientSession() as session, session.get(f"{scaler.http}/metrics") as response:
        page = await response.text()
    (active,) = [line for line in page.splitlines() if line.startswith("keda_gpu_scaler_trigger_active{")]
    assert active.endswith(" NaN"), active


async def test_every_replica_failing_is_unavailable_naming_the_pool(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    bad = await make_exporter(epp_page("chat-pool", {}))
    bad.status = 503
    scaler = await make_scaler(gateway_urls=urls(bad))
    await unavailable_saying(scaler, "InferencePool llm/chat-pool", "503")


async def test_a_replica_answering_within_the_scrape_timeout_is_never_stale(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    """Each page is stamped when its answer arrives, and the next scrape starts an interval later: a
    replica answering in 2.6 s of the default 3 s timeout sends a page every 3.6 s, past the 3 intervals
    its data were stale after, and the trigger flapped UNAVAILABLE though every scrape succeeded."""
    epp = await make_exporter(epp_page("chat-pool", {Queued("llama"): 8}))
    # The defaults' ratio at half their scale: interval 0.5 s, timeout 1.5 s; answers take 1.3 s.
    epp.delay = 1.3
    scaler = await make_scaler(gateway_urls=urls(epp), gateway_interval=0.5, scrape_timeout=1.5)
    request = pb.GetMetricsRequest(scaledObjectRef=ref(), metricName="gateway-pending")
    first = await eventually(lambda: scaler.stub.GetMetrics(request), timeout=15)
    assert first.metricValues[0].metricValueFloat == 8
    failed, calls, reasons = 0, 0, set()
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        calls += 1
        code, message = await error_of(scaler.stub.GetMetrics(request))
        if code is not grpc.StatusCode.OK:
            failed += 1
            reasons.add(message[:160])
        await asyncio.sleep(0.05)
    assert scaler.app.store.source(epp.url).last_error is None  # every scrape succeeded
    assert failed == 0, f"{failed} of {calls} calls failed: {reasons}"


async def test_flow_control_off_is_unavailable_telling_to_enable_it(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    epp = await make_exporter((FIXTURES / "llm_d_epp_flow_control_off.prom").read_text())
    scaler = await make_scaler(gateway_urls=urls(epp))
    await unavailable_saying(scaler, "flowControl", "feature gate")


async def test_another_pools_idle_picker_is_unavailable_naming_it_never_an_empty_queue(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    # --gateway-url for chat-pool points at code-pool's picker (a copy-paste slip), idle with flow control
    # on: no queue series yet, its saturation names code-pool. chat-pool's own picker may hold requests.
    text = (FIXTURES / "llm_d_epp_flow_control_idle.prom").read_text().replace("chat-pool", "code-pool")
    epp = await make_exporter(text)
    scaler = await make_scaler(gateway_urls=urls(epp))
    await unavailable_saying(scaler, "code-pool", "another pool's endpoint picker")


async def test_a_page_that_is_not_an_epps_is_unavailable(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    vllm = await make_exporter(
        '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="l"} 3\n'
    )
    scaler = await make_scaler(gateway_urls=urls(vllm))
    await unavailable_saying(scaler, "no endpoint-picker (EPP) metrics on this page")


async def test_a_queue_of_the_wrong_type_is_unavailable_naming_it(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    epp = await make_exporter((FIXTURES / "llm_d_epp_queue_counter.prom").read_text())
    scaler = await make_scaler(gateway_urls=urls(epp))
    await unavailable_saying(scaler, "llm_d_epp_flow_control_queue_size is a counter")


async def test_nan_or_negative_sizes_are_unavailable_not_zero(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    epp = await make_exporter((FIXTURES / "llm_d_epp_nan.prom").read_text())
    scaler = await make_scaler(gateway_urls=urls(epp))
    await unavailable_saying(scaler, "a queue size must be a finite count")
    # The model whose series are usable still reads.
    assert await eventually(lambda: value(scaler, {**PENDING, "model": "Qwen/Qwen3-8B"})) == 2


async def test_a_pool_without_any_page_is_unavailable_naming_it(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    epp = await make_exporter(epp_page("chat-pool", {Queued("llama"): 3}))
    scaler = await make_scaler(gateway_urls=urls(epp))
    await unavailable_saying(
        scaler,
        "InferencePool llm/code-pool",
        "--gateway-url",
        metadata={**PENDING, "inferencePool": "code-pool"},
    )


async def test_a_pool_of_another_namespace_is_never_read(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    epp = await make_exporter(epp_page("chat-pool", {Queued("llama"): 3}))
    scaler = await make_scaler(gateway_urls=urls(epp))
    # A ScaledObject of namespace team-b naming the pool reads team-b/chat-pool, which has no page.
    await unavailable_saying(scaler, "InferencePool team-b/chat-pool", namespace="team-b")
    assert epp.requests == 0
    code, message = await error_of(
        scaler.stub.IsActive(ref({**PENDING, "inferencePool": "llm/chat-pool"}, "team-b"))
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "inferencePool" in message


async def test_replicas_given_after_a_problem_are_read_without_a_restart(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    epp = await make_exporter(epp_page("chat-pool", {Queued("llama"): 2}))
    scaler = await make_scaler()
    pages = scaler.app.gateway_pages
    pool = EppPool("llm", "chat-pool", 9090)
    pages.set_problem(pool, "InferencePool llm/chat-pool does not exist")
    await unavailable_saying(scaler, "InferencePool llm/chat-pool does not exist")
    assert pages.pools() == [pool]
    pages.set_replicas(pool, {"chat-pool-epp-7d9f-x": epp.url})

    async def two() -> None:
        assert await value(scaler) == 2

    await eventually(two)
    entry = await explain(scaler)
    assert [r["replica"] for r in entry["gatewayReplicas"]] == ["chat-pool-epp-7d9f-x"]


async def test_explain_shows_each_replicas_queue_by_model_and_the_other_fold(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    epp = await make_exporter(
        epp_page("chat-pool", {Queued("llama"): 2, Queued("other"): 3, Queued("qwen"): 7})
    )
    scaler = await make_scaler(gateway_urls=urls(epp))
    metadata = {**PENDING, "model": "llama"}
    assert await eventually(lambda: value(scaler, metadata)) == 5
    entry = await explain(scaler)
    (replica,) = entry["gatewayReplicas"]
    assert replica == {
        "replica": epp.url,
        "fresh": True,
        "pending": 5,
        "queueByModel": {"llama": 2, "other": 3},
        "saturationNotLoad": {"dispatch": 1},  # the simulated EPP's pool has no endpoint: never load
    }
    assert entry["inferencePool"] == "chat-pool"
    assert any("'other'" in note and "llama" in note for note in entry["notes"])
