"""Table tests for the inference-engine layer: server pages in tests/fixtures/engines/ → exact per-pod loads."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import tgi_page

from keda_gpu_scaler.demo import engines as simulated
from keda_gpu_scaler.pages.engines import (
    ENGINE_CHOICES,
    ENGINE_SAMPLE_NAMES,
    ENGINES,
    Engine,
    InferenceMetric,
    InferenceReading,
    Missing,
    MissingKind,
    accepts_model,
    engine_supports,
    pod_of,
    pod_reading,
    recognise,
    supported_metrics,
    unsupported_message,
    value_for,
    wrong_types,
)
from keda_gpu_scaler.pages.engines import _common as engines_common
from keda_gpu_scaler.pages.engines.formats import (
    LLAMACPP,
    SGLANG,
    TGI,
    TRITON,
    TRTLLM,
    TRTLLM_SERVE,
    VLLM,
    VLLM_WAITING_BY_REASON,
)
from keda_gpu_scaler.pages.exposition import Sample, parse_exposition
from keda_gpu_scaler.pages.prometheus_answer import inference_pods, parse_vector, samples_with_times
from keda_gpu_scaler.pages.promql import TIMESTAMP_LABEL, any_of, values_and_times

FIXTURES = Path(__file__).parent.parent / "fixtures" / "engines"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
MISTRAL = "mistralai/Mistral-7B-Instruct-v0.3"


def page(name: str) -> list[Sample]:
    """A fixture parsed exactly as the scaler parses inference pages: filtered by ENGINE_SAMPLE_NAMES."""
    return parse_exposition((FIXTURES / name).read_text(), ENGINE_SAMPLE_NAMES)


@dataclass(frozen=True)
class Absent:
    """An expected Missing: its kind and the family it names (None where it names none)."""

    kind: MissingKind
    family: str | None = None


Expected = float | Absent


def check(actual: float | Missing, expected: Expected) -> None:
    if isinstance(expected, Absent):
        assert isinstance(actual, Missing), actual
        assert (actual.kind, actual.family) == (expected.kind, expected.family), actual
        assert actual.reason
        if expected.family is not None:
            assert expected.family in actual.reason
    else:
        assert not isinstance(actual, Missing), actual
        assert actual == pytest.approx(expected)


def check_reading(
    reading: InferenceReading,
    engine: Engine | None,
    waiting: Expected,
    running: Expected,
    kv_cache: Expected,
    engines: int,
) -> None:
    assert reading.engine is engine
    check(reading.waiting, waiting)
    check(reading.running, running)
    check(reading.kv_cache, kv_cache)
    assert reading.engines == engines


NOT_EXPORTED = Absent(MissingKind.NOT_EXPORTED)
NO_ENGINE = Absent(MissingKind.NO_ENGINE)
# Later llama.cpp builds print no KV-cache gauge: the reading names the family older builds printed.
LLAMACPP_NO_KV = Absent(MissingKind.NOT_EXPORTED, LLAMACPP.kv_cache.name)

# (fixture, engine choice, model, engine read as, waiting, running, KV %, engines): the expected numbers
# are the formulas written in each fixture's first line.
FIXTURE_CASES = [
    pytest.param("vllm_v1.prom", "auto", None, Engine.VLLM, 3, 12, 42, 1, id="vllm-single"),
    pytest.param("vllm_dp2.prom", "auto", None, Engine.VLLM, 4 + 1, 30 + 26, (90 + 70) / 2, 2, id="vllm-dp2"),
    pytest.param(
        "vllm_dp4_large.prom",
        "auto",
        None,
        Engine.VLLM,
        4 + 0 + 7 + 2,
        31 + 28 + 30 + 25,
        (81 + 64 + 90 + 55) / 4,
        4,
        id="vllm-dp4-large-page",
    ),
    pytest.param(
        "vllm_multi_model.prom",
        "auto",
        None,
        Engine.VLLM,
        2 + 6,
        9 + 14,
        (30 + 50) / 2,
        2,
        id="vllm-two-models",
    ),
    pytest.param("vllm_multi_model.prom", "vllm", LLAMA, Engine.VLLM, 2, 9, 30, 1, id="vllm-model-filter-a"),
    pytest.param(
        "vllm_multi_model.prom", "auto", MISTRAL, Engine.VLLM, 6, 14, 50, 1, id="vllm-model-filter-b"
    ),
    pytest.param(
        "vllm_multi_model.prom",
        "auto",
        "Qwen/Qwen2.5-7B-Instruct",
        Engine.VLLM,
        Absent(MissingKind.NO_MODEL, VLLM.waiting.name),
        Absent(MissingKind.NO_MODEL, VLLM.running.name),
        Absent(MissingKind.NO_MODEL, VLLM.kv_cache.name),
        0,
        id="vllm-model-not-served",
    ),
    pytest.param(
        "vllm_0_8_gpu_cache.prom", "auto", None, Engine.VLLM, 0, 7, 12.5, 1, id="vllm-0.8-gpu-cache"
    ),
    pytest.param(
        "vllm_show_hidden_metrics.prom", "auto", None, Engine.VLLM, 1, 5, 25, 1, id="vllm-both-kv-names"
    ),
    pytest.param(
        "vllm_starting.prom", "auto", None, None, NO_ENGINE, NO_ENGINE, NO_ENGINE, 0, id="vllm-starting"
    ),
    pytest.param(
        "vllm_starting.prom",
        "vllm",
        None,
        Engine.VLLM,
        Absent(MissingKind.FAMILY_ABSENT, VLLM.waiting.name),
        Absent(MissingKind.FAMILY_ABSENT, VLLM.running.name),
        Absent(MissingKind.FAMILY_ABSENT, VLLM.kv_cache.name),
        0,
        id="vllm-starting-named",
    ),
    pytest.param(
        "sglang_dp2_tp2.prom",
        "auto",
        None,
        Engine.SGLANG,
        5 + 0,
        20 + 17,
        (61 + 47) / 2,
        2,
        id="sglang-dp2-tp2",
    ),
    pytest.param("sglang_single.prom", "sglang", LLAMA, Engine.SGLANG, 2, 11, 31.25, 1, id="sglang-v0.4"),
    pytest.param(
        "sglang_router_underscore.prom",
        "auto",
        None,
        Engine.SGLANG,
        3 + 1,
        14 + 12,
        (50 + 25) / 2,
        2,
        id="sglang-underscore-spelling",
    ),
    pytest.param(
        "sglang_router_underscore.prom",
        "sglang",
        "Qwen/Qwen3-32B",
        Engine.SGLANG,
        4,
        26,
        37.5,
        2,
        id="sglang-underscore-named-with-model",
    ),
    pytest.param(
        "sglang_both_spellings.prom", "auto", None, Engine.SGLANG, 2, 9, 40, 1, id="sglang-both-once"
    ),
    pytest.param("llamacpp.prom", "auto", None, Engine.LLAMACPP, 5, 3, LLAMACPP_NO_KV, 1, id="llamacpp"),
    pytest.param(
        "llamacpp.prom", "llamacpp", None, Engine.LLAMACPP, 5, 3, LLAMACPP_NO_KV, 1, id="llamacpp-named"
    ),
    pytest.param(
        "llamacpp.prom",
        "auto",
        LLAMA,
        Engine.LLAMACPP,
        Absent(MissingKind.NO_MODEL, LLAMACPP.waiting.name),
        Absent(MissingKind.NO_MODEL, LLAMACPP.running.name),
        LLAMACPP_NO_KV,
        0,
        id="llamacpp-has-no-model-label",
    ),
    pytest.param(
        "llamacpp_old_kv_cache.prom", "auto", None, Engine.LLAMACPP, 0, 2, 36.7188, 1, id="llamacpp-older-kv"
    ),
    pytest.param("trtllm_serve.prom", "auto", None, Engine.TRTLLM, 4, 22, 57.8125, 1, id="trtllm-serve"),
    pytest.param(
        "trtllm_serve.prom", "trtllm", LLAMA, Engine.TRTLLM, 4, 22, 57.8125, 1, id="trtllm-serve-named"
    ),
    pytest.param(
        "trtllm_serve.prom",
        "trtllm",
        MISTRAL,
        Engine.TRTLLM,
        Absent(MissingKind.NO_MODEL, TRTLLM_SERVE.waiting.name),
        Absent(MissingKind.NO_MODEL, TRTLLM_SERVE.running.name),
        Absent(MissingKind.NO_MODEL, TRTLLM_SERVE.kv_cache.name),
        0,
        id="trtllm-serve-model-not-served",
    ),
    pytest.param("tgi.prom", "auto", None, Engine.TGI, 7, 24, NOT_EXPORTED, 1, id="tgi"),
    pytest.param(
        "tgi.prom",
        "tgi",
        LLAMA,
        Engine.TGI,
        Absent(MissingKind.NO_MODEL, TGI.waiting.name),
        Absent(MissingKind.NO_MODEL, TGI.running.name),
        NOT_EXPORTED,
        0,
        id="tgi-has-no-model-label",
    ),
    pytest.param(
        "triton.prom", "auto", None, Engine.TRITON, 4 + 2 + 1, NOT_EXPORTED, NOT_EXPORTED, 3, id="triton"
    ),
    pytest.param(
        "triton.prom",
        "triton",
        "bert",
        Engine.TRITON,
        2 + 1,
        NOT_EXPORTED,
        NOT_EXPORTED,
        2,
        id="triton-model",
    ),
    pytest.param("triton_trtllm.prom", "auto", None, Engine.TRTLLM, 3, 25, 68.75, 1, id="triton-trtllm-auto"),
    pytest.param(
        "triton_trtllm.prom",
        "triton",
        None,
        Engine.TRITON,
        1,
        NOT_EXPORTED,
        NOT_EXPORTED,
        5,
        id="triton-trtllm-as-triton",
    ),
    pytest.param(
        "triton_trtllm_no_fraction.prom",
        "trtllm",
        "tensorrt_llm",
        Engine.TRTLLM,
        0,
        9,
        3000 / 8192 * 100,
        1,
        id="trtllm-used-over-max",
    ),
    pytest.param(
        "triton_trtllm.prom",
        "trtllm",
        "ensemble",
        Engine.TRTLLM,
        Absent(MissingKind.NO_MODEL, 'nv_trt_llm_request_metrics{request_type="waiting"}'),
        Absent(MissingKind.NO_MODEL, 'nv_trt_llm_request_metrics{request_type="scheduled"}'),
        Absent(MissingKind.NO_MODEL, 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}'),
        0,
        id="trtllm-model-is-the-backend-model",
    ),
]


@pytest.mark.parametrize(
    ("fixture", "choice", "model", "engine", "waiting", "running", "kv_cache", "engines"), FIXTURE_CASES
)
def test_fixture_pages(
    fixture: str,
    choice: str,
    model: str | None,
    engine: Engine | None,
    waiting: Expected,
    running: Expected,
    kv_cache: Expected,
    engines: int,
) -> None:
    check_reading(pod_reading(page(fixture), choice, model), engine, waiting, running, kv_cache, engines)


def test_every_fixture_is_covered() -> None:
    # The demand_ pages are read for their counters (test_demand_engines).
    demand = {path.name for path in FIXTURES.glob("demand_*.prom")}
    covered = {case.values[0] for case in FIXTURE_CASES} | {"prometheus_federate_engines.prom"} | demand
    assert covered >= {"sglang_router_underscore.prom", "llamacpp.prom", "trtllm_serve.prom"}
    assert covered == {path.name for path in FIXTURES.glob("*.prom")}


def test_every_fixture_says_which_release_it_follows() -> None:
    for path in FIXTURES.glob("*.prom"):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# Written from") and "Expected" in first, path.name


def test_models_are_reported_for_explain() -> None:
    assert pod_reading(page("vllm_multi_model.prom")).models == (LLAMA, MISTRAL)
    assert pod_reading(page("triton.prom")).models == ("bert", "resnet50")
    assert pod_reading(page("tgi.prom")).models == ()


# --- value_for: the per-pod value of each trigger metric -------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "requests", "queue", "kv_cache"),
    [
        pytest.param("vllm_dp2.prom", 4 + 1 + 30 + 26, 4 + 1, 80, id="vllm"),
        pytest.param("sglang_dp2_tp2.prom", 5 + 37, 5, 54, id="sglang"),
        pytest.param("tgi.prom", 7 + 24, 7, NOT_EXPORTED, id="tgi"),
        pytest.param("triton.prom", NOT_EXPORTED, 7, NOT_EXPORTED, id="triton"),
        pytest.param("triton_trtllm.prom", 3 + 25, 3, 68.75, id="trtllm"),
        pytest.param("trtllm_serve.prom", 4 + 22, 4, 57.8125, id="trtllm-serve"),
        pytest.param("sglang_router_underscore.prom", 4 + 26, 4, 37.5, id="sglang-underscore"),
        pytest.param("llamacpp.prom", 5 + 3, 5, LLAMACPP_NO_KV, id="llamacpp"),
        pytest.param("llamacpp_old_kv_cache.prom", 0 + 2, 0, 36.7188, id="llamacpp-older-kv"),
        pytest.param("vllm_starting.prom", NO_ENGINE, NO_ENGINE, NO_ENGINE, id="no-engine"),
    ],
)
def test_value_for(fixture: str, requests: Expected, queue: Expected, kv_cache: Expected) -> None:
    reading = pod_reading(page(fixture))
    check(value_for(reading, InferenceMetric.REQUESTS), requests)
    check(value_for(reading, "queue"), queue)
    check(value_for(reading, "kv_cache"), kv_cache)


def test_requests_names_the_missing_half() -> None:
    only_running = [Sample(VLLM.running.name, {"engine": "0", "model_name": LLAMA}, 4.0, None)]
    missing = value_for(pod_reading(only_running), "requests")
    assert isinstance(missing, Missing)
    assert (missing.kind, missing.family) == (MissingKind.FAMILY_ABSENT, VLLM.waiting.name)


def test_value_for_rejects_an_unknown_metric() -> None:
    with pytest.raises(ValueError):
        value_for(pod_reading(page("vllm_v1.prom")), "utilization")


# --- what a named engine supports (trigger validation) ---------------------------------------------------


def test_engine_choices_and_supported_metrics() -> None:
    assert ENGINE_CHOICES == ("auto", "vllm", "sglang", "tgi", "triton", "trtllm", "llamacpp")
    every = (
        InferenceMetric.REQUESTS,
        InferenceMetric.QUEUE,
        InferenceMetric.KV_CACHE,
        InferenceMetric.DEMAND,
    )
    assert {choice: supported_metrics(choice) for choice in ENGINE_CHOICES} == {
        "auto": every,
        "vllm": every,
        "sglang": every,
        "tgi": (InferenceMetric.REQUESTS, InferenceMetric.QUEUE, InferenceMetric.DEMAND),
        "triton": (InferenceMetric.QUEUE, InferenceMetric.DEMAND),
        "trtllm": every,
        # Later builds print no KV-cache gauge: a named llamacpp can promise requests and queue only.
        "llamacpp": (InferenceMetric.REQUESTS, InferenceMetric.QUEUE),
    }
    assert not engine_supports("triton", "requests")
    assert not engine_supports("llamacpp", "kv_cache")
    assert unsupported_message("llamacpp", "kv_cache") == (
        "engine llamacpp does not export what metric kv_cache needs; with llamacpp use: requests, queue"
    )
    assert not engine_supports(Engine.TGI, InferenceMetric.KV_CACHE)
    assert engine_supports("auto", "kv_cache")
    assert unsupported_message("triton", "requests") == (
        "engine triton does not export what metric requests needs; with triton use: queue, demand"
    )
    with pytest.raises(ValueError):
        supported_metrics("ollama")


def test_a_trigger_metric_enum_of_its_own_is_accepted() -> None:
    class TriggerMetric(StrEnum):
        REQUESTS = "requests"
        KV_CACHE = "kv_cache"

    assert not engine_supports("triton", TriggerMetric.REQUESTS)
    assert engine_supports("vllm", TriggerMetric.KV_CACHE)
    assert value_for(pod_reading(page("vllm_v1.prom")), TriggerMetric.REQUESTS) == 15


def test_which_engines_a_model_filter_can_match() -> None:
    assert {choice: accepts_model(choice) for choice in ENGINE_CHOICES} == {
        "auto": True,
        "vllm": True,
        "sglang": True,
        "tgi": False,
        "triton": True,
        "trtllm": True,
        "llamacpp": False,
    }


def test_what_a_reading_lacks_matches_what_the_engine_supports() -> None:
    """A NOT_EXPORTED value appears exactly where engine_supports says no (so both paths agree)."""
    pages = [
        (Engine.VLLM, "vllm_v1.prom"),
        (Engine.SGLANG, "sglang_single.prom"),
        (Engine.SGLANG, "sglang_router_underscore.prom"),
        (Engine.TGI, "tgi.prom"),
        (Engine.TRITON, "triton.prom"),
        (Engine.TRTLLM, "triton_trtllm.prom"),
        (Engine.TRTLLM, "trtllm_serve.prom"),
        (Engine.LLAMACPP, "llamacpp.prom"),
    ]
    assert {engine for engine, _ in pages} == set(Engine) == {module.engine for module in ENGINES}
    # Every registry line (an engine's page format) has a page here.
    for module in ENGINES:
        assert any(not module.sample_names.isdisjoint(s.name for s in page(f)) for _, f in pages), module
    for engine, fixture in pages:
        reading = pod_reading(page(fixture), engine)
        # demand reads counters besides the gauges: test_demand_engines checks its half.
        for metric in (m for m in InferenceMetric if m is not InferenceMetric.DEMAND):
            value = value_for(reading, metric)
            lacks = isinstance(value, Missing) and value.kind is MissingKind.NOT_EXPORTED
            assert lacks is not engine_supports(engine, metric), (engine, metric)


# --- recognition ---------------------------------------------------------------------------------------


def test_recognise() -> None:
    assert recognise(page("vllm_v1.prom")) is Engine.VLLM
    assert recognise(page("sglang_dp2_tp2.prom")) is Engine.SGLANG
    assert recognise(page("tgi.prom")) is Engine.TGI
    assert recognise(page("triton.prom")) is Engine.TRITON
    # TensorRT-LLM backend families beside Triton's own: the backend's counts win.
    assert recognise(page("triton_trtllm.prom")) is Engine.TRTLLM
    # trtllm-serve's own page is TensorRT-LLM too, told apart from the backend's by its families.
    assert recognise(page("trtllm_serve.prom")) is Engine.TRTLLM
    assert recognise(page("llamacpp.prom")) is Engine.LLAMACPP
    assert recognise(page("llamacpp_old_kv_cache.prom")) is Engine.LLAMACPP
    assert recognise(page("sglang_router_underscore.prom")) is Engine.SGLANG
    assert recognise(page("vllm_starting.prom")) is None


def test_no_engine_reason_names_the_families_looked_for() -> None:
    reading = pod_reading(page("vllm_starting.prom"))
    assert isinstance(reading.waiting, Missing)
    for module in ENGINES:
        assert module.signature in reading.waiting.reason
    assert "vLLM" in reading.waiting.reason


def test_sample_names_are_the_modules_names() -> None:
    assert {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "tgi_queue_size",
        "tgi_batch_current_size",
        "nv_inference_pending_request_count",
        "nv_trt_llm_request_metrics",
        "nv_trt_llm_kv_cache_block_metrics",
        "sglang_num_running_reqs",
        "sglang_num_queue_reqs",
        "sglang_token_usage",
        "trtllm_num_requests_waiting",
        "trtllm_num_requests_running",
        "trtllm_kv_cache_utilization",
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:kv_cache_usage_ratio",
    } == ENGINE_SAMPLE_NAMES
    assert VLLM_WAITING_BY_REASON not in ENGINE_SAMPLE_NAMES
    for module in ENGINES:
        assert module.sample_names <= ENGINE_SAMPLE_NAMES


# --- rules no real page shows alone --------------------------------------------------------------------


def s(name: str, value: float, **labels: str) -> Sample:
    return Sample(name, labels, value, None)


def test_waiting_by_reason_is_never_added() -> None:
    samples = [
        s(VLLM.running.name, 2, engine="0", model_name=LLAMA),
        s(VLLM.waiting.name, 3, engine="0", model_name=LLAMA),
        s(VLLM_WAITING_BY_REASON, 3, engine="0", model_name=LLAMA, reason="capacity"),
        s(VLLM_WAITING_BY_REASON, 1, engine="0", model_name=LLAMA, reason="deferred"),
    ]
    reading = pod_reading(samples)
    assert (reading.waiting, reading.running) == (3, 2)


def test_old_kv_gauge_is_read_only_where_the_new_one_is_absent() -> None:
    old = [s(VLLM.kv_cache.spellings[1], 0.5, engine="0", model_name=LLAMA)]
    new = [s(VLLM.kv_cache.name, 0.25, engine="0", model_name=LLAMA)]
    assert pod_reading(old, "vllm").kv_cache == 50
    assert pod_reading(old + new, "vllm").kv_cache == 25
    assert pod_reading(new + old, "vllm").kv_cache == 25
    missing = pod_reading([s(VLLM.waiting.name, 1, engine="0", model_name=LLAMA)]).kv_cache
    assert isinstance(missing, Missing) and missing.kind is MissingKind.FAMILY_ABSENT
    assert VLLM.kv_cache.name in missing.reason and VLLM.kv_cache.spellings[1] in missing.reason


def test_a_vllm_page_without_the_engine_label_is_one_engine() -> None:
    reading = pod_reading(
        [s(VLLM.waiting.name, 4, model_name=LLAMA), s(VLLM.running.name, 6, model_name=LLAMA)]
    )
    assert (reading.waiting, reading.running, reading.engines) == (4, 6, 1)


@pytest.mark.parametrize(
    "bad", [math.nan, math.inf, -math.inf, -1.0], ids=["nan", "inf", "minus-inf", "negative"]
)
def test_an_unusable_sample_is_dropped_never_read_as_zero(bad: float) -> None:
    # A copy with a bad value beside a good one: the good one stands.
    copies = [
        s(SGLANG.waiting.name, bad, dp_rank="0", tp_rank="0", model_name=LLAMA),
        s(SGLANG.waiting.name, 5, dp_rank="0", tp_rank="1", model_name=LLAMA),
    ]
    assert pod_reading(copies).waiting == 5
    # An engine whose only sample is bad: the pod has no waiting count (summing the rest would understate).
    engines = [
        s(VLLM.waiting.name, 5, engine="0", model_name=LLAMA),
        s(VLLM.waiting.name, bad, engine="1", model_name=LLAMA),
    ]
    missing = pod_reading(engines).waiting
    assert isinstance(missing, Missing)
    assert (missing.kind, missing.family) == (MissingKind.NO_VALUE, VLLM.waiting.name)
    assert 'engine="1"' in missing.reason


def test_engines_summing_beyond_a_float_are_missing_naming_the_family_never_an_exception() -> None:
    # Each value is finite, so each is usable; their sum (or the mean's sum) is beyond a float's range.
    page = [
        s(name, 1e308, engine=engine, model_name=LLAMA)
        for name in (VLLM.waiting.name, VLLM.running.name, VLLM.kv_cache.name)
        for engine in ("0", "1")
    ]
    reading = pod_reading(page)
    for value, family in (
        (reading.waiting, VLLM.waiting.name),
        (reading.running, VLLM.running.name),
        (reading.kv_cache, VLLM.kv_cache.name),
    ):
        assert isinstance(value, Missing), value
        assert (value.kind, value.family) == (MissingKind.NO_VALUE, family)
        assert family in value.reason and "2 engines" in value.reason


def test_kv_fraction_above_one_is_clamped_to_100() -> None:
    assert pod_reading([s(SGLANG.kv_cache.name, 1.02, model_name=LLAMA)]).kv_cache == 100


def test_differing_copies_take_the_largest() -> None:
    samples = [
        s(SGLANG.running.name, 9, dp_rank="0", tp_rank="0", model_name=LLAMA),
        s(SGLANG.running.name, 8, dp_rank="0", tp_rank="1", model_name=LLAMA),
        s(SGLANG.running.name, 4, dp_rank="1", tp_rank="0", model_name=LLAMA),
    ]
    assert pod_reading(samples).running == 9 + 4


def test_triton_versions_are_separate_queues_and_named_engine_ignores_other_families() -> None:
    samples = [
        s(TRITON.waiting.name, 2, model="bert", version="1"),
        s(TRITON.waiting.name, 3, model="bert", version="2"),
        s(VLLM.waiting.name, 100, engine="0", model_name="bert"),
    ]
    assert pod_reading(samples, "triton").waiting == 5
    assert pod_reading(samples, "triton", "bert").waiting == 5


def test_trtllm_used_over_max_needs_a_max() -> None:
    where = {"model": "tensorrt_llm", "version": "1"}
    used = s(TRTLLM.kv_cache.name, 100, kv_cache_block_type="used", **where)
    zero_max = s(TRTLLM.kv_cache.name, 0, kv_cache_block_type="max", **where)
    missing = pod_reading([used, zero_max], "trtllm").kv_cache
    assert isinstance(missing, Missing) and missing.kind is MissingKind.NO_VALUE
    no_max = pod_reading([used], "trtllm").kv_cache
    assert isinstance(no_max, Missing) and no_max.kind is MissingKind.FAMILY_ABSENT
    assert 'kv_cache_block_type="max"' in no_max.reason
    none = pod_reading([s(TRTLLM.waiting.name, 1, request_type="waiting", **where)], "trtllm").kv_cache
    assert (
        isinstance(none, Missing)
        and none.family == 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}'
    )


# --- two spellings of SGLang's gauges ----------------------------------------------------------------


@pytest.fixture
def fresh_spelling_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """Disagreements are logged once per process: each test starts as a process that logged none."""
    monkeypatch.setattr(engines_common, "_DISAGREEMENTS_LOGGED", set())


def test_each_gauge_reads_whichever_spelling_the_page_has() -> None:
    mixed = [
        s(SGLANG.waiting.name, 3, model_name=LLAMA),
        s(SGLANG.running.spellings[1], 7, model_name=LLAMA),
        s(SGLANG.kv_cache.spellings[1], 0.5, model_name=LLAMA),
    ]
    reading = pod_reading(mixed)
    assert (reading.engine, reading.waiting, reading.running, reading.kv_cache) == (Engine.SGLANG, 3, 7, 50)


def test_a_gauge_in_neither_spelling_names_both() -> None:
    missing = pod_reading([s(SGLANG.waiting.spellings[1], 1, model_name=LLAMA)]).running
    assert isinstance(missing, Missing)
    assert (missing.kind, missing.family) == (MissingKind.FAMILY_ABSENT, SGLANG.running.name)
    assert SGLANG.running.name in missing.reason and SGLANG.running.spellings[1] in missing.reason


@pytest.mark.usefixtures("fresh_spelling_log")
def test_equal_spellings_count_once_without_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="keda_gpu_scaler.pages.engines"):
        assert pod_reading(page("sglang_both_spellings.prom")).waiting == 2
    assert caplog.records == []


@pytest.mark.usefixtures("fresh_spelling_log")
def test_spellings_that_disagree_read_the_colon_one_and_log_once(caplog: pytest.LogCaptureFixture) -> None:
    disagreeing = [
        s(SGLANG.waiting.name, 3, dp_rank="0", model_name=LLAMA),
        s(SGLANG.waiting.spellings[1], 8, dp_rank="0", model_name=LLAMA),
        s(SGLANG.running.name, 5, dp_rank="0", model_name=LLAMA),
        s(SGLANG.running.spellings[1], 5, dp_rank="0", model_name=LLAMA),
    ]
    with caplog.at_level("WARNING", logger="keda_gpu_scaler.pages.engines"):
        for _ in range(3):  # read on every evaluation: one line in all
            reading = pod_reading(disagreeing)
            assert (reading.waiting, reading.running) == (3, 5)
        # Underscore first on the page: the colon spelling still wins.
        assert pod_reading(list(reversed(disagreeing))).waiting == 3
    (record,) = caplog.records
    message = record.getMessage()
    assert record.levelname == "WARNING"
    assert SGLANG.waiting.name in message and SGLANG.waiting.spellings[1] in message
    assert "3" in message and "8" in message


def test_a_trtllm_trigger_reads_whichever_tensorrt_llm_page_the_pod_prints() -> None:
    serve = pod_reading(page("trtllm_serve.prom"), "trtllm")
    backend = pod_reading(page("triton_trtllm.prom"), "trtllm")
    assert (serve.waiting, serve.running, backend.waiting, backend.running) == (4, 22, 3, 25)
    # A page with neither: named after the backend's families (the format listed first).
    neither = pod_reading(page("vllm_v1.prom"), "trtllm").waiting
    assert isinstance(neither, Missing) and neither.kind is MissingKind.FAMILY_ABSENT
    assert neither.family == 'nv_trt_llm_request_metrics{request_type="waiting"}'


def test_trtllm_serve_without_a_model_label_is_one_engine() -> None:
    samples = [
        s(TRTLLM_SERVE.waiting.name, 2),
        s(TRTLLM_SERVE.running.name, 6),
        s(TRTLLM_SERVE.kv_cache.name, 0.25),
    ]
    reading = pod_reading(samples)
    assert (reading.engine, reading.waiting, reading.running, reading.kv_cache) == (Engine.TRTLLM, 2, 6, 25)
    assert reading.models == ()
    no_model = pod_reading(samples, "trtllm", LLAMA).waiting
    assert isinstance(no_model, Missing) and no_model.kind is MissingKind.NO_MODEL


def test_llamacpp_kv_cache_is_read_where_an_older_build_prints_it() -> None:
    assert pod_reading(page("llamacpp_old_kv_cache.prom"), "llamacpp").kv_cache == pytest.approx(36.7188)
    missing = pod_reading(page("llamacpp.prom")).kv_cache
    assert isinstance(missing, Missing) and missing.kind is MissingKind.NOT_EXPORTED
    assert LLAMACPP.kv_cache.name in missing.reason and "older" in missing.reason


# --- the Gateway API Inference Extension's model-server protocol ------------------------------------

# The protocol table's engine columns, as the engine our `engine` key calls them. A column the table
# gains fails the test below until it is mapped here, and the engine is read.
PROTOCOL_ENGINES = {
    "vLLM metric": Engine.VLLM,
    "Triton TensorRT-LLM": Engine.TRTLLM,
    "trtllm-serve": Engine.TRTLLM,
    "SGLang": Engine.SGLANG,
}
PROTOCOL_ROWS = ("TotalQueuedRequests", "TotalRunningRequests", "KVCacheUtilization")


def protocol_table() -> dict[str, dict[str, str]]:
    """The fixture's table as column → row → family selector (`name` or `name{label=value}`)."""
    lines = [
        line
        for line in (FIXTURES / "model_server_protocol.md").read_text().splitlines()
        if line.startswith("|")
    ]

    def cells(line: str) -> list[str]:
        return [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]

    header, rows = cells(lines[0]), [cells(line) for line in lines[2:]]
    return {column: {row[0]: row[index] for row in rows} for index, column in enumerate(header) if index > 0}


def protocol_sample(selector: str, value: float) -> Sample:
    name, _, rest = selector.partition("{")
    labels = dict(pair.split("=", 1) for pair in rest.rstrip("}").split(",") if pair)
    return Sample(name, {**labels, "model_name": LLAMA, "model": "tensorrt_llm"}, value, None)


def test_every_engine_of_the_model_server_protocol_is_read() -> None:
    table = protocol_table()
    assert set(table) == set(PROTOCOL_ENGINES), "a column of the protocol table is not mapped to an engine"
    for column, families in table.items():
        assert set(families) == set(PROTOCOL_ROWS), column
        samples = [
            protocol_sample(families["TotalQueuedRequests"], 7),
            protocol_sample(families["TotalRunningRequests"], 11),
            protocol_sample(families["KVCacheUtilization"], 0.25),
        ]
        assert {sample.name for sample in samples} <= ENGINE_SAMPLE_NAMES, column
        for choice in ("auto", PROTOCOL_ENGINES[column].value):
            reading = pod_reading(samples, choice)
            assert reading.engine is PROTOCOL_ENGINES[column], (column, choice)
            assert (reading.waiting, reading.running, reading.kv_cache) == (7, 11, 25), (column, choice)
            assert value_for(reading, "requests") == 18


def test_an_unknown_engine_choice_is_an_error() -> None:
    with pytest.raises(ValueError):
        pod_reading(page("vllm_v1.prom"), "ollama")


# --- pages of many pods (the Prometheus source) --------------------------------------------------------


def readings_by_pod(
    samples: list[Sample], engine: Engine | str = "auto", model: str | None = None
) -> dict[tuple[str, str], InferenceReading]:
    """Each pod's reading as the Prometheus source makes it: a namespace's series grouped by pod
    (inference_pods, no age limit), each pod's series read by pod_reading."""
    namespaces = sorted({key[0] for sample in samples if (key := pod_of(sample.labels)) is not None})
    return {
        (namespace, pod): pod_reading(series, engine, model)
        for namespace in namespaces
        for pod, series in inference_pods(
            samples, namespace, at=0.0, window=math.inf, exporter_namespaces=None
        ).by_pod
    }


def test_readings_by_pod_from_a_federated_page() -> None:
    readings = readings_by_pod(page("prometheus_federate_engines.prom"))
    assert list(readings) == [
        ("llm", "vllm-7c9d8b6f5d-abcde"),
        ("llm", "vllm-7c9d8b6f5d-fghij"),
        ("llm", "vllm-7c9d8b6f5d-klmno"),
        ("serving", "sglang-6f8b9c7d4-pqrst"),
    ]
    expected = {
        ("llm", "vllm-7c9d8b6f5d-abcde"): (Engine.VLLM, 3, 12, 42, 1),
        ("llm", "vllm-7c9d8b6f5d-fghij"): (Engine.VLLM, 1 + 0, 8 + 6, (20 + 30) / 2, 2),
        ("llm", "vllm-7c9d8b6f5d-klmno"): (Engine.VLLM, 5, 20, 90, 1),
        ("serving", "sglang-6f8b9c7d4-pqrst"): (Engine.SGLANG, 2, 9, 33, 1),
    }
    for pod, (engine, waiting, running, kv, engines) in expected.items():
        check_reading(readings[pod], engine, waiting, running, kv, engines)


def test_readings_by_pod_passes_engine_and_model_on() -> None:
    readings = readings_by_pod(page("prometheus_federate_engines.prom"), "vllm", LLAMA)
    sglang_pod = readings[("serving", "sglang-6f8b9c7d4-pqrst")]
    assert sglang_pod.engine is Engine.VLLM
    assert isinstance(sglang_pod.waiting, Missing) and sglang_pod.waiting.kind is MissingKind.FAMILY_ABSENT
    assert readings[("llm", "vllm-7c9d8b6f5d-abcde")].waiting == 3


def test_empty_pod_labels_are_no_pod() -> None:
    samples = [
        s(VLLM.waiting.name, 1, namespace="llm", pod="", engine="0"),
        s(VLLM.waiting.name, 2, exported_namespace="llm", exported_pod="", namespace="llm", pod="vllm-a"),
    ]
    assert {pod: r.waiting for pod, r in readings_by_pod(samples).items()} == {("llm", "vllm-a"): 2}


# --- colons in metric names, on every path ------------------------------------------------------------


def test_colon_names_parse_in_text_with_and_without_a_filter() -> None:
    text = (
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 3.0\n'
        "vllm:num_requests_running 4 1737975312345\n"
        "  sglang:num_queue_reqs 2\n"
    )
    expected = [
        Sample("vllm:num_requests_waiting", {"engine": "0", "model_name": "m"}, 3.0, None),
        Sample("vllm:num_requests_running", {}, 4.0, 1737975312345),
        Sample("sglang:num_queue_reqs", {}, 2.0, None),
    ]
    assert parse_exposition(text, ENGINE_SAMPLE_NAMES) == expected
    assert [sample.name for sample in parse_exposition(text)] == [
        "vllm:num_requests_waiting",
        "vllm:num_requests_waiting_by_reason",
        "vllm:num_requests_running",
        "sglang:num_queue_reqs",
    ]


def test_colon_names_come_through_a_prometheus_api_answer() -> None:
    labels = {"engine": "0", "model_name": "m", "namespace": "llm", "pod": "vllm-a"}
    body = json.dumps(
        {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [
                    {
                        "metric": {"__name__": "vllm:num_requests_waiting", **labels},
                        "value": [1737975312.3, "3"],
                    },
                    {
                        "metric": {"__name__": "vllm:num_requests_running", **labels},
                        "value": [1737975312.3, "4"],
                    },
                    {
                        "metric": {**labels, TIMESTAMP_LABEL: "1"},
                        "value": [1737975312.3, "1737975311.9"],
                    },
                ],
            },
        }
    ).encode()
    elements, warnings = parse_vector(body)
    assert warnings == []
    samples = samples_with_times(elements)
    assert [(x.name, x.labels, x.value, x.timestamp_ms) for x in samples] == [
        ("vllm:num_requests_waiting", labels, 3.0, 1737975311900),
        ("vllm:num_requests_running", labels, 4.0, 1737975311900),
    ]
    reading = readings_by_pod(samples)[("llm", "vllm-a")]
    assert (reading.waiting, reading.running) == (3, 4)


def test_colon_names_are_literal_in_promql() -> None:
    # ":" is no RE2 metacharacter: the alternation matches the names exactly.
    assert any_of(["vllm:num_requests_waiting", "sglang:num_queue_reqs"]) == (
        "sglang:num_queue_reqs|vllm:num_requests_waiting"
    )
    query = values_and_times(["vllm:num_requests_waiting"], [[("namespace", "=", "llm"), ("pod", "!=", "")]])
    assert '{__name__=~"vllm:num_requests_waiting",namespace="llm",pod!=""}' in query
    assert 'timestamp({__name__="vllm:num_requests_waiting",namespace="llm",pod!=""})' in query


# --- properties -----------------------------------------------------------------------------------------

COUNTS = st.integers(min_value=0, max_value=500).map(float)
FRACTIONS = st.integers(min_value=0, max_value=1000).map(lambda n: n / 1000)
ENGINE_LOADS = st.lists(st.tuples(COUNTS, COUNTS, FRACTIONS), min_size=1, max_size=6)


def sglang_samples(loads: list[tuple[float, float, float]], tp_size: int) -> list[Sample]:
    return parse_exposition(simulated.sglang_page(LLAMA, loads, tp_size=tp_size), ENGINE_SAMPLE_NAMES)


@settings(max_examples=60, deadline=None)
@given(loads=ENGINE_LOADS, seed=st.integers())
def test_series_order_never_changes_a_reading(loads: list[tuple[float, float, float]], seed: int) -> None:
    for samples in (
        parse_exposition(simulated.vllm_page(LLAMA, loads), ENGINE_SAMPLE_NAMES),
        sglang_samples(loads, tp_size=2),
    ):
        shuffled = list(samples)
        random.Random(seed).shuffle(shuffled)
        assert pod_reading(shuffled) == pod_reading(samples)


@settings(max_examples=60, deadline=None)
@given(loads=ENGINE_LOADS, tp_size=st.integers(min_value=1, max_value=8))
def test_tensor_parallel_copies_never_change_a_reading(
    loads: list[tuple[float, float, float]], tp_size: int
) -> None:
    assert pod_reading(sglang_samples(loads, tp_size)) == pod_reading(sglang_samples(loads, 1))


@settings(max_examples=60, deadline=None)
@given(loads=ENGINE_LOADS)
def test_engines_sum_and_kv_is_their_mean(loads: list[tuple[float, float, float]]) -> None:
    reading = pod_reading(parse_exposition(simulated.vllm_page(LLAMA, loads), ENGINE_SAMPLE_NAMES))
    assert reading.engine is Engine.VLLM and reading.engines == len(loads)
    assert reading.running == math.fsum(load[0] for load in loads)
    assert reading.waiting == math.fsum(load[1] for load in loads)
    assert reading.kv_cache == pytest.approx(math.fsum(load[2] for load in loads) / len(loads) * 100)
    assert value_for(reading, "requests") == pytest.approx(reading.running + reading.waiting)


@settings(max_examples=40, deadline=None)
@given(
    pods=st.dictionaries(
        st.from_regex(r"[a-z]{1,8}-[a-z0-9]{5}", fullmatch=True), ENGINE_LOADS, min_size=1, max_size=4
    )
)
def test_readings_by_pod_equals_each_pods_own_page(pods: dict[str, list[tuple[float, float, float]]]) -> None:
    merged: list[Sample] = []
    for pod, loads in pods.items():
        for sample in parse_exposition(simulated.vllm_page(LLAMA, loads), ENGINE_SAMPLE_NAMES):
            merged.append(sample._replace(labels={**sample.labels, "namespace": "llm", "pod": pod}))
    by_pod = readings_by_pod(merged)
    assert by_pod == {
        ("llm", pod): pod_reading(parse_exposition(simulated.vllm_page(LLAMA, loads), ENGINE_SAMPLE_NAMES))
        for pod, loads in pods.items()
    }


def underscore_spelling(text: str) -> str:
    """An SGLang page as sgl-router's /engine_metrics (or an escaping Prometheus 3) spells it."""
    return text.replace("sglang:", "sglang_")


@settings(max_examples=60, deadline=None)
@given(loads=ENGINE_LOADS, tp_size=st.integers(min_value=1, max_value=4), seed=st.integers())
def test_either_sglang_spelling_or_both_read_the_same(
    loads: list[tuple[float, float, float]], tp_size: int, seed: int
) -> None:
    colon = simulated.sglang_page(LLAMA, loads, tp_size=tp_size)
    underscore = underscore_spelling(colon)
    expected = pod_reading(parse_exposition(colon, ENGINE_SAMPLE_NAMES))
    both = parse_exposition(colon + underscore, ENGINE_SAMPLE_NAMES)
    random.Random(seed).shuffle(both)
    assert pod_reading(parse_exposition(underscore, ENGINE_SAMPLE_NAMES)) == expected
    assert pod_reading(both) == expected  # counted once, whatever the order of the series


def single_server_page(names: tuple[str, str, str], load: tuple[float, float, float], labels: str) -> str:
    """A one-engine page of waiting, running and KV-fraction gauges (trtllm-serve, llama.cpp)."""
    waiting, running, kv = names
    lines = []
    for name, value in ((running, load[0]), (waiting, load[1]), (kv, load[2])):
        lines += [f"# TYPE {name} gauge", f"{name}{{{labels}}} {value!r}" if labels else f"{name} {value!r}"]
    return "\n".join(lines) + "\n"


@settings(max_examples=60, deadline=None)
@given(load=st.tuples(COUNTS, COUNTS, FRACTIONS))
def test_trtllm_serve_and_llamacpp_read_back_what_they_print(load: tuple[float, float, float]) -> None:
    serve = single_server_page(
        (TRTLLM_SERVE.waiting.name, TRTLLM_SERVE.running.name, TRTLLM_SERVE.kv_cache.name),
        load,
        f'engine_type="trtllm",model_name="{LLAMA}"',
    )
    older_llamacpp = single_server_page(
        (LLAMACPP.waiting.name, LLAMACPP.running.name, LLAMACPP.kv_cache.name), load, ""
    )
    for text, engine in ((serve, Engine.TRTLLM), (older_llamacpp, Engine.LLAMACPP)):
        reading = pod_reading(parse_exposition(text, ENGINE_SAMPLE_NAMES))
        assert (reading.engine, reading.running, reading.waiting) == (engine, load[0], load[1])
        assert reading.kv_cache == pytest.approx(load[2] * 100)
        assert value_for(reading, "requests") == load[0] + load[1]


# --- the simulated pages ---------------------------------------------------------------------------------


def test_simulated_pages_read_back_as_their_state() -> None:
    loads = [simulated.EngineLoad(30, 4, 0.9), simulated.EngineLoad(26, 1, 0.7)]
    check_reading(
        pod_reading(parse_exposition(simulated.vllm_page(LLAMA, loads), ENGINE_SAMPLE_NAMES)),
        Engine.VLLM,
        5,
        56,
        80,
        2,
    )
    check_reading(
        pod_reading(parse_exposition(simulated.sglang_page(LLAMA, loads, tp_size=4))),
        Engine.SGLANG,
        5,
        56,
        80,
        2,
    )
    check_reading(pod_reading(parse_exposition(tgi_page((12, 3, 0)))), Engine.TGI, 3, 12, NOT_EXPORTED, 1)
    # No engine yet: no vLLM family at all, as a starting server.
    check_reading(
        pod_reading(parse_exposition(simulated.vllm_page(LLAMA, [])), "vllm"),
        Engine.VLLM,
        Absent(MissingKind.FAMILY_ABSENT, VLLM.waiting.name),
        Absent(MissingKind.FAMILY_ABSENT, VLLM.running.name),
        Absent(MissingKind.FAMILY_ABSENT, VLLM.kv_cache.name),
        0,
    )


def test_simulated_load_and_split() -> None:
    assert simulated.load_for(10, max_running=8, kv_per_request=0.1) == (8, 2, 0.8)
    assert simulated.load_for(100, max_running=64, kv_per_request=0.1) == (64, 36, 1.0)
    assert simulated.load_for(-3) == (0, 0, 0)
    assert simulated.split(10, 4) == [3, 3, 2, 2]
    assert sum(simulated.split(7.4, 3)) == 7


def test_simulated_model_names_are_escaped() -> None:
    reading = pod_reading(parse_exposition(simulated.vllm_page('a"b\\c', [(1, 0, 0)])), model='a"b\\c')
    assert reading.running == 1


# --- declared types -----------------------------------------------------------------------------------


def test_no_fixture_declares_a_wrong_type() -> None:
    for path in FIXTURES.glob("*.prom"):
        assert wrong_types(path.read_text()) == {}, path.name
        assert wrong_types(path.read_bytes()) == {}, path.name


def test_a_family_declared_with_another_type_is_named() -> None:
    text = (
        "# TYPE vllm:num_requests_waiting counter\n"
        "vllm:num_requests_waiting 3\n"
        "# TYPE tgi_queue_size summary\n"
        'tgi_queue_size{quantile="0.5"} 1\n'
        "# TYPE vllm:num_requests_running gauge\n"
        "# TYPE sglang:token_usage untyped"
    )
    assert wrong_types(text) == {"vllm:num_requests_waiting": "counter", "tgi_queue_size": "summary"}


def test_a_named_engine_on_another_engines_page_says_what_the_page_is() -> None:
    reading = pod_reading(page("vllm_v1.prom"), "sglang")
    assert reading.engine is Engine.SGLANG
    for value in (reading.waiting, reading.running, reading.kv_cache):
        assert isinstance(value, Missing) and value.kind is MissingKind.FAMILY_ABSENT
        assert value.reason.endswith(
            f"; the page is recognised as engine vllm (it carries {VLLM.waiting.name}): set engine: vllm or auto"
        ), value.reason
    # A page of no engine at all has nothing to name.
    bare = pod_reading([], "sglang")
    assert isinstance(bare.waiting, Missing) and "recognised" not in bare.waiting.reason
