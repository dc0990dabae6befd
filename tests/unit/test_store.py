"""The store: freshness, recently seen pods, and per-namespace change notification."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from keda_gpu_scaler.collect.store import ATTRIBUTION_LOST, Page, Store, source_problem
from keda_gpu_scaler.core.snapshot import NamespaceView, SourceKind
from keda_gpu_scaler.pages.vendors import Family, GpuReading


def reading(namespace: str, pod: str, value: float) -> GpuReading:
    return GpuReading(Family.NVIDIA, namespace, pod, "GPU-0", "node", value, None, False, None)


def page(at: float, *readings: GpuReading, source: str = "http://a/metrics") -> Page:
    return Page.from_readings(source, at, readings)


def test_only_changed_namespaces_move() -> None:
    store = Store()
    store.record_page(page(0, reading("a", "p", 10), reading("b", "q", 20)))
    a, b = store.version("a"), store.version("b")
    store.record_page(page(5, reading("a", "p", 10), reading("b", "q", 20)))  # same content, later
    assert (store.version("a"), store.version("b")) == (a, b)
    store.record_page(page(10, reading("a", "p", 11), reading("b", "q", 20)))
    assert (store.version("a"), store.version("b")) == (a + 1, b)
    store.record_page(page(15, reading("a", "p", 11)))  # b's pod is gone
    assert store.version("b") == b + 1


def test_failure_and_recovery_move_the_page_namespaces() -> None:
    store = Store()
    store.record_page(page(0, reading("a", "p", 10)))
    before = store.version("a")
    store.record_failure("http://a/metrics", "HTTP 500")
    assert store.version("a") == before + 1
    store.record_failure("http://a/metrics", "HTTP 500")  # still failing: no news
    assert store.version("a") == before + 1
    store.record_page(page(10, reading("a", "p", 10)))  # same content, but recovered
    assert store.version("a") == before + 2


def test_view_freshness_and_recently_seen() -> None:
    store = Store()
    store.record_page(page(0, reading("a", "p", 10)))
    store.record_page(page(0, reading("a", "r", 30), source="http://b/metrics"))
    fresh = store.view("a", now=10, max_staleness=15)
    assert fresh.fresh_sources == 2 and {r.pod for r in fresh.readings} == {"p", "r"}
    store.record_page(page(20, reading("a", "p", 12)))
    store.record_failure("http://b/metrics", "timed out after 3s")
    view = store.view("a", now=20, max_staleness=15)
    assert view.fresh_sources == 1 and [r.pod for r in view.readings] == ["p"]
    assert "timed out" in view.recently_seen["r"]
    # However long the outage lasts, the pods stay (as missing pods): forgetting them would read as a load drop.
    late = store.view("a", now=100_000, max_staleness=15)
    assert set(late.recently_seen) == {"p", "r"}
    assert late.fresh_sources == 0


def test_a_page_that_lost_its_pod_labels_keeps_its_pods_as_missing_until_pods_return() -> None:
    store = Store()
    store.record_page(page(0, reading("a", "p", 10), reading("b", "q", 5)))
    # dcgm-exporter without the kubelet's pod-resources socket: GPU series, no pod labels.
    store.record_page(Page.from_readings("http://a/metrics", 5, (), gpu_series=True))
    view = store.view("a", now=6, max_staleness=15)
    assert view.fresh_sources == 1 and view.readings == ()
    assert "no pod labels" in view.recently_seen["p"]
    assert set(store.view("b", now=6, max_staleness=15).recently_seen) == {"q"}
    store.record_page(Page.from_readings("http://a/metrics", 10, (), gpu_series=True))  # still lost
    assert set(store.view("a", now=11, max_staleness=15).recently_seen) == {"p"}
    store.record_page(page(15, reading("a", "p", 12)))  # labels are back
    assert store.view("a", now=16, max_staleness=15).recently_seen == {}
    assert store.view("b", now=16, max_staleness=15).recently_seen == {}


def test_an_empty_page_without_gpu_series_forgets_nothing_it_never_had() -> None:
    store = Store()
    store.record_page(page(0))
    store.record_page(Page.from_readings("http://a/metrics", 5, (), gpu_series=True))
    assert store.view("a", now=6, max_staleness=15).recently_seen == {}


async def test_waiters_wake_on_their_namespace_and_on_close() -> None:
    store = Store()
    store.record_page(page(0, reading("a", "p", 10), reading("b", "q", 20)))
    seen_a, seen_b = store.version("a"), store.version("b")
    waiter_a = asyncio.create_task(store.wait_for_change("a", seen_a, 30))
    waiter_b = asyncio.create_task(store.wait_for_change("b", seen_b, 30))
    await asyncio.sleep(0)
    store.record_page(page(5, reading("a", "p", 99), reading("b", "q", 20)))
    await asyncio.wait_for(waiter_a, 1)
    assert not waiter_b.done()
    store.close()
    await asyncio.wait_for(waiter_b, 1)
    await asyncio.wait_for(store.wait_for_change("b", store.version("b"), 30), 1)  # closed: no waiting


async def test_a_namespace_waited_on_keeps_nothing_once_its_last_waiter_is_done() -> None:
    # A stream of a namespace without data (no pods yet, a typo) left its event behind for good.
    store = Store()
    waiters = [asyncio.create_task(store.wait_for_change(f"ns-{i}", 0, 0.05)) for i in range(40)]
    both = [asyncio.create_task(store.wait_for_change("shared", 0, t)) for t in (0.05, 30)]
    await asyncio.gather(*waiters, both[0])
    assert set(store._changed) == {"shared"}  # its other waiter is still there
    both[1].cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await both[1]
    assert store._changed == {} and store._waiters == {}


def test_asking_about_namespaces_without_data_keeps_nothing() -> None:
    store = Store()
    store.record_page(page(0, reading("a", "p", 10)))
    for index in range(1000):
        assert store.version(f"made-up-{index}") == 0
        store.view(f"made-up-{index}", now=1, max_staleness=15)
    assert len(store._versions) <= 1


def test_a_problem_names_the_age_of_the_data_now() -> None:
    store = Store()
    store.record_page(page(0, reading("a", "p", 10)))
    store.record_failure("http://a/metrics", "HTTP 500")
    assert "20.0s old" in store.view("a", 20, 10).problems[0]
    assert "21.0s old" in store.view("a", 21, 10).problems[0]


def walked_view(store: Store, namespace: str, now: float, max_staleness: float) -> NamespaceView:
    """A namespace's view as the definition says, walking every source: those naming pods of any
    namespace, then the namespace's own, each in the order it was added (the store keeps an index)."""
    states = sorted(store.sources(), key=lambda state: state.namespace is not None)  # stable: added order
    readings: list[GpuReading] = []
    fresh: list[str] = []
    recently_seen: dict[str, str] = {}
    problems: list[str] = []
    pod_problems: dict[str, str] = {}
    counted = [state for state in states if state.namespace in (None, namespace)]
    for state in counted:
        page = state.last_page
        age = None if page is None else now - page.collected_at
        if page is not None and age is not None and age <= max_staleness:
            fresh.append(state.source)
            readings.extend(page.by_namespace.get(namespace, ()))
            if state.last_attributed is not None:
                for reading in state.last_attributed.by_namespace.get(namespace, ()):
                    recently_seen.setdefault(reading.pod, f"{state.source}: {ATTRIBUTION_LOST}")
            continue
        reason = source_problem(state, now, max_staleness)  # the store's wording: which sources is checked
        if state.pod is not None:  # one pod's own page: said only to the triggers that read that pod
            recently_seen.setdefault(state.pod, reason)
            pod_problems.setdefault(state.pod, reason)
        else:
            problems.append(reason)
        for last in (page, state.last_attributed):
            if last is not None:
                for reading in last.by_namespace.get(namespace, ()):
                    recently_seen.setdefault(reading.pod, reason)
    return NamespaceView(
        tuple(readings), tuple(fresh), len(counted), recently_seen, tuple(problems), pod_problems
    )


SOURCES = ["http://a/metrics", "http://b/metrics", "http://c/metrics", "http://own-a/metrics"]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["page", "unattributed", "fail", "remove", "wait", "view"]),
            st.sampled_from(SOURCES),
            st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from("pq"), st.integers(0, 2)), max_size=3),
            st.floats(0, 12),
        ),
        max_size=40,
    )
)
def test_a_view_always_reads_as_walking_every_source(operations: list[Any]) -> None:
    """The view against its definition: after every page, page without pods, failure, removal or wait,
    it reads exactly as walking every source would (the store reads only the namespace's own sources and
    those naming pods of any namespace, through its index by kind and namespace)."""
    store = Store()
    now = 0.0
    for what, source, contents, seconds in operations:
        if source == "http://own-a/metrics" and source not in {state.source for state in store.sources()}:
            store.add_source(source, SourceKind.SCRAPE, "a", "own-pod")  # a source of namespace a alone
        if what == "page":
            store.record_page(page(now, *(reading(ns, pod, v) for ns, pod, v in contents), source=source))
        elif what == "unattributed":
            store.record_page(Page.from_readings(source, now, (), gpu_series=True))
        elif what == "fail":
            store.record_failure(source, "HTTP 500")
        elif what == "remove":
            store.remove_source(source)
        elif what == "wait":
            now += seconds
        for namespace in "ab":
            kept = store.view(namespace, now, 10)
            new = walked_view(store, namespace, now, 10)
            assert (
                kept.readings,
                kept.fresh,
                kept.sources,
                kept.recently_seen,
                kept.problems,
                kept.pod_problems,
            ) == (
                new.readings,
                new.fresh,
                new.sources,
                new.recently_seen,
                new.problems,
                new.pod_problems,
            )
