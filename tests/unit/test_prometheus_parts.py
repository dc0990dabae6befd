"""The Prometheus source's pure parts: PromQL quoting, answers, freshness of pages, and its settings."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import eventually

from keda_gpu_scaler.collect import prometheus as prometheus_module
from keda_gpu_scaler.collect.backoff import MAX_BACKOFF_INTERVALS
from keda_gpu_scaler.collect.fairshare import FairSlots
from keda_gpu_scaler.collect.prometheus import PrometheusCollector
from keda_gpu_scaler.collect.prometheus_client import QUERIES_IN_FLIGHT, http_error
from keda_gpu_scaler.collect.prometheus_sources import (
    INFERENCE_SERIES,
    gateway_source,
    inference_source,
    pod_inference_source,
)
from keda_gpu_scaler.collect.store import Store
from keda_gpu_scaler.collect.wanted import PrometheusQuery, WantedSources
from keda_gpu_scaler.config.settings import (
    PROMETHEUS_PASSWORD_ENV,
    SettingsError,
    build_settings,
    env_values,
)
from keda_gpu_scaler.core.snapshot import SourceKind
from keda_gpu_scaler.demo import engines as simulated
from keda_gpu_scaler.pages.engines import (
    ENGINE_SAMPLE_NAMES,
    Engine,
    PodSamples,
    pod_reading,
)
from keda_gpu_scaler.pages.engines.formats import LLAMACPP, TRTLLM_SERVE
from keda_gpu_scaler.pages.exposition import Sample, parse_exposition
from keda_gpu_scaler.pages.prometheus_answer import (
    REMOTE_TEXT_LIMIT,
    Element,
    PrometheusError,
    ReplicaLost,
    Up,
    gateway_replicas,
    inference_pods,
    lost_pod,
    parse_vector,
    remote_text,
    samples_with_times,
    up_series,
)
from keda_gpu_scaler.pages.promql import (
    TIMESTAMP_LABEL,
    any_of,
    gateway_query,
    gpu_queries,
    inference_query,
    liveness_query,
    namespace_query,
    promql_string,
    regex_literal,
    up_query,
)
from keda_gpu_scaler.pages.vendors import POD_LABELS, SAMPLE_NAMES

# ---- PromQL ---------------------------------------------------------------------------------------


@given(st.text())
def test_promql_string_holds_exactly_the_value(value: str) -> None:
    literal = promql_string(value)
    # The escapes used (\\, \", \u00XX) mean the same in Go and JSON strings.
    assert json.loads(literal) == value
    assert "\n" not in literal and "\r" not in literal


@given(st.text())
def test_regex_literal_matches_only_itself(value: str) -> None:
    pattern = regex_literal(value)
    assert re.fullmatch(pattern, value, re.DOTALL)
    assert re.fullmatch(pattern, value + "x", re.DOTALL) is None


@pytest.mark.parametrize(("value", "other"), [("GPU-a.b", "GPU-aXb"), ("a|b", "a"), ("(x)*", "")])
def test_regex_literal_is_not_a_pattern(value: str, other: str) -> None:
    assert re.fullmatch(regex_literal(value), other) is None


def test_namespace_query_covers_every_pod_label_pair_and_family() -> None:
    query = namespace_query('llm"} or up{x="', None)
    for ns_key, pod_key in POD_LABELS:
        assert f'{ns_key}="llm\\"}} or up{{x=\\"",{pod_key}!=""}}' in query
    for name in SAMPLE_NAMES:
        assert f'timestamp({{__name__="{name}",' in query
    assert query.count("timestamp(") == len(SAMPLE_NAMES) * len(POD_LABELS)


def test_only_exporter_namespaces_may_name_another_namespaces_pod() -> None:
    """--exporter-namespaces: every pair but the target's own namespace/pod counts only from a scrape
    target in those namespaces (a tenant's pod printing exporter-like series about another's pod never)."""
    query = namespace_query("llm", frozenset({"gpu-operator", "arms-prom"}))
    assert 'namespace="llm",pod!=""}' in query
    for ns_key, pod_key in POD_LABELS:
        if ns_key != "namespace":
            assert f'{ns_key}="llm",{pod_key}!="",namespace=~"arms-prom|gpu-operator"}}' in query
    nvidia = Sample(
        "DCGM_FI_DEV_GPU_UTIL", {"UUID": "GPU-1", "exported_namespace": "a", "exported_pod": "p"}, 5, 0
    )
    (gpus,) = gpu_queries([nvidia], frozenset({"gpu-operator"}))
    assert 'UUID=~"GPU-1",namespace=~"gpu-operator"}' in gpus
    assert 'UUID=~"GPU-1",exported_pod="",PodName="",pod_name=""}' in gpus
    (anywhere,) = gpu_queries([nvidia], None)  # `*`
    assert 'UUID=~"GPU-1"}' in anywhere and "namespace=~" not in anywhere


def test_gpu_queries_only_for_vendors_that_need_them() -> None:
    nvidia = Sample("DCGM_FI_DEV_GPU_UTIL", {"UUID": "GPU-1.2", "namespace": "a", "pod": "p"}, 5, 0)
    old = Sample("DCGM_FI_DEV_FB_USED", {"uuid": "GPU-3", "pod_namespace": "a", "pod_name": "p"}, 5, 0)
    amd = Sample("gpu_gfx_activity", {"gpu_id": "0", "namespace": "a", "pod": "q"}, 5, 0)
    assert gpu_queries([amd], None) == []
    (query,) = gpu_queries([nvidia, old, amd], None)
    assert 'UUID=~"GPU-1\\\\.2"' in query and 'uuid=~"GPU-3"' in query
    assert "gpu_gfx_activity" not in query


def test_liveness_query_asks_per_target() -> None:
    query = liveness_query([("operator", "10.0.0.1:9400"), ("operator", "10.0.0.2:9400")])
    assert query.startswith("max by (job, instance) (")
    assert 'instance=~"10\\\\.0\\\\.0\\\\.1:9400|10\\\\.0\\\\.0\\\\.2:9400"' in query


# ---- answers --------------------------------------------------------------------------------------


def answer(result: list[dict[str, Any]], result_type: str = "vector") -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": result_type, "result": result}}).encode()


def test_parse_vector_reads_special_values() -> None:
    body = answer(
        [
            {"metric": {"__name__": "a", "x": "1"}, "value": [1.5, "NaN"]},
            {"metric": {"__name__": "a", "x": "2"}, "value": [1.5, "+Inf"]},
            {"metric": {"__name__": "a", "x": "3"}, "value": [1.5, "-12.5e3"]},
        ]
    )
    elements, warnings = parse_vector(body)
    assert [e.labels["x"] for e in elements] == ["1", "2", "3"]
    assert elements[0].value != elements[0].value and elements[1].value == float("inf")
    assert elements[2].value == -12500.0 and warnings == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"<html>", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[]", "not a Prometheus API response"),
        (b'{"status":"error","errorType":"bad_data","error":"parse error"}', "bad_data: parse error"),
        (b'{"status":"success"}', "no data.result"),
        (answer([], "matrix"), "'matrix', not an instant vector"),
        (answer([{"metric": {}, "value": [1, 2]}]), "malformed vector element"),
        (answer([{"metric": {"a": 1}, "value": [1, "2"]}]), "malformed vector element"),
        (answer([{"metric": {}, "value": [1, "two"]}]), "malformed sample value"),
        (b"[" * 100_000, "not JSON"),  # deeper than the JSON decoder goes
    ],
)
def test_parse_vector_rejects(body: bytes, message: str) -> None:
    with pytest.raises(PrometheusError, match=re.escape(message)):
        parse_vector(body)


LONG = "x" * 5_000 + "\n" + "y" * 5_000


@pytest.mark.parametrize(
    "document",
    [
        {"status": "error", "errorType": LONG, "error": LONG},
        {"status": LONG},
        {"status": "success", "data": {"resultType": LONG, "result": []}},
        {
            "status": "success",
            "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, LONG]}]},
        },
        {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {"a": LONG}}]}},
    ],
)
def test_errors_quote_little_of_the_answer(document: dict[str, Any]) -> None:
    with pytest.raises(PrometheusError) as raised:
        parse_vector(json.dumps(document).encode())
    message = str(raised.value)
    # The longest run of the server's text: at most the limit (and the … that says it was cut).
    assert max(len(run) for run in re.findall("[xy]+", message)) <= REMOTE_TEXT_LIMIT
    assert "\n" not in message and len(message) < 3 * REMOTE_TEXT_LIMIT


def test_warnings_are_quoted_short() -> None:
    body = json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": []}, "warnings": [LONG]}
    )
    _, warnings = parse_vector(body.encode())
    assert warnings == [remote_text(LONG)] and len(warnings[0]) == REMOTE_TEXT_LIMIT + 1


def test_http_errors_quote_little_of_the_answer() -> None:
    body = json.dumps({"status": "error", "errorType": "execution", "error": LONG}).encode()
    message = http_error(502, LONG, None, body)
    assert message.startswith("HTTP 502 " + "x" * REMOTE_TEXT_LIMIT + "…: execution: ")
    assert len(message) < 3 * REMOTE_TEXT_LIMIT
    redirect = http_error(302, "Found", "https://elsewhere/" + LONG, b"")
    assert "redirect to https://elsewhere/" in redirect and len(redirect) < 3 * REMOTE_TEXT_LIMIT


def test_remote_text() -> None:
    assert remote_text("short") == "short"
    assert remote_text("a\nb\x1b") == "a\\nb\\x1b"
    assert remote_text("z" * 150) == "z" * REMOTE_TEXT_LIMIT + "…"


def elements_of(samples: list[Sample]) -> list[Element]:
    """What Prometheus answers to values_and_times() for these samples (timestamps in ms)."""
    result = []
    for s in samples:
        result.append(Element({"__name__": s.name, **s.labels}, s.value))
        result.append(Element({**s.labels, TIMESTAMP_LABEL: "1"}, (s.timestamp_ms or 0) / 1000))
    return result


def test_samples_take_the_time_of_their_label_set() -> None:
    labels = {"gpu": "0", "namespace": "a", "pod": "p"}
    elements = [
        Element({"__name__": "DCGM_FI_DEV_GPU_UTIL", **labels}, 40),
        Element({"__name__": "DCGM_FI_DEV_FB_USED", **labels}, 100),
        Element({"__name__": "DCGM_FI_DEV_FB_FREE", "gpu": "1"}, 100),  # no time: dropped
        Element({**labels, TIMESTAMP_LABEL: "1"}, 1700000000.123),
    ]
    assert samples_with_times(elements) == [
        Sample("DCGM_FI_DEV_GPU_UTIL", labels, 40, 1700000000123),
        Sample("DCGM_FI_DEV_FB_USED", labels, 100, 1700000000123),
    ]


# ---- the collector's freshness, with a scripted Prometheus and clocks -------------------------------

WALL = 1_800_000_000.0


class ScriptedPrometheus:
    """Answers queries by purpose from lists the test sets; records the purposes asked."""

    def __init__(self) -> None:
        self.answers: dict[str, list[Element]] = {}
        self.failures: dict[str, PrometheusError] = {}
        self.asked: list[str] = []
        self.heard = asyncio.Event()  # set by the first query
        self.slots = FairSlots(QUERIES_IN_FLIGHT)

    def slot(self, namespace: str) -> contextlib.AbstractAsyncContextManager[None]:
        return self.slots.slot(namespace)

    async def query(self, promql: str, at: float, purpose: str) -> list[Element]:
        self.asked.append(purpose)
        self.heard.set()
        if purpose in self.failures:
            raise self.failures[purpose]
        return self.answers.get(purpose, [])


def gpu(pod: str, value: float, age: float, instance: str = "node-a:9400", gpu_id: str = "0") -> list[Sample]:
    labels = {
        "gpu": gpu_id,
        "UUID": f"GPU-{instance}-{gpu_id}",
        "Hostname": instance,
        "namespace": "llm",
        "pod": pod,
        "job": "dcgm",
        "instance": instance,
    }
    at = round((WALL - age) * 1000)
    return [
        Sample("DCGM_FI_DEV_GPU_UTIL", labels, value, at),
        Sample("DCGM_FI_DEV_FB_USED", labels, 10, at),
        Sample("DCGM_FI_DEV_FB_FREE", labels, 30, at),
    ]


def collector(
    prometheus: ScriptedPrometheus, store: Store, now: list[float] | None = None
) -> PrometheusCollector:
    """A collector whose monotonic clock reads now[0] (1000.0 by default) while the wall clock says WALL."""
    clock = now or [1000.0]
    return PrometheusCollector(
        client=prometheus,  # type: ignore[arg-type]
        store=store,
        wanted=WantedSources(),
        interval=1.0,
        max_staleness=4.0,
        clock=lambda: clock[0],
        wall_clock=lambda: WALL,
    )


async def test_page_is_as_old_as_its_samples() -> None:
    prometheus, store = ScriptedPrometheus(), Store()
    prometheus.answers["namespace"] = elements_of(gpu("vllm-0", 40, age=2.0))
    assert await collector(prometheus, store).collect_once("llm")
    assert prometheus.asked == ["namespace", "gpus"]
    view = store.view("llm", 1000.0, 4.0, SourceKind.PROMETHEUS)
    assert [r.utilization for r in view.readings] == [40]
    # Collected "now" but the samples are 2 s old: stale 2 s later, not 4.
    assert store.view("llm", 1002.5, 4.0, SourceKind.PROMETHEUS).readings == ()


@pytest.mark.parametrize(
    ("instance", "problems"),
    [
        # The exporter's other series are current: vllm-1 is gone from that exporter.
        ("node-a:9400", []),
        # Every series of that exporter is stale: its pods count as missing.
        ("node-b:9400", ["prometheus llm dcgm/node-b:9400: last data 10.0s old (max staleness 4s)"]),
    ],
)
async def test_stale_series_are_never_used(instance: str, problems: list[str]) -> None:
    prometheus, store = ScriptedPrometheus(), Store()
    # Prometheus' lookback still shows vllm-1's last sample, 10 s old.
    prometheus.answers["namespace"] = elements_of(
        gpu("vllm-0", 40, age=0.5) + gpu("vllm-1", 90, age=10.0, instance=instance, gpu_id="1")
    )
    assert await collector(prometheus, store).collect_once("llm")
    view = store.view("llm", 1000.0, 4.0, SourceKind.PROMETHEUS)
    assert [r.pod for r in view.readings] == ["vllm-0"]
    assert list(view.recently_seen) == (["vllm-1"] if problems else [])
    assert list(view.problems) == problems


async def node_b_vanishes(
    prometheus: ScriptedPrometheus, store: Store, now: list[float]
) -> PrometheusCollector:
    """A collection with vllm-0 on node-a and vllm-1 on node-b; then node-b's series are gone."""
    prometheus.answers["namespace"] = elements_of(
        gpu("vllm-0", 40, age=0.5) + gpu("vllm-1", 90, age=0.5, instance="node-b:9400")
    )
    source = collector(prometheus, store, now)
    assert await source.collect_once("llm")
    prometheus.answers["namespace"] = elements_of(gpu("vllm-0", 40, age=0.5))
    return source


@pytest.mark.parametrize(
    ("case", "sources_left"),
    [("names another pod", 2), ("names no pod", 3), ("down", 3)],
)
async def test_target_naming_no_pod_any_more(case: str, sources_left: int) -> None:
    prometheus, store, now = ScriptedPrometheus(), Store(), [1000.0]
    source = await node_b_vanishes(prometheus, store, now)
    newest = WALL - (60 if case == "down" else 0.5)
    node_b = {"job": "dcgm", "instance": "node-b:9400"}
    prometheus.answers["liveness"] = [Element(node_b, newest)]
    # Its GPU series as they stand: another workload's pod, or (an attribution outage) the exporter's own
    # pod only, the one its `up` series names.
    other = {"namespace": "batch", "pod": "train-0"} if case == "names another pod" else {}
    prometheus.answers["attribution"] = [Element({**node_b, "namespace": "gpu", "pod": "dcgm-b", **other}, 1)]
    prometheus.answers["up"] = [
        Element({**e.labels, "namespace": "gpu", "pod": "dcgm-b"}, e.value)
        for e in up_elements("node-b:9400", 0 if case == "down" else 1, age=0.5)
    ]
    now[0] = 1001.0
    assert await source.collect_once("llm")
    view = store.view("llm", 1001.0, 4.0, SourceKind.PROMETHEUS)
    assert view.sources == sources_left
    if case == "names another pod":  # still scraped, naming pods but not it: the pod is gone
        assert view.recently_seen == {}
        return
    # Down, or naming no pod at all: once its last data is stale, the pod is missing, and the problem says why
    assert [r.pod for r in view.readings] == ["vllm-0", "vllm-1"]  # its last data is 1.5 s old
    later = store.view("llm", 1005.0, 4.0, SourceKind.PROMETHEUS)
    why = "up 0 for dcgm/node-b:9400" if case == "down" else "an attribution outage"
    assert why in later.recently_seen["vllm-1"], later.recently_seen


def up_elements(instance: str, value: float, age: float) -> list[Element]:
    """One `up` sample as values_and_times answers it: the value and, in the same answer, its time."""
    labels = {"job": "dcgm", "instance": instance}
    return [
        Element({"__name__": "up", **labels}, value),
        Element({**labels, TIMESTAMP_LABEL: "1"}, WALL - age),
    ]


@pytest.mark.parametrize(
    ("up", "missing_after_an_hour"),
    [
        ([], None),  # Prometheus dropped the target (its node went away): its pods went with it
        ([(0, 0.5)], "up 0 for dcgm/node-b:9400"),  # down, however long: its pods stay missing
        ([(1, 0.5)], "its page has no GPU exporter series"),  # answers, without GPU series: failing
        ([(1, 120.0)], "Prometheus has not scraped dcgm/node-b:9400"),  # no scrape within the window
    ],
)
async def test_a_vanished_exporter_is_decided_by_up_however_long_it_lasts(
    up: list[tuple[float, float]], missing_after_an_hour: str | None
) -> None:
    prometheus, store, now = ScriptedPrometheus(), Store(), [1000.0]
    source = await node_b_vanishes(prometheus, store, now)
    prometheus.answers["liveness"] = []  # no GPU series of node-b at all
    prometheus.answers["up"] = [e for value, age in up for e in up_elements("node-b:9400", value, age)]
    for minute in range(1, 61):  # an hour of collections (the rule used to forget after 5 minutes)
        now[0] = 1000.0 + 60 * minute
        assert await source.collect_once("llm")
    view = store.view("llm", now[0], 4.0, SourceKind.PROMETHEUS)
    if missing_after_an_hour is None:
        assert view.recently_seen == {} and view.sources == 2
    else:
        assert missing_after_an_hour in view.recently_seen["vllm-1"]


async def test_empty_namespace_is_zero_only_when_prometheus_has_gpu_series() -> None:
    prometheus, store = ScriptedPrometheus(), Store()
    assert not await collector(prometheus, store).collect_once("llm")
    view = store.view("llm", 1000.0, 4.0, SourceKind.PROMETHEUS)
    assert view.fresh_sources == 0
    assert "holds no current series of any GPU exporter family" in view.problems[0]
    prometheus.answers["fleet"] = [Element({}, 1)]
    prometheus.answers["exporters down"] = [Element({"job": "dcgm", "instance": "node-b:9400"}, 0)]
    assert not await collector(prometheus, store).collect_once("llm")  # node-b's pods may be there
    view = store.view("llm", 1000.0, 4.0, SourceKind.PROMETHEUS)
    assert "scrape target is down in Prometheus (up 0): dcgm/node-b:9400" in view.problems[0]
    prometheus.answers["exporters down"] = []
    assert await collector(prometheus, store).collect_once("llm")
    view = store.view("llm", 1000.0, 4.0, SourceKind.PROMETHEUS)
    assert (view.fresh_sources, view.readings) == (1, ())


# ---- settings -------------------------------------------------------------------------------------


def settings_error(**values: Any) -> str:
    with pytest.raises(SettingsError) as raised:
        build_settings(values)
    return str(raised.value)


def test_default_source_follows_the_configuration() -> None:
    url = "http://prometheus:9090"
    assert build_settings({}).default_source == "scrape"
    assert build_settings({"prometheus_url": url}).default_source == "prometheus"
    assert build_settings(
        {"prometheus_url": url, "exporter_url": ["http://n:9400/metrics"]}
    ).default_source == ("scrape")
    assert build_settings({"prometheus_url": url + "/", "default_source": "scrape"}).prometheus_url == url
    assert "needs --prometheus-url" in settings_error(default_source="prometheus")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"prometheus_url": "prometheus:9090"}, "not an http(s) URL"),
        ({"prometheus_url": "http://u:p@prometheus:9090"}, "no credentials in the URL"),
        ({"prometheus_url": "http://prometheus:9090/api/v1/query"}, "base URL"),
        ({"prometheus_username": "u"}, "needs a password"),
        ({"prometheus_url": "http://p", "prometheus_username": "u"}, "needs a password"),
        ({"prometheus_url": "http://p", "prometheus_password": "x"}, "--prometheus-username is not"),
        ({"prometheus_url": "http://p", "prometheus_ca_file": "/nonexistent"}, "no such file"),
        ({"prometheus_url": "http://p", "prometheus_cert_file": "/etc/hostname"}, "given together"),
        ({"prometheus_url": "http://p", "prometheus_header": ["no colon"]}, "not `Name: value`"),
        ({"prometheus_url": "http://p", "prometheus_header": ["Bad Name: v"]}, "not `Name: value`"),
        ({"prometheus_url": "http://p", "prometheus_timeout": "0"}, "--prometheus-timeout"),
        ({"prometheus_header": ["X-Scope-OrgID: a"]}, "--prometheus-header needs --prometheus-url"),
    ],
)
def test_bad_prometheus_settings(values: dict[str, Any], message: str) -> None:
    assert message in settings_error(**values)


def test_credentials_and_headers(tmp_path: Path) -> None:
    token, password = tmp_path / "token", tmp_path / "password"
    token.write_text("t")
    password.write_text("p")
    url = "https://prometheus:9090"
    assert "not both" in settings_error(
        prometheus_url=url,
        prometheus_username="u",
        prometheus_password_file=str(password),
        prometheus_bearer_token_file=str(token),
    )
    assert "conflicts" in settings_error(
        prometheus_url=url,
        prometheus_bearer_token_file=str(token),
        prometheus_header=["Authorization: Basic x"],
    )
    settings = build_settings(
        {
            "prometheus_url": url,
            "prometheus_header": ["X-Scope-OrgID: team-a\nX-Api-Key: secret-key", "Accept-Encoding: gzip"],
            "prometheus_username": "u",
            "prometheus_password": "secret-password",
        }
    )
    assert settings.prometheus_headers == (
        ("X-Scope-OrgID", "team-a"),
        ("X-Api-Key", "secret-key"),
        ("Accept-Encoding", "gzip"),
    )
    assert "secret" not in repr(settings)


def test_password_only_from_the_environment() -> None:
    values = env_values({PROMETHEUS_PASSWORD_ENV: "from-env", "KEDA_GPU_SCALER_PROMETHEUS_USERNAME": "u"})
    assert values["prometheus_password"] == "from-env"
    settings = build_settings(values | {"prometheus_url": "http://p"})
    assert (settings.prometheus_username, settings.prometheus_password) == ("u", "from-env")


async def test_a_server_without_sample_times_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    prometheus, store = ScriptedPrometheus(), Store()
    prometheus.answers["namespace"] = elements_of(gpu("vllm-0", 40, age=0.0))
    source = collector(prometheus, store)
    assert await source.collect_once("llm")
    assert await source.collect_once("llm")
    assert [r.message for r in caplog.records].count(
        "the Prometheus API reports every sample as taken at the query time: the age of its data cannot be"
        " checked against --max-staleness"
    ) == 1


@pytest.mark.parametrize("purpose", ["fleet", "liveness"])
@pytest.mark.parametrize(
    "body", [b"[" * 100_000, b'{"status":"success","pad":"' + b"x" * 300 + b'"}'], ids=["too-deep", "no-data"]
)
async def test_a_failed_fleet_or_liveness_answer_is_a_recorded_failure(purpose: str, body: bytes) -> None:
    prometheus, store = ScriptedPrometheus(), Store()
    with pytest.raises(PrometheusError) as raised:
        parse_vector(body)
    prometheus.failures[purpose] = raised.value
    now = [1000.0]
    source = collector(prometheus, store, now)
    if purpose == "liveness":  # asked about an exporter whose series vanished from the answer
        prometheus.answers["namespace"] = elements_of(gpu("vllm-0", 40, age=0.5))
        assert await source.collect_once("llm")
        prometheus.answers["namespace"] = []
    assert not await source.collect_once("llm")
    assert prometheus.asked[-1] == purpose
    later = store.view("llm", 1005.0, 4.0, SourceKind.PROMETHEUS)
    assert any(str(raised.value) in problem for problem in later.problems), later.problems


class FailingPrometheus(ScriptedPrometheus):
    async def query(self, promql: str, at: float, purpose: str) -> list[Element]:
        raise PrometheusError("Cannot connect to host prometheus:9090")


async def test_retry_delay_is_capped_however_long_prometheus_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exponential at first, then never more than MAX_BACKOFF_INTERVALS intervals: Prometheus coming back
    is seen soon, and thousands of failures in a row neither overflow nor end the namespace's loop."""
    delays: list[float] = []
    enough = asyncio.Event()

    def no_wait(delay: float) -> float:
        delays.append(delay)
        if len(delays) >= 1_100:  # past 2 ** 1024, which no float holds
            enough.set()
        return 0.0

    monkeypatch.setattr(prometheus_module, "jittered", no_wait)
    store = Store()
    source = collector(FailingPrometheus(), store)
    loop = asyncio.create_task(source._loop("llm", source.collect_once, "collection"))
    await asyncio.wait([loop, asyncio.create_task(enough.wait())], return_when=asyncio.FIRST_COMPLETED)
    assert not loop.done(), loop
    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop
    assert delays[:4] == [1.0, 2.0, MAX_BACKOFF_INTERVALS, MAX_BACKOFF_INTERVALS]
    assert max(delays) == MAX_BACKOFF_INTERVALS


async def test_a_bug_in_one_collection_is_logged_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    prometheus, store = ScriptedPrometheus(), Store()
    prometheus.answers["namespace"] = elements_of(gpu("vllm-0", 40, age=0.5))
    wanted = WantedSources()
    source = PrometheusCollector(
        client=prometheus,  # type: ignore[arg-type]
        store=store,
        wanted=wanted,
        interval=0.01,
        max_staleness=4.0,
        clock=lambda: 1000.0,
        wall_clock=lambda: WALL,
    )
    collect_once = source.collect_once
    broken = [True]

    async def broken_once(namespace: str) -> bool:
        if broken.pop() if broken else False:
            raise RuntimeError("a bug in the namespace loop")
        return await collect_once(namespace)

    source.collect_once = broken_once  # type: ignore[method-assign]
    wanted.want("trigger", [PrometheusQuery("gpu", "llm")])
    source.start()
    try:
        async with asyncio.timeout(30):
            await prometheus.heard.wait()
    finally:
        await source.stop()
    assert any(r.exc_info and "a bug in the namespace loop" in str(r.exc_info[1]) for r in caplog.records)
    assert prometheus.asked[0] == "namespace"  # collected after the failure


async def test_a_round_s_evaluation_time_is_taken_once_its_namespace_has_a_slot() -> None:
    """Time spent waiting for a slot (other rounds of the namespace hold them) is not the data's age:
    the round's page is as old as its samples when the round runs, not when it began to wait."""
    prometheus, store = ScriptedPrometheus(), Store()
    prometheus.slots = FairSlots(0, own=1)
    prometheus.answers["namespace"] = elements_of(gpu("vllm-0", 40, age=0.5))
    pages: list[float] = []
    store.page_listeners.append(
        lambda kind, page: pages.append(page.collected_at) if page.by_namespace else None
    )
    now = [1000.0]
    wanted = WantedSources()
    source = collector(prometheus, store, now)
    source._wanted = wanted
    wanted.want("trigger", [PrometheusQuery("gpu", "llm")])
    try:
        async with prometheus.slot("llm"):  # another round of the namespace, in flight
            source.start()
            await eventually(lambda: _waits_for_a_slot(prometheus))
            now[0] = 1010.0
        await eventually(lambda: _recorded(pages))
    finally:
        await source.stop()
    # Its samples were 0.5 s old when the round ran, at 1010; it had waited since 1000.
    assert pages[0] == 1009.5


async def _waits_for_a_slot(prometheus: ScriptedPrometheus) -> None:
    assert prometheus.slots.waiting == 1


async def _recorded(pages: list[float]) -> None:
    assert pages


# ---- inference-server series (SPEC §6) ------------------------------------------------------------


def test_inference_query_names_every_engine_family_with_both_pod_label_pairs() -> None:
    query = inference_query('llm"} or up{x="', None)
    quoted = 'llm\\"} or up{x=\\"'
    assert f'{{__name__=~"{any_of(ENGINE_SAMPLE_NAMES)}",namespace="{quoted}",pod!=""}}' in query
    assert (
        f'{{__name__=~"{any_of(ENGINE_SAMPLE_NAMES)}",exported_namespace="{quoted}",exported_pod!=""}}'
        in query
    )
    # Colons are legal in metric names and no RE2 metacharacter: the names go in as they are.
    assert 'timestamp({__name__="vllm:num_requests_waiting",namespace="' in query
    assert 'timestamp({__name__="sglang:num_queue_reqs",exported_namespace="' in query
    # And `up` of every target naming a pod of the namespace: a pod down since the start has no other series.
    assert 'timestamp({__name__="up",namespace="' in query
    assert query.count("timestamp(") == len(ENGINE_SAMPLE_NAMES) * 2 + 1
    assert query.endswith(f'"{TIMESTAMP_LABEL}", "1", "", "")')


def test_inference_query_asks_for_every_spelling_and_the_newer_engines() -> None:
    query = inference_query("llm", None)
    for name in (
        "sglang:num_queue_reqs",
        "sglang_num_queue_reqs",  # as sgl-router prints it and an escaping Prometheus 3 stores it
        "sglang_num_running_reqs",
        "sglang_token_usage",
        LLAMACPP.waiting.name,
        LLAMACPP.running.name,
        LLAMACPP.kv_cache.name,
        TRTLLM_SERVE.waiting.name,
        TRTLLM_SERVE.running.name,
        TRTLLM_SERVE.kv_cache.name,
    ):
        assert f'timestamp({{__name__="{name}",namespace="llm",pod!=""}})' in query, name


ENGINE_LOADS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=300).map(float),
        st.integers(min_value=0, max_value=300).map(float),
        st.integers(min_value=0, max_value=1000).map(lambda n: n / 1000),
    ),
    min_size=1,
    max_size=4,
)


def as_prometheus_answers(text: str, pod: str, age: float) -> list[Sample]:
    """A pod's page as an instant query returns it: Kubernetes SD labels added, stamped with its scrape time."""
    labels = {"namespace": "llm", "pod": pod, "job": "serving", "instance": f"{pod}:30000"}
    at = round((WALL - age) * 1000)
    return [
        sample._replace(labels={**sample.labels, **labels}, timestamp_ms=at)
        for sample in parse_exposition(text, ENGINE_SAMPLE_NAMES)
    ]


@given(loads=ENGINE_LOADS, tp_size=st.integers(min_value=1, max_value=3), spelling=st.sampled_from(":_b"))
def test_sglang_through_prometheus_reads_as_its_own_page_in_either_spelling(
    loads: list[tuple[float, float, float]], tp_size: int, spelling: str
) -> None:
    """Prometheus 2 keeps `sglang:`; a Prometheus 3 escaping names (or sgl-router) gives `sglang_`; a
    page may carry both. Each is read as the server's own page."""
    own = simulated.sglang_page("llama", loads, tp_size=tp_size)
    underscore = own.replace("sglang:", "sglang_")
    stored = {":": own, "_": underscore, "b": own + underscore}[spelling]
    ((_, series),) = inference_pods(
        as_prometheus_answers(stored, "sglang-0", age=0.5), "llm", WALL, 2.0, None
    ).by_pod
    expected = pod_reading(parse_exposition(own, ENGINE_SAMPLE_NAMES))
    assert expected.engine is Engine.SGLANG
    assert pod_reading(series) == expected


@given(running=st.integers(0, 300), waiting=st.integers(0, 300), kv=st.integers(0, 1000))
def test_llamacpp_and_trtllm_serve_through_prometheus_read_their_gauges(
    running: int, waiting: int, kv: int
) -> None:
    llama = f"{LLAMACPP.running.name} {running}\n{LLAMACPP.waiting.name} {waiting}\n{LLAMACPP.kv_cache.name} {kv / 1000}\n"
    model = 'model_name="llama"'
    serve = (
        f"{TRTLLM_SERVE.running.name}{{{model}}} {running}.0\n{TRTLLM_SERVE.waiting.name}{{{model}}} {waiting}.0\n"
        f"{TRTLLM_SERVE.kv_cache.name}{{{model}}} {kv / 1000}\n"
    )
    samples = as_prometheus_answers(llama, "llama-0", age=0.5) + as_prometheus_answers(
        serve, "serve-0", age=0.5
    )
    pods = {
        pod: pod_reading(series) for pod, series in inference_pods(samples, "llm", WALL, 2.0, None).by_pod
    }
    assert {pod: (r.engine, r.running, r.waiting) for pod, r in pods.items()} == {
        "llama-0": (Engine.LLAMACPP, running, waiting),
        "serve-0": (Engine.TRTLLM, running, waiting),
    }
    assert pods["llama-0"].kv_cache == pytest.approx(kv / 10)
    assert pods["serve-0"].kv_cache == pytest.approx(kv / 10)


def test_family_patterns_match_exactly_the_names_colons_and_dots_included() -> None:
    pattern = any_of([*ENGINE_SAMPLE_NAMES, "a:b.c"])
    assert "a:b\\.c" in pattern and "vllm:num_requests_waiting" in pattern
    for name in [*ENGINE_SAMPLE_NAMES, "a:b.c"]:
        assert re.fullmatch(pattern, name)
    for other in ["a:bxc", "vllm:num_requests_waiting_by_reason", "vllm_num_requests_waiting", "vllm:"]:
        assert re.fullmatch(pattern, other) is None


def vllm(pod: str, running: float, waiting: float, age: float, **labels: str) -> list[Sample]:
    """One vLLM pod's series as Prometheus' Kubernetes SD labels them (namespace/pod of the pod scraped)."""
    common = {
        "engine": "0",
        "model_name": "llama",
        "namespace": "llm",
        "pod": pod,
        "job": "vllm",
        "instance": f"{pod}:8000",
        **labels,
    }
    at = round((WALL - age) * 1000)
    return [
        Sample("vllm:num_requests_running", common, running, at),
        Sample("vllm:num_requests_waiting", common, waiting, at),
        Sample("vllm:kv_cache_usage_perc", common, 0.5, at),
    ]


def test_inference_series_grouped_by_pod() -> None:
    samples = [
        *vllm("vllm-1", 2, 1, age=0.5),
        *vllm("vllm-0", 5, 0, age=1.5),
        # Through a federation: the workload's labels are exported_*, read first.
        *vllm("fed-0", 1, 1, age=0.5, exported_namespace="llm", exported_pod="fed-0", namespace="monitoring"),
        # exported_* naming another namespace: not this namespace's pod, whatever namespace/pod say.
        *vllm("vllm-0", 9, 9, age=0.5, exported_namespace="other", exported_pod="x", instance="x"),
        Sample("vllm:num_requests_running", {"namespace": "llm", "pod": ""}, 7, round(WALL * 1000)),
        Sample("DCGM_FI_DEV_GPU_UTIL", {"namespace": "llm", "pod": "vllm-0"}, 7, round(WALL * 1000)),
    ]
    found = inference_pods(samples, "llm", WALL, 2.0, None)
    assert [pod for pod, _ in found.by_pod] == ["fed-0", "vllm-0", "vllm-1"]
    _, vllm_0 = found.by_pod[1]
    assert [s.name for s in vllm_0] == [
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
    ]
    assert [s.value for s in vllm_0] == [0.5, 5, 0]
    assert found.oldest == WALL - 1.5
    assert found.stale == ()
    # Prometheus' order is not kept: the same series give an equal page (the store wakes nobody).
    assert inference_pods(list(reversed(samples)), "llm", WALL, 2.0, None) == found


def test_stale_inference_series_and_pods_are_left_out() -> None:
    samples = [
        *vllm("vllm-0", 5, 0, age=0.5),
        *vllm("vllm-1", 2, 1, age=10.0),  # Prometheus' lookback still shows its last scrape
        # One data-parallel engine of vllm-2 is stale: its old numbers are not used, the other's are.
        *vllm("vllm-2", 3, 0, age=0.5),
        *vllm("vllm-2", 4, 4, age=10.0, engine="1"),
    ]
    found = inference_pods(samples, "llm", WALL, 2.0, None)
    assert [pod for pod, _ in found.by_pod] == ["vllm-0", "vllm-2"]
    assert {s.labels["engine"] for s in found.by_pod[1][1]} == {"0"}
    assert found.stale == ("vllm-1",)
    assert found.oldest == WALL - 0.5
    assert inference_pods([], "llm", WALL, 2.0, None).oldest is None


def inference_view(store: Store, now: float) -> Any:
    return store.view("llm", now, 4.0, SourceKind.PROMETHEUS_INFERENCE)


async def test_inference_page_per_namespace_as_old_as_its_samples() -> None:
    prometheus, store = ScriptedPrometheus(), Store()
    prometheus.answers["inference"] = elements_of(
        vllm("vllm-0", 5, 0, age=2.0) + vllm("vllm-1", 2, 1, age=0.5) + vllm("vllm-2", 1, 1, age=10.0)
    )
    assert await collector(prometheus, store).collect_inference_once("llm")
    assert prometheus.asked == ["inference"]  # one query per namespace and collection
    (state,) = [s for s in store.sources() if s.kind is SourceKind.PROMETHEUS_INFERENCE]
    assert (
        (state.source, state.namespace)
        == (inference_source("llm"), "llm")
        == ("prometheus-inference:llm", "llm")
    )
    view = inference_view(store, 1000.0)
    pods: list[PodSamples] = list(view.readings)  # type: ignore[arg-type]
    assert [p.pod for p in pods] == ["vllm-0", "vllm-1"]  # vllm-2's data is 10 s old: a pod without data
    assert {s.name: s.value for s in pods[0].samples}["vllm:num_requests_running"] == 5
    # The GPU kind's view is not touched.
    assert store.view("llm", 1000.0, 4.0, SourceKind.PROMETHEUS).sources == 0
    # Collected "now" but its oldest sample is 2 s old: stale 2 s later, not 4.
    assert inference_view(store, 1002.5).readings == ()
    assert "last data 4.5s old" in inference_view(store, 1002.5).problems[0]


async def test_no_inference_series_is_a_page_without_pods_and_a_failure_is_recorded() -> None:
    prometheus, store = ScriptedPrometheus(), Store()
    source = collector(prometheus, store)
    assert await source.collect_inference_once("llm")
    view = inference_view(store, 1000.0)
    assert (view.fresh_sources, view.sources, view.readings, view.problems) == (1, 1, (), ())
    prometheus.answers["inference"] = elements_of(vllm("vllm-0", 5, 0, age=0.5))
    assert await source.collect_inference_once("llm")
    prometheus.failures["inference"] = PrometheusError("HTTP 503 Service Unavailable")
    assert not await source.collect_inference_once("llm")
    later = inference_view(store, 1005.0)
    assert later.fresh_sources == 0
    assert later.problems == ("prometheus-inference:llm: HTTP 503 Service Unavailable; last data 5.5s old",)
    # Its pods were seen: they count as missing ones while Prometheus fails.
    assert list(later.recently_seen) == ["vllm-0"]


async def test_inference_interest_starts_and_ends_a_namespace_loop() -> None:
    prometheus, store = ScriptedPrometheus(), Store()
    prometheus.answers["inference"] = elements_of(vllm("vllm-0", 5, 0, age=0.5))
    now = [1000.0]
    source = collector(prometheus, store, now)
    source._wanted.want("trigger", [PrometheusQuery(INFERENCE_SERIES, "llm")])
    source.start()
    try:
        async with asyncio.timeout(30):
            await prometheus.heard.wait()
        assert prometheus.asked[0] == "inference"  # the GPU loop is not started by this key

        async def stored() -> None:
            assert [p.pod for p in inference_view(store, now[0]).readings] == ["vllm-0"]  # type: ignore[attr-defined]

        await eventually(stored, timeout=30)
        # No trigger asks any more: the loop ends and its source goes.
        source._wanted.release("trigger")

        async def gone() -> None:
            assert not any(s.kind is SourceKind.PROMETHEUS_INFERENCE for s in store.sources())

        await eventually(gone, timeout=30)
    finally:
        await source.stop()
    assert "namespace" not in prometheus.asked


# ---- pods that leave a namespace's inference page: missing or gone ---------------------------------


def test_up_query_asks_by_the_pods_and_by_their_scrape_targets() -> None:
    query = up_query('ll"m', ["vllm-0", "vllm.1"], [("vllm", "10.0.0.1:8000"), ("", "")])
    assert 'namespace="ll\\"m",pod=~"vllm-0|vllm\\\\.1"' in query
    assert 'exported_namespace="ll\\"m",exported_pod=~"vllm-0|vllm\\\\.1"' in query
    assert 'job=~"vllm",instance=~"10\\\\.0\\\\.0\\\\.1:8000"' in query
    assert 'timestamp({__name__="up",' in query and "vllm:" not in query
    # Series without job/instance add no branch matching every target.
    assert 'job=~""' not in up_query("llm", ["vllm-0"], [("", "")])


def up(pod: str, value: float, age: float = 0.5, **labels: str) -> list[Sample]:
    """Prometheus' `up` of the pod's scrape target, with the target labels Kubernetes discovery gives."""
    target = {"job": "vllm", "instance": f"{pod}:8000", "namespace": "llm", "pod": pod, **labels}
    return [Sample("up", target, value, round((WALL - age) * 1000))]


def test_up_series_and_the_targets_that_served_each_pod() -> None:
    samples = [*vllm("vllm-0", 1, 0, age=0.5), *vllm("vllm-1", 1, 0, age=30.0), *up("vllm-0", 1)]
    assert inference_pods(samples, "llm", WALL, 2.0, None).targets == {
        "vllm-0": frozenset({("vllm", "vllm-0:8000")}),
        "vllm-1": frozenset({("vllm", "vllm-1:8000")}),  # stale series name their target too
    }
    assert inference_pods(samples, "other", WALL, 2.0, None).targets == {}
    assert up_series(samples) == [Up(("vllm", "vllm-0:8000"), 1, WALL - 0.5, ("llm", "vllm-0"))]


TARGET = ("vllm", "vllm-1:8000")


def decide(stale: bool, ups: list[Sample], targets: tuple[tuple[str, str], ...] = (TARGET,)) -> str | None:
    return lost_pod("llm", "vllm-1", targets, stale, up_series(ups), WALL, 2.0)


def test_a_lost_pod_is_missing_while_its_target_is_there_and_gone_with_it() -> None:
    # Its scrape fails: the server stopped (Prometheus marked its series stale).
    assert "up 0 for vllm/vllm-1:8000" in (decide(False, up("vllm-1", 0)) or "")
    # Timestamps frozen: scraped fine, series too old.
    assert "stopped updating" in (decide(True, up("vllm-1", 1)) or "")
    # Scraped fine but its page has no engine series: a failed page, not an empty one (SPEC §4).
    assert "no series of a known inference server" in (decide(False, up("vllm-1", 1)) or "")
    # Not scraped within the window (the up sample itself is old).
    assert "has not scraped vllm/vllm-1:8000 for 30s" in (decide(False, up("vllm-1", 1, age=30.0)) or "")
    # No `up` left: service discovery dropped the target, the pod was deleted. Frozen series of a
    # target that is gone do not keep it either.
    assert decide(False, []) is None
    assert decide(True, []) is None
    # Another pod's target does not speak for it.
    assert decide(False, up("vllm-2", 0)) is None


def test_a_lost_pod_behind_a_metrics_proxy() -> None:
    """Its series named it by exported_*; the scrape target (the proxy) names itself."""
    proxy = up("metrics-proxy-0", 0, instance="vllm-1:8000", namespace="gateway")
    assert "up 0" in (decide(False, proxy) or "")  # the proxy is down: its pods are missing
    proxy = up("metrics-proxy-0", 1, instance="vllm-1:8000", namespace="gateway")
    # Scraped fine and no longer showing the pod: the pod is gone; still showing it, but frozen: missing.
    assert decide(False, proxy) is None
    assert "stopped updating" in (decide(True, proxy) or "")


def test_a_lost_pod_found_by_its_name_on_a_new_target() -> None:
    """A StatefulSet pod recreated under its name at a new address: that target speaks for it."""
    restarted = up("vllm-1", 0, instance="10.0.0.9:8000")
    assert "up 0 for vllm/10.0.0.9:8000" in (decide(False, restarted) or "")
    # The old address went away, the new one is down: still one missing pod.
    assert decide(False, [*restarted, *up("vllm-2", 1, instance="vllm-1:8000")]) is not None


def pod_view(store: Store, now: float = 1000.0) -> Any:
    return store.view("llm", now, 4.0, SourceKind.PROMETHEUS_INFERENCE)


async def test_a_pod_that_leaves_the_page_is_missing_until_its_target_goes() -> None:
    prometheus, store = ScriptedPrometheus(), Store()
    source = collector(prometheus, store)
    prometheus.answers["inference"] = elements_of(
        vllm("vllm-0", 5, 0, age=0.5) + vllm("vllm-1", 2, 1, age=0.5)
    )
    assert await source.collect_inference_once("llm")
    assert prometheus.asked == ["inference"]  # nobody left the page: `up` is not asked
    # vllm-1's server stops: Prometheus marks its series stale and its `up` is 0.
    prometheus.answers["inference"] = elements_of(vllm("vllm-0", 5, 0, age=0.5))
    prometheus.answers["up"] = elements_of(up("vllm-1", 0))
    assert await source.collect_inference_once("llm")
    assert prometheus.asked[-1] == "up"
    view = pod_view(store)
    assert [p.pod for p in view.readings] == ["vllm-0"]
    assert list(view.recently_seen) == ["vllm-1"]  # a missing pod for the evaluator, not a vanished one
    # Its page's problem is its own: said to the triggers that read vllm-1, not to the whole namespace.
    assert view.pod_problems == {
        "vllm-1": "prometheus-inference:llm/vllm-1: its server does not answer Prometheus' scrapes"
        " (up 0 for vllm/vllm-1:8000)"
    }
    assert view.problems == ()
    (state,) = [s for s in store.sources() if s.source == pod_inference_source("llm", "vllm-1")]
    assert (state.kind, state.namespace, state.pod) == (SourceKind.PROMETHEUS_INFERENCE, "llm", "vllm-1")
    # However long it lasts.
    assert await source.collect_inference_once("llm")
    assert list(pod_view(store, 1000.0).recently_seen) == ["vllm-1"]
    # Its target goes from service discovery (the pod was deleted): it stops counting, and is not asked
    # about any more.
    prometheus.answers["up"] = []
    assert await source.collect_inference_once("llm")
    view = pod_view(store)
    assert (view.recently_seen, view.problems, view.sources) == ({}, (), 1)
    asked = len(prometheus.asked)
    assert await source.collect_inference_once("llm")
    assert prometheus.asked[asked:] == ["inference"]


async def test_a_missing_pod_with_fresh_series_again_counts_as_reporting() -> None:
    prometheus, store = ScriptedPrometheus(), Store()
    source = collector(prometheus, store)
    both = elements_of(vllm("vllm-0", 5, 0, age=0.5) + vllm("vllm-1", 2, 1, age=0.5))
    prometheus.answers["inference"] = both
    assert await source.collect_inference_once("llm")
    # Frozen timestamps: its series are still answered, too old; it is still scraped.
    prometheus.answers["inference"] = elements_of(
        vllm("vllm-0", 5, 0, age=0.5) + vllm("vllm-1", 2, 1, age=30)
    )
    prometheus.answers["up"] = elements_of(up("vllm-1", 1))
    assert await source.collect_inference_once("llm")
    assert "stopped updating" in pod_view(store).recently_seen["vllm-1"]
    prometheus.answers["inference"] = both
    assert await source.collect_inference_once("llm")
    view = pod_view(store)
    assert ([p.pod for p in view.readings], view.recently_seen, view.sources) == (["vllm-0", "vllm-1"], {}, 1)


async def test_pods_never_on_the_page_get_no_source_and_failures_keep_the_missing_ones() -> None:
    prometheus, store = ScriptedPrometheus(), Store()
    source = collector(prometheus, store)
    # vllm-1 is stale from the start (seen before this server started): nothing to remember it by.
    prometheus.answers["inference"] = elements_of(
        vllm("vllm-0", 5, 0, age=0.5) + vllm("vllm-1", 2, 1, age=30)
    )
    prometheus.answers["up"] = elements_of(up("vllm-1", 0))
    assert await source.collect_inference_once("llm")
    assert "up" not in prometheus.asked and pod_view(store).sources == 1
    # vllm-0 leaves the page and `up` cannot be asked: Prometheus is failing, said on the namespace's
    # source (whose last page, vllm-0 on it, ages into recently seen as before).
    prometheus.answers["inference"] = []
    prometheus.failures["up"] = PrometheusError("HTTP 503 Service Unavailable")
    assert not await source.collect_inference_once("llm")
    later = pod_view(store, 1005.0)
    assert later.problems[0].startswith("prometheus-inference:llm: HTTP 503")
    assert list(later.recently_seen) == ["vllm-0"]


async def test_the_pods_own_sources_go_with_the_namespace_loop() -> None:
    prometheus, store = ScriptedPrometheus(), Store()
    prometheus.answers["inference"] = elements_of(
        vllm("vllm-0", 5, 0, age=0.5) + vllm("vllm-1", 2, 1, age=0.5)
    )
    now = [1000.0]
    source = collector(prometheus, store, now)
    source._wanted.want("trigger", [PrometheusQuery(INFERENCE_SERIES, "llm")])
    source.start()
    try:

        async def both() -> None:
            assert len(pod_view(store, now[0]).readings) == 2

        await eventually(both, timeout=30)
        prometheus.answers["up"] = elements_of(up("vllm-1", 0))
        prometheus.answers["inference"] = elements_of(vllm("vllm-0", 5, 0, age=0.5))

        async def missing() -> None:
            assert list(pod_view(store, now[0]).recently_seen) == ["vllm-1"]

        await eventually(missing, timeout=30)
        source._wanted.release("trigger")  # no trigger asks any more

        async def gone() -> None:
            assert not any(s.kind is SourceKind.PROMETHEUS_INFERENCE for s in store.sources())

        await eventually(gone, timeout=30)
    finally:
        await source.stop()
    assert source._inference_pods == {} and source._inference_missing == {}


# --- the gateway's queue (metric pending) through Prometheus ------------------------------------------------


def test_gateway_query_names_the_pool_and_its_namespace_only() -> None:
    text = gateway_query("llm", "chat.pool")
    assert 'namespace="llm"' in text
    # The pool as its name or as namespace/name, each a literal (a dot is no wildcard).
    assert 'inference_pool=~"chat\\\\.pool|llm/chat\\\\.pool"' in text
    assert (
        "llm_d_epp_flow_control_queue_size" in text and "inference_extension_flow_control_queue_size" in text
    )


def test_gateway_replicas_group_by_pod_and_leave_out_old_series_and_other_namespaces() -> None:
    at = 1000.0
    queue = "llm_d_epp_flow_control_queue_size"

    def series(pod: str, value: float, age: float, namespace: str = "llm") -> Sample:
        labels = {
            "namespace": namespace,
            "pod": pod,
            "inference_pool": "chat-pool",
            "job": "epp",
            "instance": pod,
        }
        return Sample(queue, labels, value, round((at - age) * 1000))

    found = gateway_replicas(
        [series("epp-0", 3, 1), series("epp-1", 2, 60), series("epp-2", 9, 1, namespace="other")],
        "llm",
        at,
        window=10,
    )
    assert [(replica, [s.value for s in series]) for replica, series in found.by_pod] == [("epp-0", [3])]
    assert found.stale == ("epp-1",)  # old values are never used: the caller decides what it means
    assert set(found.targets) == {"epp-0", "epp-1"}
    assert found.oldest == at - 1


async def test_an_epp_replica_scraped_without_its_queue_is_lost_in_the_endpoint_picker_s_words() -> None:
    prometheus, store = ScriptedPrometheus(), Store()
    labels = {
        "namespace": "llm",
        "pod": "epp-0",
        "inference_pool": "chat-pool",
        "job": "epp",
        "instance": "epp-0",
    }
    queue = Sample("llm_d_epp_flow_control_queue_size", labels, 3, round((WALL - 0.5) * 1000))
    prometheus.answers["gateway"] = elements_of([queue])
    source = collector(prometheus, store)
    assert await source.collect_gateway_once("llm", "chat-pool")
    # Still scraped (up 1, naming the pod), but its page has no queue any more: a replica that cannot be
    # read, said as an endpoint picker's page, not an inference server's.
    prometheus.answers["gateway"] = []
    prometheus.answers["up"] = elements_of([Sample("up", labels, 1, round((WALL - 0.5) * 1000))])
    assert await source.collect_gateway_once("llm", "chat-pool")
    state = store.source(gateway_source("llm", "chat-pool"))
    assert state is not None and state.last_page is not None
    (lost,) = state.last_page.by_namespace["llm"]
    assert isinstance(lost, ReplicaLost) and lost.replica == "epp-0"
    assert "no series of the endpoint picker's flow-control queue" in lost.reason, lost.reason


def test_an_answer_marked_partial_is_refused() -> None:
    """VictoriaMetrics' cluster answers with the reachable storage nodes' series, marked isPartial: part of
    the data would look like pods gone."""
    body = {"status": "success", "isPartial": True, "data": {"resultType": "vector", "result": []}}
    with pytest.raises(PrometheusError, match="partial"):
        parse_vector(json.dumps(body).encode())


@pytest.mark.parametrize("when", [float("nan"), float("inf")])
def test_a_sample_time_that_is_no_time_is_a_prometheus_error(when: float) -> None:
    labels = {"namespace": "llm", "pod": "vllm-0"}
    elements = [
        Element({"__name__": "DCGM_FI_DEV_GPU_UTIL", **labels}, 40.0),
        Element({**labels, TIMESTAMP_LABEL: "1"}, when),
    ]
    with pytest.raises(PrometheusError, match="not a time"):
        samples_with_times(elements)


async def test_a_round_failing_the_same_unexpected_way_logs_its_traceback_once(  # type: ignore[no-untyped-def]
    monkeypatch, caplog
) -> None:
    # Logged at every round (every 1–3 intervals) for as long as the bug lasted; a new reason is said again.
    import logging

    monkeypatch.setattr(prometheus_module, "jittered", lambda delay: 0.001)
    rounds: list[int] = []

    async def buggy(namespace: str) -> bool:
        rounds.append(1)
        raise RuntimeError("a bug" if len(rounds) < 10 else "another bug")

    caplog.set_level(logging.INFO, logger=prometheus_module.__name__)
    task = asyncio.create_task(collector(ScriptedPrometheus(), Store())._loop("llm", buggy, "GPU collection"))
    try:

        async def many_rounds() -> None:
            assert len(rounds) >= 20

        await eventually(many_rounds)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [str(r.exc_info[1]) for r in said if r.exc_info] == ["a bug", "another bug"], said
