"""A latency target (SLO) on `metric: demand` (SPEC §6): its keys, defaults, and misuse refused naming key,
value and range."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.core.errors import ConfigError
from keda_gpu_scaler.core.slo import SloTarget
from keda_gpu_scaler.core.trigger_parse import parse_trigger

DEMAND = {"metric": "demand", "threshold": "9", "podNamePrefix": "chat-"}


@pytest.mark.parametrize(
    ("extra", "slo"),
    [
        ({}, None),
        ({"sloTtftSeconds": "2"}, SloTarget(2.0, None, 0.95)),
        ({"sloTpotMs": "50"}, SloTarget(None, 50.0, 0.95)),
        (
            {"sloTtftSeconds": "600", "sloTpotMs": "10000", "sloAttainment": "0.999"},
            SloTarget(600, 10000, 0.999),
        ),
        ({"sloTtftSeconds": "0.25", "sloAttainment": "0.5"}, SloTarget(0.25, None, 0.5)),
        ({"sloTpotMsFromEnv": "40"}, SloTarget(None, 40.0, 0.95)),
    ],
)
def test_slo_metadata_parses(extra: dict[str, str], slo: SloTarget | None) -> None:
    assert parse_trigger({**DEMAND, **extra}).slo == slo


def test_targets_are_in_seconds() -> None:
    assert SloTarget(2.0, 50.0).targets() == {"ttft": 2.0, "tpot": 0.05, "itl": 0.05}
    assert SloTarget(None, 50.0).targets() == {"tpot": 0.05, "itl": 0.05}


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ({**DEMAND, "sloTtftSeconds": "0"}, ["sloTtftSeconds", "'0'", "0 < sloTtftSeconds <= 600"]),
        ({**DEMAND, "sloTtftSeconds": "600.1"}, ["sloTtftSeconds", "'600.1'", "<= 600"]),
        ({**DEMAND, "sloTtftSeconds": "-1"}, ["sloTtftSeconds", "'-1'", "0 < sloTtftSeconds"]),
        ({**DEMAND, "sloTtftSeconds": "nan"}, ["sloTtftSeconds", "not a number"]),
        ({**DEMAND, "sloTtftSeconds": "2s"}, ["sloTtftSeconds", "'2s'", "not a number"]),
        ({**DEMAND, "sloTpotMs": "0"}, ["sloTpotMs", "'0'", "0 < sloTpotMs <= 10000"]),
        ({**DEMAND, "sloTpotMs": "10001"}, ["sloTpotMs", "'10001'", "<= 10000"]),
        (
            {**DEMAND, "sloTpotMs": "50", "sloAttainment": "0.49"},
            ["sloAttainment", "'0.49'", "0.5 <= sloAttainment <= 0.999"],
        ),
        ({**DEMAND, "sloTpotMs": "50", "sloAttainment": "1"}, ["sloAttainment", "'1'", "0.999"]),
        ({**DEMAND, "sloTpotMs": "50", "sloAttainment": "95"}, ["sloAttainment", "'95'", "0.999"]),
        ({**DEMAND, "sloAttainment": "0.9"}, ["sloAttainment", "'0.9'", "sloTtftSeconds or sloTpotMs"]),
        (
            {"metric": "queue", "threshold": "5", "podNamePrefix": "c-", "sloTtftSeconds": "2"},
            ["sloTtftSeconds", "'2'", "only to metric=demand", "metric=queue"],
        ),
        (
            {"metric": "utilization", "threshold": "70", "podNamePrefix": "c-", "sloTpotMs": "40"},
            ["sloTpotMs", "'40'", "only to metric=demand", "metric=utilization"],
        ),
        (
            {"metric": "pending", "threshold": "1", "inferencePool": "pool", "sloAttainment": "0.9"},
            ["sloAttainment", "'0.9'", "only to metric=demand", "metric=pending"],
        ),
    ],
)
def test_bad_slo_metadata_names_key_value_and_range(metadata: dict[str, str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_trigger(metadata)
    for word in words:
        assert word in str(caught.value)


@pytest.mark.parametrize(
    ("metadata", "written"),
    [
        ({"threshold": "100.00001", "podNamePrefix": "vllm-"}, "threshold='100.00001'"),
        ({"threshold": "0.9999999", "podNamePrefix": "vllm-"}, "threshold='0.9999999'"),
        ({"threshold": "70", "sloTtftSeconds": "1.00000001"}, "sloTtftSeconds='1.00000001'"),
        ({"metric": "demand", "threshold": "5", "sloAttainment": "0.9500001"}, "sloAttainment='0.9500001'"),
    ],
)
def test_an_error_names_the_value_as_written_not_rounded(metadata: dict[str, str], written: str) -> None:
    # Reformatted (:g), 100.00001 read "threshold=100 is out of range ... threshold <= 100".
    with pytest.raises(ConfigError) as refused:
        parse_trigger(metadata)
    assert f"metadata {written} " in str(refused.value), refused.value


@pytest.mark.parametrize(
    ("engine", "key", "allowed"),
    [
        ("triton", "sloTtftSeconds", "no latency target"),
        ("triton", "sloTpotMs", "no latency target"),
        ("tgi", "sloTtftSeconds", "sloTpotMs"),
    ],
)
def test_a_latency_target_the_named_engine_prints_no_histogram_of_is_refused(
    engine: str, key: str, allowed: str
) -> None:
    # Triton prints no latency histogram, TGI none of the first token: the guard could never act.
    with pytest.raises(ConfigError) as refused:
        parse_trigger({"metric": "demand", "threshold": "10", "engine": engine, key: "2"})
    assert f"{key}='2'" in str(refused.value) and f"with {engine} state {allowed}" in str(refused.value)


def test_a_latency_target_the_named_engine_prints_is_taken() -> None:
    assert parse_trigger({"metric": "demand", "threshold": "10", "engine": "tgi", "sloTpotMs": "50"}).slo
