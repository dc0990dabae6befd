"""The numbers the wire can carry: the largest threshold and value, and the answer for any beyond them.

KEDA turns a metric's float into a Kubernetes quantity in milli-units held in an int64 (the HPA then
compares quantities), and `targetSize`/`metricValue` are int64 themselves: 9.2e15 is the most either
side can carry exactly enough to scale on. A threshold beyond MAX_WIRE_NUMBER is a bad argument; a value
beyond it, or one that is not finite (two 1e308 summed are inf), is a source giving numbers nobody can
scale on: UNAVAILABLE naming the pod and family it came from, never a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from keda_gpu_scaler.core.errors import NoData

# 1e15 is below 2**63 / 1000 (KEDA's milli-quantity) with room to spare, and far above any real target
# or load (a quadrillion requests per pod).
MAX_WIRE_NUMBER = 1e15


def carried(value: float) -> bool:
    """Whether a value fits the wire: finite and at most MAX_WIRE_NUMBER in size."""
    return math.isfinite(value) and abs(value) <= MAX_WIRE_NUMBER


def check_rows(rows: Iterable[tuple[Any, ...]]) -> None:
    """Raise NoData naming the first pod (or endpoint-picker replica) whose value the wire cannot carry.
    `rows`: PodRows (pod, family, value, ...)."""
    for row in rows:
        pod, family, value = row[0], row[1], row[2]
        if not carried(value):
            raise NoData(_beyond(f"pod {pod} ({family} metrics) gives {value:g}"))


def check_total(value: float, rows: Iterable[tuple[Any, ...]], what: str = "summed over the pods") -> None:
    """Raise NoData when the workload's value (a sum of values the wire carries) is beyond the wire,
    naming the pods that give the most; `what` says what made the value."""
    if carried(value):
        return
    largest = sorted(rows, key=lambda row: -abs(row[2]))[:3]
    named = ", ".join(f"pod {row[0]} ({row[1]} metrics) gives {row[2]:g}" for row in largest)
    raise NoData(_beyond(f"the value {value:g} {what}" + (f" ({named})" if named else "")))


def _beyond(what: str) -> str:
    return (
        f"{what}, which is not a finite number of at most {MAX_WIRE_NUMBER:g}: KEDA cannot carry it;"
        " check that source's page"
    )
