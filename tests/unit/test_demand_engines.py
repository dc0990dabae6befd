"""Each engine's counters for `metric: demand`: pages from tests/fixtures/engines/ → exact totals."""

from __future__ import annotations

from pathlib import Path

import pytest

from keda_gpu_scaler.collect.inference import POD_PAGE_NAMES
from keda_gpu_scaler.pages.engines import (
    DEMAND_SAMPLE_NAMES,
    Engine,
    InferenceMetric,
    Missing,
    MissingKind,
    engine_supports,
    in_flight,
    pod_counters,
    supports_tokens,
)
from keda_gpu_scaler.pages.engines._common import Series
from keda_gpu_scaler.pages.exposition import Sample, parse_exposition

FIXTURES = Path(__file__).parent.parent / "fixtures" / "engines"


def page(name: str) -> list[Sample]:
    """A fixture parsed exactly as the scaler parses pod pages."""
    return parse_exposition((FIXTURES / name).read_text(), POD_PAGE_NAMES)


NONE = None  # no token counters: Missing(NOT_EXPORTED)

CASES = [
    # fixture, engine choice, model, finished, in flight, prompt tokens, generation tokens
    ("demand_vllm_dp2.prom", "auto", None, 9671, 41, 11_100_000, 2_190_000),
    ("demand_vllm_dp2.prom", "vllm", "meta-llama/Llama-3.1-8B-Instruct", 9671, 41, 11_100_000, 2_190_000),
    ("demand_sglang.prom", "auto", None, 7310, 16, 9_120_000, 1_850_000),
    ("demand_sglang_underscore.prom", "sglang", None, 7310, 16, 9_120_000, 1_850_000),
    ("demand_tgi.prom", "auto", None, 14946, 31, 17_208_321, 3_130_470),
    ("tgi.prom", "tgi", None, 14907, 31, NONE, NONE),  # no failure yet, no token histograms on the page
    ("demand_triton.prom", "auto", None, 5648, 3, NONE, NONE),
    ("demand_triton.prom", "triton", "bert", 5648, 3, NONE, NONE),
    # The backend's own model only: the ensemble's other models count the same requests again.
    ("triton_trtllm.prom", "auto", None, 2210, 28, NONE, NONE),
    ("demand_trtllm_serve.prom", "auto", None, 9203, 26, 10_422_000, 2_208_000),
    ("trtllm_serve.prom", "trtllm", None, 9189, 26, NONE, NONE),
]


@pytest.mark.parametrize(("fixture", "choice", "model", "finished", "flight", "prompt", "generated"), CASES)
def test_counters_of_each_engine(
    fixture: str,
    choice: str,
    model: str | None,
    finished: float,
    flight: float,
    prompt: float | None,
    generated: float | None,
) -> None:
    reading, counters = pod_counters(page(fixture), choice, model)
    assert total(counters.finished) == pytest.approx(finished)
    assert in_flight(reading) == pytest.approx(flight)
    for value, expected in ((counters.prompt_tokens, prompt), (counters.generation_tokens, generated)):
        if expected is None:
            assert isinstance(value, Missing), value
        else:
            assert total(value) == pytest.approx(expected)


def total(series: Series | Missing) -> float | Missing:
    """A counter's total over its series (the sum a Prometheus query would give)."""
    return series if isinstance(series, Missing) else sum(series.values())


def test_every_demand_fixture_is_read_and_says_its_release() -> None:
    read = {case[0] for case in CASES} | {"demand_sglang_idle.prom"}
    assert read >= {path.name for path in FIXTURES.glob("demand_*.prom")}
    for path in FIXTURES.glob("demand_*.prom"):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# Written from") and "Expected" in first, path.name


def test_a_counter_printed_once_it_moved_is_missing_before_never_zero() -> None:
    reading, counters = pod_counters(page("demand_sglang_idle.prom"))
    assert in_flight(reading) == 16
    assert isinstance(counters.finished, Missing)
    assert counters.finished.kind is MissingKind.FAMILY_ABSENT
    assert counters.finished.family == "sglang:num_requests_total"
    assert "once a request has finished" in counters.finished.reason


def test_sglang_aborts_are_not_added_twice() -> None:
    assert "sglang:num_aborted_requests_total" not in DEMAND_SAMPLE_NAMES


def test_llamacpp_has_no_counter_of_finished_requests() -> None:
    reading, counters = pod_counters(page("llamacpp.prom"))
    assert reading.engine is Engine.LLAMACPP
    assert isinstance(counters.finished, Missing)
    assert counters.finished.kind is MissingKind.NOT_EXPORTED
    assert "finished requests" in counters.finished.reason
    assert not engine_supports("llamacpp", "demand")
    assert engine_supports("auto", "demand")


def test_what_demand_lacks_matches_what_the_engine_supports() -> None:
    pages = {
        Engine.VLLM: "demand_vllm_dp2.prom",
        Engine.SGLANG: "demand_sglang.prom",
        Engine.TGI: "demand_tgi.prom",
        Engine.TRITON: "demand_triton.prom",
        Engine.TRTLLM: "demand_trtllm_serve.prom",
        Engine.LLAMACPP: "llamacpp.prom",
    }
    assert set(pages) == set(Engine)
    for engine, fixture in pages.items():
        _, counters = pod_counters(page(fixture), engine)
        lacks = isinstance(counters.finished, Missing) and counters.finished.kind is MissingKind.NOT_EXPORTED
        assert lacks is not engine_supports(engine, InferenceMetric.DEMAND), engine
        no_tokens = isinstance(counters.prompt_tokens, Missing)
        assert no_tokens is not supports_tokens(engine) or engine is Engine.TRTLLM, engine
    assert not supports_tokens("triton") and not supports_tokens("llamacpp")
    # One of TensorRT-LLM's two pages prints token counters (trtllm-serve), the Triton backend's does not.
    assert supports_tokens("trtllm") and supports_tokens("auto")


@pytest.mark.parametrize("bad", ["NaN", "-3", "+Inf"])
def test_an_unusable_counter_is_missing(bad: str) -> None:
    text = (FIXTURES / "demand_vllm_dp2.prom").read_text()
    text = text.replace('finished_reason="abort",model_name="meta-llama/Llama-3.1-8B-Instruct"} 9.0', "X")
    text = text.replace("X", f'finished_reason="abort",model_name="meta-llama/Llama-3.1-8B-Instruct"}} {bad}')
    _, counters = pod_counters(parse_exposition(text, POD_PAGE_NAMES))
    assert isinstance(counters.finished, Missing)
    assert counters.finished.kind is MissingKind.NO_VALUE
