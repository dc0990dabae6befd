"""bench/ decides through the product's own entries (the servicer, the store, the page readers), never
through the decision's pieces or the package's private names: what it measures is what a user runs."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
# The decision's pieces, which a benchmark would have to put together again around the product. (The
# HPA's formula, scaling.hpa_desired_replicas, is not one: the simulated HPA applies it to what the
# servicer answered, as Kubernetes does.)
DECISION_PIECES = re.compile(
    r"\b(pod_demand|over_window|with_pending|DemandPoint|DemandHistory|pending_evaluation|evaluate|pod_row"
    r"|aggregate)\b"
)
# A private module or name of the package (keda_gpu_scaler._proto, KEDA's generated wire messages, is
# the protocol every client speaks, not a part of the product's decision).
PRIVATE = re.compile(r"keda_gpu_scaler\.[a-z_.]*\._|from keda_gpu_scaler\S* import \(?[^)\n]*\b_[a-z]")


def offending_lines(pattern: re.Pattern[str]) -> list[str]:
    return [
        f"{path.relative_to(BENCH.parent)}:{number}: {line.strip()}"
        for path in sorted(BENCH.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]


def test_bench_uses_none_of_the_decisions_pieces() -> None:
    assert offending_lines(DECISION_PIECES) == []


def test_bench_uses_no_private_name_of_the_package() -> None:
    assert offending_lines(PRIVATE) == []
