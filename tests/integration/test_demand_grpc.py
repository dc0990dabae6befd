"""`metric: demand` (SPEC §6) end to end: loopback vLLM pages whose counters move, real gRPC calls.

The scaler runs on a clock the test sets: each page is read at a known instant, so rates are exact. The
test changes a page, waits until the scaler has read it twice (never a sleep for a time), then moves the
clock on.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import grpc
import pytest
from conftest import FAST, RunningScaler
from support import ExporterServer, eventually, latest_trigger

from keda_gpu_scaler.app import App
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.explain import render_table
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc

# The tests' arithmetic is over a minute of pages: the window is named, not the default.
DEMAND = {"metric": "demand", "threshold": "10", "podNamePrefix": "chat-", "window": "60"}
MODEL = 'model_name="llama"'


def vllm_page(
    finished: float | str, running: float, waiting: float, prompt: float = 0, generated: float = 0
) -> str:
    """A vLLM V1 page with the families `demand` reads (finished split over two finish reasons)."""
    stop = finished if isinstance(finished, str) else finished - 1 if finished >= 1 else finished
    abort = 1 if not isinstance(finished, str) and finished >= 1 else 0
    return "\n".join(
        [
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{engine="0",{MODEL}}} {running}',
            "# TYPE vllm:num_requests_waiting gauge",
            f'vllm:num_requests_waiting{{engine="0",{MODEL}}} {waiting}',
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{engine="0",finished_reason="stop",{MODEL}}} {stop}',
            f'vllm:request_success_total{{engine="0",finished_reason="abort",{MODEL}}} {abort}',
            "# TYPE vllm:prompt_tokens_total counter",
            f'vllm:prompt_tokens_total{{engine="0",{MODEL}}} {prompt}',
            "# TYPE vllm:generation_tokens_total counter",
            f'vllm:generation_tokens_total{{engine="0",{MODEL}}} {generated}',
            "",
        ]
    )


def vllm_page_without_counters(running: float, waiting: float) -> str:
    return vllm_page(0, running, waiting).split("# TYPE vllm:request_success_total")[0]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class Fleet:
    scaler: RunningScaler
    clock: Clock
    pods: list[ExporterServer]
    epps: list[ExporterServer]
    metadata: dict[str, str] = dataclasses.field(default_factory=lambda: DEMAND)

    async def show(self, at: float, *pages: str | None, queue: dict[Queued, int] | None = None) -> None:
        """Set the clock to `at` and the pods' pages (None: unchanged), then wait until each page (and each
        EPP page) has been read twice since: at least once whole, at this instant."""
        self.clock.now = at
        for server, page in zip(self.pods, pages, strict=False):
            if page is not None:
                server.page = page
        if queue is not None:
            for epp in self.epps:
                epp.page = epp_page("chat-pool", queue)
        servers = [*self.pods, *self.epps]
        seen = [server.requests for server in servers]
        # Pages are read while a trigger asks for them: GetMetricSpec says so without deciding anything.
        await self.scaler.stub.GetMetricSpec(ref(self.metadata))

        async def read_twice() -> None:
            assert all(server.requests >= before + 2 for server, before in zip(servers, seen, strict=True))

        await eventually(read_twice)
        # Then one decision on the pages of this instant (a page's rate history starts when a decision
        # first asks for it; a `threshold: auto` trigger takes its window's sample in it). Decided before
        # the pages were read, it took the last instant's pages or these, whichever came first under load.
        await failure(self.scaler, self.metadata)


@pytest.fixture
async def fleet() -> AsyncIterator[Callable[..., Awaitable[Fleet]]]:
    made: list[tuple[App, grpc.aio.Channel, list[ExporterServer]]] = []

    async def make(pages: int, *, epps: int = 0, failing: tuple[int, ...] = ()) -> Fleet:
        servers = []
        for index in range(pages + epps):
            server = ExporterServer(page="", status=503 if index in failing else 200)
            await server.start()
            servers.append(server)
        pods, gateways = servers[:pages], servers[pages:]
        clock = Clock()
        settings = dataclasses.replace(
            FAST,
            inference_urls=tuple(("llm", f"chat-{i}", s.url) for i, s in enumerate(pods)),
            gateway_urls=tuple(("llm", "chat-pool", s.url) for s in gateways),
            # The test's clock moves in jumps: a page read before a jump stays fresh until the next one.
            max_staleness=100.0,
        )
        app = App(settings, clock=clock)
        await app.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
        made.append((app, channel, servers))
        return Fleet(RunningScaler(app, channel, pb_grpc.ExternalScalerStub(channel)), clock, pods, gateways)

    yield make
    for app, channel, servers in made:
        await channel.close()
        await app.stop()
        for server in servers:
            await server.stop()


def ref(metadata: dict[str, str]) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="chat", namespace="llm", scalerMetadata=metadata)


async def value(scaler: RunningScaler, metadata: dict[str, str] = DEMAND) -> float:
    name = metadata.get("metricName", "inference-demand")
    response = await scaler.stub.GetMetrics(
        pb.GetMetricsRequest(scaledObjectRef=ref(metadata), metricName=name)
    )
    assert len(response.metricValues) == 1
    return response.metricValues[0].metricValueFloat


async def failure(scaler: RunningScaler, metadata: dict[str, str] = DEMAND) -> tuple[grpc.StatusCode, str]:
    try:
        await value(scaler, metadata)
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


async def explain(scaler: RunningScaler) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{scaler.http}/explain", params={"namespace": "llm", "name": "chat"}) as answer,
    ):
        return latest_trigger(json.loads(await answer.text()))


async def test_demand_is_finished_plus_piled_up_per_second_summed_over_pods(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(2)
    spec = await f.scaler.stub.GetMetricSpec(ref(DEMAND))
    assert (spec.metricSpecs[0].metricName, spec.metricSpecs[0].targetSizeFloat) == ("inference-demand", 10)
    await f.show(1000, vllm_page(100, 10, 0), vllm_page(50, 4, 0))
    # One page each: no pod has a rate yet, which is no answer (never a made-up 0).
    code, message = await failure(f.scaler)
    assert code is grpc.StatusCode.UNAVAILABLE and "no target pod has a rate yet" in message, message
    await f.show(1030, vllm_page(400, 10, 0), vllm_page(140, 10, 6))
    # chat-0: 300 finished in 30 s = 10/s; chat-1: 90 finished and 12 more in flight = 102 / 30 = 3.4/s.
    assert await value(f.scaler) == pytest.approx(13.4)
    assert (await f.scaler.stub.IsActive(ref(DEMAND))).result is True
    explained = await explain(f.scaler)
    pods = {pod["pod"]: pod for pod in explained["pods"]}
    assert pods["chat-0"]["value"] == pytest.approx(10)
    assert pods["chat-0"]["inputs"]["samplesUsed"] == 2
    assert pods["chat-0"]["inputs"]["spanSeconds"] == 30
    assert explained["trigger"]["window"] == 60
    table = render_table(explained)
    assert "RATE/S" in table and "SAMPLES" in table and "SPAN S" in table
    # The window slides: at 1090 chat-0's rate is over 1030..1090 only.
    await f.show(1060, vllm_page(700, 10, 0), None)
    await f.show(1090, vllm_page(760, 10, 0), None)
    # chat-0 over 1030..1090: 360 / 60 = 6/s; chat-1's page did not move since 1030: 0/s.
    assert await value(f.scaler) == pytest.approx(6)
    explained = await explain(f.scaler)
    assert {pod["pod"]: pod["inputs"]["spanSeconds"] for pod in explained["pods"]}["chat-0"] == 60


async def test_a_restarted_server_counts_from_zero_never_a_negative_rate(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(1)
    await f.show(1000, vllm_page(5000, 8, 0))
    await f.show(1020, vllm_page(5200, 8, 0))
    await f.show(1040, vllm_page(80, 2, 0))  # restarted: 80 finished and 2 in flight since
    # Per series: `stop` went down (79 since), `abort` read 1 before and after (no step); the 8 requests
    # in flight before were lost with the restart, so the 2 in flight now count from an empty server.
    assert await value(f.scaler) == pytest.approx((200 + 79 + 2) / 40)


async def test_an_idle_fleet_is_zero_and_inactive(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(1)
    await f.show(1000, vllm_page(5000, 0, 0))
    await f.show(1030, None)
    assert await value(f.scaler) == 0
    assert (await f.scaler.stub.IsActive(ref(DEMAND))).result is False


async def test_a_pod_without_a_rate_yet_counts_as_the_mean_of_the_others(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(3, failing=(2,))
    await f.show(1000, vllm_page(0, 0, 0), vllm_page(0, 0, 0))
    await f.show(1040, vllm_page(300, 0, 0), vllm_page(180, 0, 0))  # 7.5/s and 4.5/s
    f.pods[2].status = 200
    await f.show(1040, None, None, vllm_page(7, 1, 0))  # its first page: no rate yet
    assert await value(f.scaler) == pytest.approx(7.5 + 4.5 + 6)
    explained = await explain(f.scaler)
    assert any("mean of the others" in note for note in explained["notes"]), explained["notes"]


@pytest.mark.parametrize("bad", ["NaN", "-4"])
async def test_an_unusable_counter_makes_a_missing_pod_not_a_rate(fleet, bad: str) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(2)
    await f.show(1000, vllm_page(0, 0, 0), vllm_page(0, 0, 0))
    await f.show(1030, vllm_page(60, 0, 0), vllm_page(bad, 0, 0))
    # chat-0: 2/s, below the threshold; chat-1 is missing and counts as the threshold (no scale-down).
    assert await value(f.scaler) == pytest.approx(2 + 10)
    explained = await explain(f.scaler)
    assert explained["missingPods"] == ["chat-1"]


async def test_a_counter_family_that_vanishes_makes_a_missing_pod(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(2)
    await f.show(1000, vllm_page(0, 0, 0), vllm_page(0, 0, 0))
    await f.show(1030, vllm_page(60, 0, 0), vllm_page_without_counters(0, 0))
    assert await value(f.scaler) == pytest.approx(2 + 10)


async def test_an_engine_without_a_finished_counter(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(1)
    llamacpp = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n"
    llamacpp += "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 0\n"
    await f.show(1000, llamacpp)

    async def unavailable_naming_it() -> None:
        code, message = await failure(f.scaler)
        assert (
            code is grpc.StatusCode.UNAVAILABLE and "llamacpp" in message and "finished requests" in message
        )

    await eventually(unavailable_naming_it)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await f.scaler.stub.GetMetricSpec(ref({**DEMAND, "engine": "llamacpp"}))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "demand" in (raised.value.details() or "")


async def test_tokens_weigh_requests_by_their_size(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(1)
    tokens = {**DEMAND, "demandUnit": "tokens", "threshold": "4000", "prefillWeight": "0.5"}
    f.metadata = tokens
    await f.show(1000, vllm_page(0, 0, 0, 0, 0))
    await f.show(1060, vllm_page(600, 0, 0, 600_000, 120_000))
    # 10 req/s × (1,000 × 0.5 + 200) = 7,000 weighted tokens/s.
    assert await value(f.scaler, tokens) == pytest.approx(7000)


async def test_tokens_with_nothing_finished_in_the_window_still_size_the_pending_part(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(1, epps=1)
    pooled = {
        **DEMAND,
        "demandUnit": "tokens",
        "threshold": "4000",
        "prefillWeight": "0.5",
        "inferencePool": "chat-pool",
    }
    f.metadata = pooled
    await f.show(1000, vllm_page(0, 0, 0, 0, 0), queue={})
    await f.show(1060, vllm_page(600, 0, 0, 600_000, 120_000), queue={})
    assert await value(f.scaler, pooled) == pytest.approx(7000)  # 700 weighted tokens per request
    # A burst of long requests: 20 in the server, none finished within the window, 30 held at the gateway.
    await f.show(1120, vllm_page(600, 20, 0, 600_000, 120_000), queue={Queued("llama"): 30})
    # The pod: 20 arrived / 60 s; held: 30 grew over 60 s and clear within 60 s; all at 700 tokens each.
    assert await value(f.scaler, pooled) == pytest.approx((20 / 60 + 30 / 60 + 30 / 60) * 700)


async def test_the_pool_s_pending_requests_wake_a_pool_at_zero(fleet) -> None:  # type: ignore[no-untyped-def]
    # A page of another workload keeps the namespace's inference source fresh; no chat- pod exists.
    f = await fleet(1, epps=1)
    pooled = {**DEMAND, "podNamePrefix": "none-", "inferencePool": "chat-pool", "window": "30"}
    f.metadata = pooled
    await f.show(1000, vllm_page(0, 0, 0), queue={})
    assert await value(f.scaler, pooled) == 0
    assert (await f.scaler.stub.IsActive(ref(pooled))).result is False
    await f.show(1010, None, queue={Queued("llama"): 3})
    # 3 held: their growth over 10 s (0.3/s) and what clears them within the 30 s window (0.1/s).
    assert await value(f.scaler, pooled) == pytest.approx(0.3 + 0.1)
    assert (await f.scaler.stub.IsActive(ref(pooled))).result is True
    explained = await explain(f.scaler)
    assert any("pending requests" in note for note in explained["notes"]), explained["notes"]


async def test_pending_growth_is_taken_between_page_reads_never_between_calls(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(1, epps=1)
    pooled = {**DEMAND, "podNamePrefix": "none-", "inferencePool": "chat-pool", "window": "30"}
    f.metadata = pooled
    await f.show(1000, vllm_page(0, 0, 0), queue={})
    # 50 requests queued between two gateway pages 10 s apart (show calls once before the new page is read).
    await f.show(1010, None, queue={Queued("llama"): 50})
    f.clock.now = 1010.5  # the next call half a second later: no new page since
    # Their growth over the pages' 10 s (5/s) and what clears them within the 30 s window; between the
    # two calls (0.5 s) it read 100/s.
    assert await value(f.scaler, pooled) == pytest.approx(50 / 10 + 50 / 30)


async def test_each_trigger_reads_pending_growth_over_its_own_window(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(1, epps=1)
    base = {**DEMAND, "podNamePrefix": "none-", "inferencePool": "chat-pool"}
    long, short = {**base, "window": "60"}, {**base, "window": "10", "metricName": "short"}
    f.metadata = long
    await f.show(1000, vllm_page(0, 0, 0), queue={})
    await f.show(1010, None, queue={Queued("llama"): 60})  # 60 arrive, then the queue stays at 60
    for at in range(1020, 1070, 10):
        await f.show(at, None)
        assert await value(f.scaler, short) > 0  # the short window's trigger asks on every page too
    # Over 60 s the queue grew 1/s; over the last 10 s it did not grow. Neither trims the other's points.
    assert await value(f.scaler, long) == pytest.approx(60 / 60 + 60 / 60)
    assert await value(f.scaler, short) == pytest.approx(0 + 60 / 10)


async def test_a_window_shorter_than_the_scrape_interval_is_invalid_argument(make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler(scrape_interval=20.0, max_staleness=60.0)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await scaler.stub.GetMetricSpec(ref({**DEMAND, "window": "15"}))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    details = raised.value.details() or ""
    for words in ("window=15", "--scrape-interval 20 s", "allowed: 20-600"):
        assert words in details, details


async def test_a_window_shorter_than_the_gateway_interval_is_invalid_argument_with_a_pool(
    make_scaler,
) -> None:  # type: ignore[no-untyped-def]
    # The pool's pending growth is a rate over the endpoint pickers' pages: it was widened without a word.
    scaler = await make_scaler(gateway_interval=30.0, max_staleness=90.0)
    pooled = {**DEMAND, "window": "15", "inferencePool": "chat-pool"}
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await scaler.stub.GetMetricSpec(ref(pooled))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    details = raised.value.details() or ""
    for words in ("window=15", "--gateway-interval 30 s", "allowed: 30-600"):
        assert words in details, details
    # Without a pool only the pods' pages count.
    await scaler.stub.GetMetricSpec(ref({**DEMAND, "window": "15"}))


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ({**DEMAND, "window": "5"}, ("window", "5", "10 <= window <= 600")),
        ({**DEMAND, "window": "601"}, ("window", "601")),
        ({**DEMAND, "window": "NaN"}, ("window", "not a number")),
        ({**DEMAND, "window": "60\n"}, ("window", "not a number")),
        ({**DEMAND, "demandUnit": "bytes"}, ("demandUnit", "requests, tokens")),
        ({**DEMAND, "prefillWeight": "0.5"}, ("prefillWeight", "demandUnit=tokens")),
        (
            {**DEMAND, "demandUnit": "tokens", "prefillWeight": "5"},
            ("prefillWeight", "0 <= prefillWeight <= 4"),
        ),
        ({**DEMAND, "demandUnit": "tokens", "engine": "triton"}, ("demandUnit", "triton")),
        ({**DEMAND, "source": "prometheus"}, ("source", "demand")),
        ({**DEMAND, "metric": "requests", "window": "60"}, ("window", "metric=demand")),
        ({**DEMAND, "threshold": "0"}, ("threshold",)),
    ],
)
async def test_bad_metadata_is_invalid_argument_naming_the_key(
    fleet, metadata: dict[str, str], words: tuple[str, ...]
) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(0)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await f.scaler.stub.GetMetricSpec(ref(metadata))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    for word in words:
        assert word in (raised.value.details() or ""), raised.value.details()


async def test_a_pool_name_matching_no_pool_is_unavailable_even_when_the_pods_are_busy(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(1, epps=1)
    f.epps = []  # the typo'd pool is never read: chat-pool's page is not waited for
    typo = {**DEMAND, "inferencePool": "chat-pol"}
    f.metadata = typo
    await f.show(1000, vllm_page(100, 10, 0))
    await f.show(1030, vllm_page(400, 10, 0))
    # The pods alone say 10/s (active): once a lower bound with the pool's part dropped, now the typo.
    code, message = await failure(f.scaler, typo)
    assert code is grpc.StatusCode.UNAVAILABLE, message
    assert "chat-pol " in message and "chat-pool" in message, message


async def test_a_model_named_in_the_wrong_case_is_invalid_argument(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(1)
    await f.show(1000, vllm_page(100, 10, 0))
    await f.show(1030, vllm_page(400, 10, 0))
    code, message = await failure(f.scaler, {**DEMAND, "model": "LLAMA"})
    assert code is grpc.StatusCode.INVALID_ARGUMENT, message
    assert "'LLAMA'" in message and "'llama'" in message, message


async def test_the_requests_guard_with_a_pool_acts_only_while_the_pool_holds_requests(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(1, epps=1)
    guard = {"metric": "requests", "threshold": "64", "podNamePrefix": "chat-", "inferencePool": "chat-pool"}
    f.metadata = guard

    async def guard_value() -> float:
        request = pb.GetMetricsRequest(scaledObjectRef=ref(guard), metricName="inference-requests")
        return (await f.scaler.stub.GetMetrics(request)).metricValues[0].metricValueFloat

    # Short answers at their target: 190 in flight, nothing held at the gateway: the guard asks for none.
    await f.show(1000, vllm_page(0, 190, 0), queue={})
    assert await guard_value() == 0
    assert (await f.scaler.stub.IsActive(ref(guard))).result is True  # the pod is serving
    explained = await explain(f.scaler)
    assert any("holds no request" in note and "190 in flight" in note for note in explained["notes"])
    # Every pod saturated: the gateway holds 12 requests, and the guard reads the pod's 190 again.
    await f.show(1005, vllm_page(0, 190, 0), queue={Queued("llama"): 12})
    assert await guard_value() == 190


def with_many_models(page: str, models: int) -> str:
    """The page plus `models` idle adapters' counters (a large page: many series, the same demand)."""
    idle = [
        f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="lora-{i}"}} 7'
        for i in range(models)
    ]
    return page + "\n".join(idle) + "\n"


async def test_a_large_pages_counters_are_worked_out_off_the_event_loop_to_the_same_demand(
    fleet, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    # Read on the loop at every page, a tenant's 20,000 counter series held every tenant's RPCs 60 ms a
    # scrape: a large page's counters are worked out where it is read (a page worker).
    import threading

    from keda_gpu_scaler.collect import demand_history
    from keda_gpu_scaler.pages import engines

    where: set[str] = set()
    real = engines.format_counters

    def recording(samples, index, model):  # type: ignore[no-untyped-def]
        samples = tuple(samples)
        if len(samples) > 500:  # engines.COUNTERS_WITH_PAGE_SERIES
            where.add(threading.current_thread().name)
        return real(samples, index, model)

    monkeypatch.setattr(engines, "format_counters", recording)
    monkeypatch.setattr(demand_history, "format_counters", recording, raising=False)
    f = await fleet(2)
    await f.show(1000, with_many_models(vllm_page(100, 10, 0), 2000), vllm_page(50, 4, 0))
    await f.show(1030, with_many_models(vllm_page(400, 10, 0), 2000), vllm_page(140, 10, 6))
    assert await value(f.scaler) == pytest.approx(13.4)  # as test_demand_is_finished_plus_piled_up…
    assert where and threading.main_thread().name not in where, where
