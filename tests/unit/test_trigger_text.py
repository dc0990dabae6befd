"""Metadata values keep no hidden characters: a YAML `|` block ends every value with a newline."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.core.errors import ConfigError
from keda_gpu_scaler.core.trigger_parse import parse_trigger

VALID = {
    "gpu": {"threshold": "70", "podNamePrefix": "web-", "metricName": "gpu-util", "nvidiaField": "auto"},
    "inference": {
        "threshold": "8",
        "metric": "requests",
        "podNamePrefix": "vllm-",
        "engine": "vllm",
        "model": "qwen",
        "metricsPort": "8000",
        "metricsPath": "/metrics",
    },
}
CASES = [(kind, key) for kind, metadata in VALID.items() for key in metadata]


@pytest.mark.parametrize(("kind", "key"), CASES, ids=[f"{kind}-{key}" for kind, key in CASES])
@pytest.mark.parametrize("ending", ["\n", "\r\n", " ", "\t"], ids=["lf", "crlf", "space", "tab"])
def test_a_value_with_a_trailing_newline_or_blank_is_refused_naming_the_key(
    kind: str, key: str, ending: str
) -> None:
    parse_trigger(VALID[kind])  # valid as written
    metadata = dict(VALID[kind], **{key: VALID[kind][key] + ending})
    with pytest.raises(ConfigError) as raised:
        parse_trigger(metadata)
    assert key in str(raised.value)


def test_a_pod_selector_ending_in_a_newline_selects_what_it_says() -> None:
    # Blanks around selector terms are insignificant, as in Kubernetes' own selector syntax.
    assert parse_trigger({"threshold": "70", "podSelector": "app=web\n"}).pod_selector is not None


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("16\n", "is not a number: it ends in a newline (a YAML `|` block keeps its last newline"),
        ("16\r\n", "is not a number: it ends in a newline"),
        ("16 ", "is not a number: it ends in a blank;"),
        ("\t16", "is not a number: it starts with a tab;"),
    ],
    ids=["lf", "crlf", "space", "leading-tab"],
)
@pytest.mark.parametrize("key", ["threshold", "activationThreshold"])
def test_a_number_with_white_space_around_it_names_the_character(key: str, raw: str, said: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_trigger({"threshold": "16", key: raw})
    assert f"metadata {key}={raw!r} {said}" in str(raised.value)
