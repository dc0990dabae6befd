"""Reading large pages off the loop must not keep the process's garbage alive."""

from __future__ import annotations

import gc
import weakref

from support import GpuLine, dcgm_page

from keda_gpu_scaler.collect.scrape import GPU_EXPORTER_PAGES, _read_large


class _Node:
    partner: object


def test_cyclic_garbage_made_around_a_large_read_is_still_collected() -> None:
    # Garbage cycles are made all the time (an aborted call's exception and its traceback, for one).
    # Freezing the collector's generations after a large read kept every one of them for good.
    first, second = _Node(), _Node()
    first.partner, second.partner = second, first
    ref = weakref.ref(first)
    del first, second
    try:
        _read_large(dcgm_page([GpuLine("llm", "vllm-0", 50)]).encode(), None, GPU_EXPORTER_PAGES)
        gc.collect()
        assert ref() is None, "a reference cycle that was garbage survived a full collection"
    finally:
        gc.unfreeze()
