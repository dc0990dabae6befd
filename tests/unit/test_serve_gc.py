"""`serve`'s one garbage-collector setting: what start-up built is frozen once, and handed back at the end."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import signal

from conftest import FAST
from support import eventually

from keda_gpu_scaler.app import App, run_until_signalled


async def test_serve_freezes_what_start_up_built_and_hands_it_back_when_it_ends() -> None:
    # Long-lived objects frozen are not walked by every full collection; the process may go on after
    # serving (tests and tools embed it), so it is left as it was.
    gc.unfreeze()
    app = App(dataclasses.replace(FAST, exporter_urls=()))
    serving = asyncio.create_task(run_until_signalled(app))

    async def frozen() -> None:
        assert gc.get_freeze_count() > 0

    try:
        await eventually(frozen)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)
        await serving
    assert gc.get_freeze_count() == 0
