"""Benchmark-only probe: with BENCH_GC_PROBE set, a process reports every garbage collection ≥ 1 ms on stderr."""

import gc
import os
import sys
import time

if os.environ.get("BENCH_GC_PROBE"):
    _started = [0.0]

    def _probe(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            _started[0] = time.perf_counter()
            return
        pause = time.perf_counter() - _started[0]
        if pause >= 0.001:
            print(f"bench-gc-pause {info['generation']} {pause * 1000:.2f}", file=sys.stderr, flush=True)

    gc.callbacks.append(_probe)
