"""Writing Prometheus text exposition: the one writer behind every simulated page (demo, tests, benchmarks).

Exporters differ in their families, labels and number spelling, not in the page layout: HELP and TYPE
once per family, then one line per series.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from decimal import Decimal

Series = tuple[str, str]
"""One series of a family: its label text (`a="1",b="2"`, or "" for none) and its value as printed."""

Family = tuple[str, str, str, Iterable[Series]]
"""name, type (gauge, counter…), help text, series."""


def escape(value: str) -> str:
    """A label value as the text format needs it: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def label_text(labels: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{key}="{escape(value)}"' for key, value in labels)


def python_float(value: float) -> str:
    """A value as prometheus_client (Python: vLLM, SGLang) prints it; Go's spelling of NaN and infinities."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def go_float(value: float) -> str:
    """A value as client_golang (dcgm-exporter, AMD's exporter) prints it: strconv.FormatFloat(v, 'g', -1, 64)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    # Python's repr and Go both print the shortest digits that read back to the same float.
    _, digit_tuple, exponent = Decimal(repr(abs(value))).normalize().as_tuple()
    assert isinstance(exponent, int)  # finite values only reach here
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + exponent  # where the decimal point sits, counted from the first digit
    scientific = point - 1
    # With the shortest precision Go uses exponent form below 1e-4 and from 1e+06 on.
    if scientific < -4 or scientific >= 6:
        body = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{body}e{'-' if scientific < 0 else '+'}{abs(scientific):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


def render(families: Iterable[Family]) -> str:
    """A whole page: each family's HELP and TYPE lines, then its series."""
    lines: list[str] = []
    for name, kind, help_text, series in families:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(
            f"{name}{{{labels}}} {value}" if labels else f"{name} {value}" for labels, value in series
        )
    return "\n".join(lines) + "\n"
