"""scripts/chart_docs.py: values named after flags, the `# --` comment parser behind the chart's values table."""

from __future__ import annotations

import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import chart_docs

from keda_gpu_scaler.config.flags import FLAGS, Flag
from keda_gpu_scaler.core.value_parsers import NumberParser, SettingsError


def test_value_names_map_back_to_the_environment_variable() -> None:
    # The chart turns flags.<name> into KEDA_GPU_SCALER_<snakecase(name) upper>: the two must meet.
    for flag in FLAGS:
        name = chart_docs.value_name(flag)
        snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in name)
        assert f"KEDA_GPU_SCALER_{snake.upper()}" == flag.env, flag.name


def test_flags_block_lists_every_flag_the_chart_does_not_set_itself() -> None:
    block = yaml.safe_load(chart_docs.flags_block())["flags"]
    assert set(block) == {chart_docs.value_name(f) for f in FLAGS if f.name not in chart_docs.STRUCTURED}
    assert block["kubernetes"] == "on" and block["logFormat"] == "json"
    assert all(v is None for k, v in block.items() if k not in ("kubernetes", "logFormat"))
    assert set(chart_docs.STRUCTURED) <= {f.name for f in FLAGS}


def test_flag_schema_follows_the_flag() -> None:
    for flag in FLAGS:
        schema = chart_docs.flag_schema(flag)
        if flag.choices:
            assert schema["enum"] == [*flag.choices, None]
        elif flag.repeatable:
            assert schema["type"] == ["array", "null"]


def _as_rendered(value: float) -> str:
    """A number as the chart writes it into the environment: whole numbers without a decimal point."""
    return str(int(value)) if value == int(value) else repr(value)


NUMBER_FLAGS = [flag for flag in FLAGS if isinstance(flag.parse, NumberParser)]


@pytest.mark.parametrize("flag", NUMBER_FLAGS, ids=lambda flag: flag.name)
def test_number_flag_schema_takes_what_the_flag_takes(flag: Flag) -> None:
    # The schema comes from the parser's own bounds: what it refuses, the chart refuses at install.
    parse = flag.parse
    assert isinstance(parse, NumberParser)
    validator = jsonschema.Draft202012Validator(chart_docs.flag_schema(flag))
    edges = [parse.low, parse.high] if parse.low is not None and parse.high is not None else [1, 10**9]
    candidates = [0, -1, 1, 7, 1.5, 0.0001, *edges]
    candidates += [edge * factor for edge in edges for factor in (0.999, 1.001)]
    for value in candidates:
        try:
            parse(flag.name, _as_rendered(value))
            taken = True
        except SettingsError:
            taken = False
        assert validator.is_valid(value) == taken, (flag.name, value)
    assert validator.is_valid(None) and not validator.is_valid("7")


def test_documented_values_reads_comments_and_nesting() -> None:
    text = (
        "a:\n"
        "  # -- the b\n"
        "  # continued\n"
        "  b: 1\n"
        "  # -- a map documented as one row\n"
        "  c:\n"
        "    d: [x]\n"
        "    e:\n"
        "      - f\n"
        "# -- top\n"
        "g: {}\n"
    )
    assert chart_docs.documented_values(text) == [
        ("a.b", "the b continued"),
        ("a.c", "a map documented as one row"),
        ("g", "top"),
    ]
    table = chart_docs.values_table(text)
    assert '| `a.c` | `{"d":["x"],"e":["f"]}` | a map documented as one row |' in table


@pytest.mark.parametrize("text", ["a: 1\n", "a:\n  b: 2\n"])
def test_an_undocumented_value_is_an_error(text: str) -> None:
    with pytest.raises(ValueError, match="no `# --` comment"):
        chart_docs.documented_values(text)


def test_table_cells_escape_pipes() -> None:
    table = chart_docs.values_table('# -- a | b\nx: "c|d"\n')
    assert '| `x` | `"c\\|d"` | a \\| b |' in table


def test_with_table_needs_both_markers() -> None:
    assert chart_docs.with_table(f"x\n{chart_docs.TABLE_BEGIN}old{chart_docs.TABLE_END}y", "new\n") == (
        f"x\n{chart_docs.TABLE_BEGIN}new\n{chart_docs.TABLE_END}y"
    )
    with pytest.raises(ValueError):
        chart_docs.with_table("no markers", "t")
