"""`pending` end to end beyond the queue: requests turned away for want of an endpoint wake the workload,
an EPP restart does not, and a `model` that matches nothing is an error or a note, never a quiet 0."""

from __future__ import annotations

from pathlib import Path

import grpc
from aiohttp import web
from support import eventually
from test_gateway import PENDING, error_of, explain, ref, urls, value

from keda_gpu_scaler.demo.epp import Queued, epp_page

FIXTURES = Path(__file__).parent.parent / "fixtures" / "gateways"
BEFORE = (FIXTURES / "llm_d_epp_no_endpoints_before.prom").read_text()
AFTER = (FIXTURES / "llm_d_epp_no_endpoints_after.prom").read_text()


async def test_requests_turned_away_wake_the_workload_until_a_page_shows_no_more(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    epp = await make_exporter(BEFORE)
    scaler = await make_scaler(gateway_urls=urls(epp))

    async def inactive() -> None:
        assert (await scaler.stub.IsActive(ref())).result is False

    await eventually(inactive)
    epp.page = AFTER  # a burst, turned away before any scrape saw it queued

    async def active() -> None:
        assert (await scaler.stub.IsActive(ref())).result is True

    await eventually(active)
    assert await value(scaler) == 0  # the queue is empty: only activity says "wake"
    entry = await explain(scaler)
    assert entry["gatewayReplicas"][0]["turnedAwaySincePreviousPage"] == 5
    assert any("turned 5 requests away" in note for note in entry["notes"])
    await eventually(inactive)  # the same counters on the next page: nothing new was turned away


async def test_a_wake_with_an_unread_replica_is_active_and_its_lower_bound_of_0_is_no_value(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    """SPEC §7: one replica's queue is empty but it turns requests away (a wake: IsActive true), another
    cannot be read and may hold many. GetMetrics is UNAVAILABLE, never the made-up 0 the HPA would size on,
    and /explain says the same."""
    from keda_gpu_scaler.explain import render_table

    turned_away = [0]

    async def metrics(_: web.Request) -> web.Response:
        turned_away[0] += 1  # one more request turned away since every previous page
        page = epp_page("chat-pool", {}) + (
            "# TYPE llm_d_epp_flow_control_requests_total counter\n"
            'llm_d_epp_flow_control_requests_total{inference_pool="chat-pool",outcome="RejectedNoEndpoints",'
            f'priority="0"}} {turned_away[0]}\n'
        )
        return web.Response(text=page)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    fresh = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    failing = await make_exporter(epp_page("chat-pool", {Queued("llama"): 30}))
    failing.status = 500
    try:
        scaler = await make_scaler(gateway_urls=(("llm", "chat-pool", fresh), *urls(failing)))

        async def woken() -> None:
            assert (await scaler.stub.IsActive(ref())).result is True

        await eventually(woken)
        code, message = await error_of(value(scaler))
        assert code is grpc.StatusCode.UNAVAILABLE, (code, message)
        assert "hold no request" in message and "500" in message, message
        entry = await explain(scaler)
        assert entry["value"] is None and entry["active"] is True, entry
        assert "hold no request" in entry["valueUnknown"], entry
        assert entry["hpa"] is None, entry  # no value, so no replica count the HPA could compute
        assert "value = unknown (GetMetrics answers UNAVAILABLE" in render_table(entry)
    finally:
        await runner.cleanup()


async def test_an_epp_restart_resets_its_counters_without_a_wake_or_an_error(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    epp = await make_exporter(AFTER)
    scaler = await make_scaler(gateway_urls=urls(epp))
    await eventually(lambda: value(scaler))
    requests = epp.requests
    epp.page = BEFORE.replace('priority="0"} 2', 'priority="0"} 0')  # counters began again
    await eventually(lambda: _scraped_since(epp, requests))
    for _ in range(3):
        assert (await scaler.stub.IsActive(ref())).result is False


async def _scraped_since(epp, requests: int) -> None:  # type: ignore[no-untyped-def]
    assert epp.requests >= requests + 2


async def test_a_model_differing_only_by_case_is_invalid_argument_naming_the_model_seen(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    epp = await make_exporter(epp_page("chat-pool", {Queued("Qwen/Qwen3-8B"): 3}))
    scaler = await make_scaler(gateway_urls=urls(epp))
    # Only this trigger is ever asked about: /explain then shows it (a ScaledObject's latest trigger).
    metadata = {**PENDING, "model": "qwen/qwen3-8b"}

    async def refused() -> None:
        code, message = await error_of(scaler.stub.IsActive(ref(metadata)))
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, message)
        assert "'Qwen/Qwen3-8B'" in message

    await eventually(refused)
    assert "'Qwen/Qwen3-8B'" in (await explain(scaler))["error"]


async def test_a_model_never_seen_reads_0_and_explain_lists_the_models_shown(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    epp = await make_exporter(epp_page("chat-pool", {Queued("Qwen/Qwen3-8B"): 3}))
    scaler = await make_scaler(gateway_urls=urls(epp))
    metadata = {**PENDING, "model": "mistral"}
    # UNAVAILABLE until the page is read; then 0, and only this trigger is ever asked about.
    assert await eventually(lambda: value(scaler, metadata)) == 0
    notes = (await explain(scaler))["notes"]
    assert any("'mistral' is not among the models" in n and "'Qwen/Qwen3-8B'" in n for n in notes)


async def test_the_explain_table_says_how_many_requests_were_turned_away(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    from keda_gpu_scaler.explain import render_table

    epp = await make_exporter(BEFORE)
    scaler = await make_scaler(gateway_urls=urls(epp))
    await eventually(lambda: value(scaler))
    epp.page = AFTER

    async def shown() -> None:
        await scaler.stub.IsActive(ref())
        table = render_table(await explain(scaler))
        assert "turned away since its previous page: 5" in table, table

    await eventually(shown)


async def test_an_idle_older_epp_reads_0_and_sharded_series_are_summed(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    idle = await make_exporter((FIXTURES / "gie_epp_flow_control_idle.prom").read_text())
    sharded = await make_exporter((FIXTURES / "llm_d_epp_sharded.prom").read_text())
    scaler = await make_scaler(gateway_urls=urls(idle, sharded))

    async def eight() -> None:
        assert await value(scaler) == 8  # 0 from the idle older EPP, 4 + 4 from the two shards

    await eventually(eight)
