"""Large JSON answers (Prometheus vectors, pod lists): decoded in pieces off the event loop, capped."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from keda_gpu_scaler.collect import prometheus_client
from keda_gpu_scaler.collect.http import client_session
from keda_gpu_scaler.collect.prometheus_client import PrometheusClient
from keda_gpu_scaler.config.settings import Settings
from keda_gpu_scaler.pages import prometheus_answer
from keda_gpu_scaler.pages.jsonpieces import OFF_LOOP_BYTES, TooManyItems, loads_in_pieces
from keda_gpu_scaler.pages.prometheus_answer import MAX_ANSWER_ELEMENTS, PrometheusError, parse_vector
from keda_gpu_scaler.telemetry import Telemetry

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
DOCUMENTS = st.one_of(
    JSON_VALUES,
    st.fixed_dictionaries(
        {"status": st.just("success"), "data": st.fixed_dictionaries({"result": st.lists(JSON_VALUES)})},
        optional={"warnings": st.lists(st.text(max_size=5))},
    ),
)


@settings(max_examples=300)
@given(document=DOCUMENTS, indent=st.sampled_from([None, 0, 2]))
def test_decoding_in_pieces_gives_what_json_loads_gives(document: object, indent: int | None) -> None:
    text = json.dumps(document, indent=indent)
    assert loads_in_pieces(text.encode(), ("data", "result")) == json.loads(text)


@settings(max_examples=300)
@given(document=DOCUMENTS, cut=st.integers(min_value=0), junk=st.sampled_from(["", ",", "]", "}", "x", " 1"]))
def test_decoding_in_pieces_fails_where_json_loads_fails(document: object, cut: int, junk: str) -> None:
    text = json.dumps(document)
    broken = text[: cut % (len(text) + 1)] + junk
    try:
        expected = json.loads(broken)
    except ValueError:
        with pytest.raises(ValueError):
            loads_in_pieces(broken, ("data", "result"))
    else:
        assert loads_in_pieces(broken, ("data", "result")) == expected


def test_an_array_over_the_limit_is_refused_before_the_rest_is_decoded() -> None:
    text = '{"items": [1, 2, 3, {"never": "decoded"' + "x" * 10
    with pytest.raises(TooManyItems):
        loads_in_pieces(text, ("items",), max_items=3)
    assert loads_in_pieces('{"items": [1, 2, 3]}', ("items",), max_items=3) == {"items": [1, 2, 3]}


def vector(count: int) -> bytes:
    result = [
        {
            "metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "namespace": "big", "pod": f"p-{i}"},
            "value": [1.5, "7"],
        }
        for i in range(count)
    ]
    document = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return json.dumps(document, separators=(",", ":")).encode()  # as Prometheus writes it


@pytest.mark.parametrize("pieces", [False, True], ids=["json.loads", "in pieces"])
def test_an_answer_over_the_element_limit_is_refused_naming_the_limit(monkeypatch, pieces: bool) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(prometheus_answer, "MAX_ANSWER_ELEMENTS", 10)
    monkeypatch.setattr(prometheus_answer, "OFF_LOOP_BYTES", 0 if pieces else 1 << 30)
    assert len(parse_vector(vector(10))[0]) == 10
    with pytest.raises(PrometheusError, match=r"more than 10 vector elements .* the limit is 10"):
        parse_vector(vector(11))


LABEL_VALUES = st.text(alphabet=st.sampled_from(list('},"value":[{]\\ab')), max_size=12)


@settings(max_examples=200)
@given(
    labels=st.lists(
        st.dictionaries(st.sampled_from(["a", "metric", "value", "__name__"]), LABEL_VALUES), max_size=30
    ),
    step=st.integers(min_value=1, max_value=64),
)
def test_elements_are_counted_exactly_without_decoding(labels: list[dict[str, str]], step: int) -> None:
    result = [{"metric": metric, "value": [1.5, "2"]} for metric in labels]
    body = json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": result}}, separators=(",", ":")
    ).encode()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prometheus_answer, "_COUNT_STEP", step)  # elements across the steps' ends
        assert prometheus_answer.counted_elements(body) == len(labels)


def test_an_answer_counted_over_the_limit_is_refused_undecoded(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(prometheus_answer, "MAX_ANSWER_ELEMENTS", 10)
    monkeypatch.setattr(prometheus_answer, "OFF_LOOP_BYTES", 0)
    monkeypatch.setattr(prometheus_answer, "loads_in_pieces", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(PrometheusError, match="more than 10 vector elements"):
        parse_vector(vector(11))


def test_an_answer_for_a_namespace_of_1000_gpu_pods_is_read_and_a_far_larger_one_refused() -> None:
    """At the default limit: 1,000 pods of 8 GPUs (a series each) are read; 100,000 series are refused."""
    assert len(parse_vector(vector(8_000))[0]) == 8_000
    with pytest.raises(PrometheusError, match=r"more than [\d,]+ vector elements"):
        parse_vector(vector(100_000))


@pytest.mark.parametrize(
    "body",
    [
        b"<html>",
        b"\xff\xfe",
        b"[]",
        b'{"status":"success"}',
        b"[" * 100_000,
        b'{"status": "success", "data": {"result": [1,]}}',
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"2"]]}]}}',
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"x"]}]}}',
    ],
)
def test_a_broken_answer_fails_alike_decoded_whole_or_in_pieces(monkeypatch, body: bytes) -> None:  # type: ignore[no-untyped-def]
    messages = []
    for threshold in (1 << 30, 0):
        monkeypatch.setattr(prometheus_answer, "OFF_LOOP_BYTES", threshold)
        with pytest.raises(PrometheusError) as error:
            parse_vector(body)
        messages.append(str(error.value).partition(" (")[0])
    assert messages[0] == messages[1]


def test_an_answer_reads_the_same_decoded_whole_or_in_pieces(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    body = vector(50)
    whole = parse_vector(body)
    monkeypatch.setattr(prometheus_answer, "OFF_LOOP_BYTES", 0)
    assert parse_vector(body) == whole and len(whole[0]) == 50


@pytest.fixture
async def prometheus_api() -> AsyncIterator[tuple[str, dict[str, bytes]]]:
    """A loopback server answering /api/v1/query with whatever body is set (a hostile Prometheus)."""
    answers = {"body": vector(1)}

    async def query(_: web.Request) -> web.Response:
        return web.Response(body=answers["body"], content_type="application/json")

    app = web.Application()
    app.router.add_post("/api/v1/query", query)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", answers
    await runner.cleanup()


async def test_a_large_prometheus_answer_is_decoded_off_the_loop(prometheus_api, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    url, answers = prometheus_api
    threads: list[str] = []
    real = prometheus_client.parse_vector

    def recording(body: bytes):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread().name)
        return real(body)

    monkeypatch.setattr(prometheus_client, "parse_vector", recording)
    settings = Settings(prometheus_url=url, prometheus_timeout=10.0)
    async with client_session() as session:
        client = PrometheusClient(session, settings, Telemetry(), time.monotonic)
        assert len(await client.query("up", 1.0, "namespace")) == 1
        answers["body"] = vector(OFF_LOOP_BYTES // 80)
        assert len(answers["body"]) > OFF_LOOP_BYTES
        assert len(await client.query("up", 1.0, "namespace")) == OFF_LOOP_BYTES // 80
        answers["body"] = vector(MAX_ANSWER_ELEMENTS + 1)
        with pytest.raises(PrometheusError, match=f"more than {MAX_ANSWER_ELEMENTS:,} vector elements"):
            await client.query("up", 1.0, "namespace")
    main = threading.main_thread().name
    assert threads[0] == main, "a small answer is decoded on the loop"
    assert threads[1] != main and threads[2] != main, "a large answer is decoded off the loop"
