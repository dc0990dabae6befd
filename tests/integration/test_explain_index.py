"""/explain's trigger=INDEX: one of two triggers that share a metricName, picked by its position."""

from __future__ import annotations

from support import eventually
from test_service import METADATA, four_pods_at, get_explain, metrics_request, value_of


async def test_explain_picks_one_of_two_triggers_that_share_a_metric_name_by_its_index(  # type: ignore[no-untyped-def]
    make_exporter, make_scaler
) -> None:
    # Two utilization triggers, both named gpu-utilization: metric= cannot tell them apart.
    scaler = await make_scaler(await make_exporter(four_pods_at(90)))
    stricter = METADATA | {"threshold": "80"}

    async def both_evaluated() -> None:
        assert await value_of(scaler) == 360
        await scaler.stub.GetMetrics(metrics_request(stricter))
        status, whole = await get_explain(scaler)
        assert status == 200 and len(whole["triggers"]) == 2

    await eventually(both_evaluated)
    status, whole = await get_explain(scaler)
    assert [(e["index"], e["trigger"]["metricName"], e["threshold"]) for e in whole["triggers"]] == [
        (0, "gpu-utilization", 70),
        (1, "gpu-utilization", 80),
    ]
    status, answer = await get_explain(scaler, metric="gpu-utilization")
    assert status == 400
    assert answer["error"] == (
        "2 triggers have metric or metricName 'gpu-utilization': add &trigger=INDEX, one of 0, 1"
        " (the trigger's 0-based position in `triggers`)"
    )
    assert [(e["index"], e["threshold"]) for e in answer["triggers"]] == [(0, 70), (1, 80)]
    for index, threshold in ((0, 70), (1, 80)):
        status, one = await get_explain(scaler, metric="gpu-utilization", trigger=str(index))
        assert status == 200 and (one["index"], one["threshold"]) == (index, threshold)
        status, same = await get_explain(scaler, trigger=str(index))
        assert status == 200 and same["threshold"] == threshold
    for bad in ("2", "-1", "one", "٠", "9" * 5000):  # a number beyond int()'s digits too: 400, never 500
        status, answer = await get_explain(scaler, trigger=bad)
        assert status == 400 and f"trigger={bad[:20]!r} is not a trigger" in answer["error"], answer
        assert "from 0 to 1" in answer["error"]
    status, answer = await get_explain(scaler, metric="memory", trigger="0")
    assert (status, answer["error"]) == (400, "trigger=0 has metricName 'gpu-utilization', not 'memory'")
    # SPEC §7 names the choice metric= or metricName=; any other parameter is an error naming it.
    status, one = await get_explain(scaler, metricName="gpu-utilization", trigger="1")
    assert status == 200 and one["threshold"] == 80
    status, answer = await get_explain(scaler, metrc="gpu-utilization")
    assert status == 400 and answer["error"].startswith("'metrc' is not a parameter of /explain"), answer
    # The same for a ScaledObject not (yet) evaluated: the request is wrong whatever it names.
    status, answer = await get_explain(scaler, name="nope", metrc="gpu-utilization")
    assert status == 400 and answer["error"].startswith("'metrc' is not a parameter of /explain"), answer


async def test_explain_refuses_a_query_that_chooses_twice_naming_the_parameter_and_values(  # type: ignore[no-untyped-def]
    make_exporter, make_scaler
) -> None:
    # metric=A&metricName=B answered A, and a repeated parameter answered its first value: one of two
    # choices picked silently.
    import aiohttp

    scaler = await make_scaler(await make_exporter(four_pods_at(90)))
    memory = METADATA | {"metric": "memory", "threshold": "50"}

    async def both_evaluated() -> None:
        assert await value_of(scaler) == 360
        await scaler.stub.GetMetrics(metrics_request(memory, "gpu-memory"))
        status, whole = await get_explain(scaler)
        assert status == 200 and len(whole["triggers"]) == 2

    await eventually(both_evaluated)
    base = [("namespace", "llm"), ("name", "vllm")]
    cases = [
        (
            [("metric", "gpu-utilization"), ("metricName", "gpu-memory")],
            ["metric='gpu-utilization'", "metricName='gpu-memory'"],
        ),
        (
            [("metric", "gpu-utilization"), ("metric", "gpu-memory")],
            ["'metric' is given twice", "'gpu-memory'"],
        ),
        ([("metricName", "gpu-memory"), ("metricName", "gpu-memory")], ["'metricName' is given twice"]),
        ([("trigger", "0"), ("trigger", "1")], ["'trigger' is given twice", "'0' and '1'"]),
        ([("namespace", "other")], ["'namespace' is given twice", "'llm' and 'other'"]),
    ]
    async with aiohttp.ClientSession() as session:
        for extra, fragments in cases:
            async with session.get(f"{scaler.http}/explain", params=[*base, *extra]) as response:
                answer = await response.json()
            assert response.status == 400, (extra, answer)
            assert all(fragment in answer["error"] for fragment in fragments), answer
        # The same trigger named both ways is one choice.
        params = [*base, ("metric", "gpu-memory"), ("metricName", "gpu-memory")]
        async with session.get(f"{scaler.http}/explain", params=params) as response:
            assert response.status == 200 and (await response.json())["threshold"] == 50
