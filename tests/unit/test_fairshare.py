"""FairSlots: each namespace's own slots, at most half the common pool each, freed slots handed in turn;
PageWorkers: one job per owner at a time, owners in turn."""

from __future__ import annotations

import asyncio
import functools
import random
import threading

import pytest

from keda_gpu_scaler.collect.fairshare import FairSlots
from keda_gpu_scaler.collect.page_workers import PageWorkers


async def hold(slots: FairSlots, namespace: str, release: asyncio.Event, started: list[str]) -> None:
    async with slots.slot(namespace):
        started.append(namespace)
        await release.wait()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_namespace_hanging_everywhere_leaves_others_their_own_slots_then_half_the_pool() -> None:
    slots = FairSlots(shared=8, own=2)
    hangs = [asyncio.Event() for _ in range(300)]
    done = asyncio.Event()
    started: list[str] = []
    hostile = [asyncio.create_task(hold(slots, "hostile", hang, started)) for hang in hangs]
    await settle()
    assert slots.held("hostile") == 2 + 8  # alone, it may use the whole common pool
    healthy = [asyncio.create_task(hold(slots, "healthy", done, started)) for _ in range(6)]
    await settle()
    assert slots.held("healthy") == 2  # its own slots at once, whatever the other holds
    # Each common slot the hostile one frees goes to the healthy one until the hostile holds half.
    for hang in hangs[:4]:
        hang.set()
    await settle()
    assert slots.held("healthy") == 6 and slots.held("hostile") == 2 + 4
    done.set()
    await asyncio.gather(*healthy)
    await settle()
    assert slots.held("healthy") == 0 and slots.held("hostile") == 2 + 8  # alone again: the whole pool
    for hang in hangs:
        hang.set()
    await asyncio.gather(*hostile)
    assert slots.in_flight == 0 and started.count("hostile") == 300


async def test_freed_common_slots_go_to_the_waiting_namespaces_in_turn() -> None:
    slots = FairSlots(shared=2, own=1)
    releases = {ns: asyncio.Event() for ns in ("a", "b", "c")}
    started: list[str] = []
    tasks = [
        asyncio.create_task(hold(slots, ns, releases[ns], started))
        for ns in ("b", "c", "a", "a", "a", "b", "c")
    ]
    await settle()
    # Each has its own slot; a's second took a common one (its half), b's second the other; a's third
    # and c's second wait.
    assert sorted(started) == ["a", "a", "b", "b", "c"]
    releases["a"].set()
    await settle()
    # a's slots freed: its own goes to a's third, the common one to c (a is not alone: no second one).
    assert started.count("c") == 2 and started.count("a") == 3
    for event in releases.values():
        event.set()
    await asyncio.gather(*tasks)
    assert slots.in_flight == 0


async def test_a_cancelled_waiter_gives_nothing_away_and_takes_nothing() -> None:
    slots = FairSlots(shared=1, own=1)
    release = asyncio.Event()
    started: list[str] = []
    first = [asyncio.create_task(hold(slots, "a", release, started)) for _ in range(2)]
    waiting = asyncio.create_task(hold(slots, "a", release, started))
    await settle()
    assert slots.held("a") == 2
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    release.set()
    await asyncio.gather(*first)
    assert slots.in_flight == 0 and started == ["a", "a"]


async def test_a_waiter_cancelled_just_before_its_slot_frees_is_passed_over() -> None:
    slots = FairSlots(shared=1, own=1)
    first, second = asyncio.Event(), asyncio.Event()
    started: list[str] = []
    holders = [asyncio.create_task(hold(slots, "a", event, started)) for event in (first, second)]
    await settle()
    later = asyncio.Event()
    cancelled = asyncio.create_task(hold(slots, "a", later, started))
    waiting = asyncio.create_task(hold(slots, "a", later, started))
    await settle()
    # One holder ends first in the loop's order, then the cancellation lands: the one slot it frees must
    # skip the cancelled waiter and go to the next one.
    first.set()
    cancelled.cancel()
    await holders[0]
    await settle()
    assert cancelled.cancelled() and started == ["a", "a", "a"] and slots.held("a") == 2
    second.set()
    later.set()
    await asyncio.gather(holders[1], waiting)
    assert slots.in_flight == 0


async def test_random_holds_and_cancellations_keep_the_bounds_and_leave_nothing_behind() -> None:
    rng = random.Random(7)
    slots = FairSlots(shared=4, own=1)
    namespaces = ["a", "b", "c", "d"]
    peak = 0

    async def one(namespace: str) -> None:
        nonlocal peak
        async with slots.slot(namespace):
            peak = max(peak, slots.in_flight)
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)

    for _ in range(20):
        tasks = [asyncio.create_task(one(rng.choice(namespaces))) for _ in range(rng.randrange(5, 40))]
        await asyncio.sleep(0)
        for task in rng.sample(tasks, len(tasks) // 4):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert slots.in_flight == 0 and slots.waiting == 0
    assert 0 < peak <= 4 + 1 * len(namespaces)


# PageWorkers: the page worker threads, one job per owner at a time, owners taken in turn.


def test_page_work_runs_one_job_per_owner_and_takes_the_owners_in_turn() -> None:
    workers = PageWorkers(threads=2)
    ran: list[str] = []
    gate = threading.Event()

    def job(name: str) -> str:
        if name == "hostile-0":
            gate.wait(5)
        ran.append(name)
        return name

    hostile = [workers.submit("hostile", functools.partial(job, f"hostile-{i}")) for i in range(4)]
    # The hostile namespace holds one thread (its first job blocks); the other thread serves the others,
    # each in turn, at once, though the hostile jobs came first.
    others = [
        workers.submit(owner, functools.partial(job, f"{owner}-{i}"))
        for i in range(2)
        for owner in ("a", None)
    ]
    assert [future.result(5) for future in others] == ["a-0", "None-0", "a-1", "None-1"]
    assert ran == ["a-0", "None-0", "a-1", "None-1"]
    gate.set()
    assert [future.result(5) for future in hostile] == [f"hostile-{i}" for i in range(4)]
    assert ran[4:] == [f"hostile-{i}" for i in range(4)]


def test_a_page_job_whose_caller_stopped_waiting_is_skipped_and_errors_reach_the_caller() -> None:
    workers = PageWorkers(threads=1)
    gate = threading.Event()
    first = workers.submit("a", lambda: gate.wait(5))
    skipped = workers.submit("b", lambda: pytest.fail("a cancelled job ran"))
    assert skipped.cancel()
    failing = workers.submit("b", lambda: 1 / 0)
    gate.set()
    assert first.result(5) is True
    with pytest.raises(ZeroDivisionError):
        failing.result(5)
