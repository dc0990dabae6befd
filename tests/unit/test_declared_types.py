"""`# TYPE` lines are read with every separator the text format allows."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.pages.engines import wrong_types
from keda_gpu_scaler.pages.exposition import declared_types

FAMILY = "vllm:num_requests_running"


@pytest.mark.parametrize(
    "line",
    [
        f"# TYPE {FAMILY} counter",
        f"# TYPE {FAMILY}\tcounter",
        f"#\tTYPE\t{FAMILY}\tcounter",
        f"#  TYPE  {FAMILY}   counter  ",
        f"# TYPE {FAMILY} counter\r",
    ],
    ids=["spaces", "tab-before-type", "tabs", "several-blanks", "crlf"],
)
def test_a_counter_declared_with_any_blanks_is_not_read_as_a_level(line: str) -> None:
    page = f'{line}\n{FAMILY}{{model_name="m"}} 3\n'
    assert wrong_types(page) == {FAMILY: "counter"}
    assert wrong_types(page.encode()) == {FAMILY: "counter"}


def test_a_gauge_or_untyped_family_is_a_level() -> None:
    assert wrong_types(f"# TYPE {FAMILY}\tgauge\n# TYPE vllm:num_requests_waiting untyped\n") == {}


def test_only_the_wanted_families_and_their_first_declaration_count() -> None:
    page = (
        f"# TYPE {FAMILY}_total counter\n"  # another family whose name starts with the wanted one
        f"# HELP {FAMILY} counter\n"
        f"# TYPE {FAMILY} gauge\n"
        f"# TYPE {FAMILY} counter\n"
    )
    assert declared_types(page, {FAMILY}) == {FAMILY: "gauge"}
    assert declared_types(page, set()) == {}
