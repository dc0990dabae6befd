"""The demo's `/load` query for an inference pod, read into what to pin, or the error to answer with."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from keda_gpu_scaler.demo.layout import INFERENCE_LOAD_PARAMETERS, MAX_PINNED_REQUESTS


@dataclass(frozen=True)
class InferenceLoad:
    release: bool = False  # value=auto: back to the moving pattern
    counts: Mapping[str, int] | None = None  # value=N (in flight), or running=N and/or waiting=N
    kv_cache_percent: float | None = None


def read_inference_load(pod: str, query: Mapping[str, str]) -> InferenceLoad | str:
    """running= and/or waiting=, or value=N (in flight), or value=auto; a string is the 400's message."""
    raw_value = query.get("value")
    given = [key for key in INFERENCE_LOAD_PARAMETERS if key in query]
    allowed = (
        f"running=N and/or waiting=N (whole numbers from 0 to {MAX_PINNED_REQUESTS}; the other one is 0),"
        " or value=N (N requests in flight, split as the server would), optionally kv_cache=PERCENT;"
        " or value=auto alone to return to the moving pattern"
    )
    if raw_value is not None and raw_value.strip().lower() == "auto":
        if given:
            return f"query parameter 'value'='auto' releases pod {pod!r} and takes no {given[0]!r}; allowed: {allowed}"
        return InferenceLoad(release=True)
    counts: dict[str, int] = {}
    for key in ("value", "running", "waiting"):
        raw = query.get(key)
        if raw is None:
            continue
        try:
            count = int(raw.strip())
        except ValueError:
            return f"query parameter {key!r}={raw!r} is not a whole number of requests; allowed: {allowed}"
        if not 0 <= count <= MAX_PINNED_REQUESTS:
            return f"query parameter {key!r}={raw!r} is out of range; allowed: {allowed}"
        counts[key] = count
    if "value" in counts and ("running" in counts or "waiting" in counts):
        other = "running" if "running" in counts else "waiting"
        return (
            f"query parameters 'value' and {other!r} both set the requests of pod {pod!r}; give one;"
            f" allowed: {allowed}"
        )
    if not counts:
        what = (
            "only 'kv_cache' given"
            if "kv_cache" in query
            else "missing query parameter 'running' or 'waiting'"
        )
        return f"{what} for inference pod {pod!r}; allowed: {allowed}"
    kv_percent: float | None = None
    raw_kv = query.get("kv_cache")
    if raw_kv is not None:
        try:
            kv_percent = float(raw_kv)
        except ValueError:
            return (
                f"query parameter 'kv_cache'={raw_kv!r} is not a number; allowed: a percentage from 0 to 100"
            )
        if not (math.isfinite(kv_percent) and 0 <= kv_percent <= 100):
            return (
                f"query parameter 'kv_cache'={raw_kv!r} is out of range; allowed: a percentage from 0 to 100"
            )
    return InferenceLoad(False, counts, kv_percent)
