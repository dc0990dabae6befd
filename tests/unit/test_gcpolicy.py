"""The collector policy: full collections freeze what they found alive; once per period everything is
handed back so that cycles which died frozen are freed."""

from __future__ import annotations

import gc

from keda_gpu_scaler.gcpolicy import FreezeAfterFullCollections


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> Node:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a


def test_full_collections_freeze_survivors_and_a_rescan_frees_cycles_that_died_frozen() -> None:
    now = [0.0]
    policy = FreezeAfterFullCollections(rescan_every=100.0, clock=lambda: now[0])
    gc.collect()
    gc.unfreeze()
    gc.disable()  # only the collections below
    policy.install()
    try:
        kept = cycle()
        gc.collect()  # a full collection: everything alive, the cycle too, is frozen
        assert policy.freezes == 1 and gc.get_freeze_count() > 0
        probe = [kept]
        del kept
        probe.clear()  # the cycle is garbage now, but frozen: no collection frees it
        frozen_garbage = gc.get_freeze_count()
        assert gc.collect() == 0
        now[0] = 100.0
        gc.collect()  # the period is over: handed back, no freeze this time
        assert policy.rescans == 1 and gc.get_freeze_count() == 0
        assert gc.collect() >= 2, "the rescan frees the cycle that died while frozen"
        assert frozen_garbage > 0
    finally:
        policy.remove()
        gc.unfreeze()
        gc.enable()
    assert policy not in gc.callbacks


def test_young_collections_do_nothing() -> None:
    policy = FreezeAfterFullCollections()
    policy("stop", {"generation": 0})
    policy("stop", {"generation": 1})
    policy("start", {"generation": 2})
    assert policy.freezes == policy.rescans == 0


def test_frozen_objects_growing_by_half_bring_a_walk_of_everything_early() -> None:
    policy = FreezeAfterFullCollections(rescan_every=1e9, clock=lambda: 0.0)
    gc.collect()
    gc.unfreeze()
    gc.disable()  # only the collections below: an automatic one would freeze in between
    policy.install()
    try:
        gc.collect()
        walked = gc.get_freeze_count()
        survivors = [Node() for _ in range(walked)]  # as many new long-lived objects as were frozen
        gc.collect()
        assert policy.freezes == 2 and policy.rescans == 0
        gc.collect()  # frozen objects grew past 1.5 times: handed back
        assert policy.rescans == 1 and gc.get_freeze_count() == 0
        del survivors
    finally:
        policy.remove()
        gc.unfreeze()
        gc.enable()


async def test_serve_makes_worker_threads_hand_the_gil_back_within_a_millisecond_while_it_runs() -> None:
    # Large pages and answers are decoded in worker threads: the event loop must not wait the default
    # 5 ms for the GIL each time it needs it back. The process's setting comes back when serve ends.
    import asyncio
    import dataclasses
    import os
    import signal
    import sys

    from conftest import FAST
    from support import eventually

    from keda_gpu_scaler.app import App, run_until_signalled

    before = sys.getswitchinterval()
    app = App(dataclasses.replace(FAST, exporter_urls=()))
    serving = asyncio.create_task(run_until_signalled(app))

    async def started() -> None:
        assert sys.getswitchinterval() <= 0.001

    try:
        await eventually(started)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)
        await serving
    assert sys.getswitchinterval() == before
