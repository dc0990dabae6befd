"""Benchmark: our filtered exposition parser against prometheus_client on 8-GPU exporter pages."""

from __future__ import annotations

import platform
import statistics
import timeit
from collections.abc import Callable, Set

from prometheus_client.parser import text_string_to_metric_families

from bench.pages import AMD_TRIGGER_FAMILIES, DCGM_TRIGGER_FAMILIES, amd_page, dcgm_page
from keda_gpu_scaler.pages.exposition import parse_exposition

REPEATS = 7


def _median_us(function: Callable[[], object]) -> float:
    """Median µs per call over REPEATS runs, each long enough (~0.2 s) for the clock not to matter."""
    timer = timeit.Timer(function)
    number, _ = timer.autorange()
    return statistics.median(timer.repeat(repeat=REPEATS, number=number)) / number * 1e6


def _prometheus_client(page: str) -> list[object]:
    return [sample for family in text_string_to_metric_families(page) for sample in family.samples]


def _row(title: str, page: str, names: Set[str]) -> str:
    everything = parse_exposition(page)
    # The same work on both sides: every sample of the page is read by both parsers.
    if len(everything) != len(_prometheus_client(page)):
        raise AssertionError(f"{title}: the parsers disagree on the number of samples")
    wanted = len(parse_exposition(page, names))
    filtered = _median_us(lambda: parse_exposition(page, names))
    unfiltered = _median_us(lambda: parse_exposition(page))
    reference = _median_us(lambda: _prometheus_client(page))
    return (
        f"| {title} | {len(page) / 1024:.0f} KiB, {len(everything)} samples | "
        f"{filtered:,.0f} ({len(names)} families, {wanted} samples) | {unfiltered:,.0f} | {reference:,.0f} | "
        f"{reference / filtered:.0f}× | {reference / unfiltered:.0f}× |"
    )


def run() -> str:
    """Measure and return the markdown section for docs/BENCHMARKS.md."""
    rows = [
        _row("NVIDIA dcgm-exporter, 8 × H100", dcgm_page(8), DCGM_TRIGGER_FAMILIES),
        _row("AMD device-metrics-exporter, 8 × MI300X", amd_page(8), AMD_TRIGGER_FAMILIES),
    ]
    return "\n".join(
        [
            "## Parsing an exporter page",
            "",
            "µs per page, median of "
            f"{REPEATS} timeit runs; Python {platform.python_version()} on {platform.machine()}. "
            "*Filtered* reads only the families a trigger needs; *all* reads every sample. "
            "prometheus_client is `text_string_to_metric_families`, which always reads everything. "
            "Pages come from `bench/pages.py`; each GPU's label set repeats in every family, as on real "
            "exporters, and the parser reads each distinct label set once per page.",
            "",
            "| Page | Size | Ours, filtered µs | Ours, all µs | prometheus_client µs | Speed-up, filtered "
            "| Speed-up, all |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )


if __name__ == "__main__":
    print(run())
