"""Benchmark-only probe: with BENCH_GC_PROBE set, a process reports on stderr every garbage collection of
1 ms or more, and (BENCH_LOOP_PROBE) how late a task sleeping 5 ms at a time on its event loop wakes up:
the wait any call arriving then would have had, measured inside the scaler and apart from the client.
BENCH_SLOW_CALLBACKS=FILE: every event-loop callback of 1 ms or more, to FILE (what the lateness is made of)."""

import asyncio
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

if os.environ.get("BENCH_LOOP_PROBE"):
    _SLEEP = 0.005

    async def _lateness() -> None:
        loop = asyncio.get_running_loop()
        late: list[str] = []
        while True:
            asked = loop.time()
            await asyncio.sleep(_SLEEP)
            late.append(f"{(loop.time() - asked - _SLEEP) * 1000:.2f}")
            if len(late) == 200:  # about one line a second
                print("bench-loop-late " + " ".join(late), file=sys.stderr, flush=True)
                late = []

    _run_forever = asyncio.BaseEventLoop.run_forever

    def _run_forever_probed(self: asyncio.BaseEventLoop) -> None:
        if not getattr(self, "_bench_probed", False):
            self._bench_probed = True  # type: ignore[attr-defined]
            self.call_soon(lambda: self.create_task(_lateness()))
        _run_forever(self)

    asyncio.BaseEventLoop.run_forever = _run_forever_probed  # type: ignore[method-assign]

if os.environ.get("BENCH_SLOW_CALLBACKS"):
    # Which callbacks of the event loop run for 1 ms or more (each one delays every call arriving meanwhile):
    # one line per such callback, "<ms> <what>" (what: the task's coroutine and where it waits now),
    # appended to the file the variable names. For looking into a tail, not part of any table.
    from asyncio import events

    _slow_log = open(os.environ["BENCH_SLOW_CALLBACKS"], "a", buffering=1)  # noqa: SIM115

    _handle_run = events.Handle._run

    def _what(handle: events.Handle) -> str:
        callback = handle._callback  # type: ignore[attr-defined]
        owner = getattr(callback, "__self__", None)
        if isinstance(owner, asyncio.Task):
            coro = owner.get_coro()
            frame = getattr(coro, "cr_frame", None)
            where = f"@{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno}" if frame else ""
            return str(getattr(coro, "__qualname__", None) or repr(coro)) + where
        return str(getattr(callback, "__qualname__", None) or repr(callback))

    def _run_timed(self: events.Handle) -> None:
        started = time.perf_counter()
        _handle_run(self)
        took = time.perf_counter() - started
        if took >= 0.001:
            try:
                what = _what(self)
            except Exception as error:  # the probe must never take the loop down
                what = f"? ({error!r})"
            print(f"{time.time():.3f} {took * 1000:.2f} {what}", file=_slow_log)

    events.Handle._run = _run_timed  # type: ignore[method-assign]

if os.environ.get("BENCH_CACHES_OFF"):
    # The caches benchmark (bench/bench_caches.py): each cache or policy named (";"-separated) is replaced
    # with its simple version before the scaler starts (bench/cache_switches.py).
    from bench.cache_switches import switch_off

    switch_off(os.environ["BENCH_CACHES_OFF"].split(";"))
