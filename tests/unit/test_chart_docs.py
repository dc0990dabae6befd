"""scripts/chart_docs.py: values named after flags, the `# --` comment parser behind the chart's values table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import chart_docs

from keda_gpu_scaler.config.flags import FLAGS


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
