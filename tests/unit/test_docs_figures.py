"""Figures the README and the operating guide quote are the ones docs/BENCHMARKS.md measured last."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = (ROOT / "docs" / "BENCHMARKS.md").read_text()


def test_the_wake_from_zero_figures_are_the_benchmarks() -> None:
    found = re.search(
        r"\| Wake from zero, EPP queue → StreamIsActive true: median / worst \| ([\d.]+) s / ([\d.]+) s",
        BENCHMARKS,
    )
    assert found, "the summary line of docs/BENCHMARKS.md moved"
    median, worst = found.groups()
    readme = (ROOT / "README.md").read_text()
    assert f"`true` {median} s after requests queued at the\nmedian ({worst} s at worst)" in readme
    operating = (ROOT / "docs" / "operating.md").read_text()
    assert f"{median} s after requests queued at the median and {worst} s at worst" in operating
    assert f"| {median} s median, {worst} s worst (run) |" in operating


def test_the_in_flight_figures_are_the_benchmarks() -> None:
    rows = dict(re.findall(r"^\| (8|14) \| [\d.]+ \| ([\d.]+) \|", BENCHMARKS, re.MULTILINE))
    readme = (ROOT / "README.md").read_text()
    assert (
        f"about {round(float(rows['8']))} requests at 8 requests/s\nand {round(float(rows['14']))} at 14"
        in readme
    )
