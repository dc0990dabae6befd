"""Table tests for the gateway layer: endpoint-picker pages in tests/fixtures/gateways/ → the pool's queue."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from keda_gpu_scaler.collect import scrape
from keda_gpu_scaler.collect.gateway_source import gateway_reader
from keda_gpu_scaler.collect.scrape import NotOurPage, read_page
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.pages.gateways import (
    GatewayProblem,
    NotAGatewayPage,
    PoolQueue,
    QueueMissing,
    QueueTable,
    epp,
    page_queue,
    read_queue,
    wrong_types,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "gateways"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen3-8B"


def page(name: str) -> QueueTable:
    """A fixture read as the scaler reads gateway pages."""
    return page_queue((FIXTURES / name).read_bytes())


# (fixture, model, expected total): the numbers are those written in each fixture's first line.
QUEUE_CASES = [
    ("llm_d_epp_v0_10.prom", None, 15),
    ("llm_d_epp_v0_10.prom", LLAMA, 12),
    ("llm_d_epp_v0_10.prom", QWEN, 8),
    ("gie_epp_before_llm_d.prom", None, 8),
    ("gie_epp_before_llm_d.prom", LLAMA, 2),
    ("llm_d_epp_both_names.prom", None, 3),
    ("llm_d_epp_flow_control_idle.prom", None, 0),
    ("llm_d_epp_nan.prom", QWEN, 2),
    ("gie_epp_flow_control_idle.prom", None, 0),
    ("llm_d_epp_sharded.prom", None, 8),
    ("llm_d_epp_no_endpoints_before.prom", None, 0),
    ("llm_d_epp_no_endpoints_after.prom", None, 0),
]


@pytest.mark.parametrize(("fixture", "model", "total"), QUEUE_CASES)
def test_fixture_pages(fixture: str, model: str | None, total: float) -> None:
    reading = read_queue(page(fixture), "chat-pool", "llm", model)
    assert isinstance(reading, PoolQueue), reading
    assert reading.total == total


def test_every_fixture_is_covered() -> None:
    covered = {case[0] for case in QUEUE_CASES} | {
        "llm_d_epp_flow_control_off.prom",
        "llm_d_epp_queue_counter.prom",
        "llm_d_epp_nan.prom",
        "llm_d_epp_other_pool.prom",
    }
    assert covered == {path.name for path in FIXTURES.iterdir()}


def test_every_fixture_names_the_release_it_follows() -> None:
    for path in FIXTURES.iterdir():
        first = path.read_text().splitlines()[0]
        assert first.startswith("# ") and ("Follows" in first or "Not a real EPP" in first), path.name


def test_queue_by_model_and_the_other_fold() -> None:
    reading = read_queue(page("llm_d_epp_v0_10.prom"), "chat-pool", "llm", None)
    assert isinstance(reading, PoolQueue)
    assert dict(reading.by_model) == {LLAMA: 7, QWEN: 3, "other": 5}
    assert reading.family == epp.QUEUE and not reading.other_counted
    for_llama = read_queue(page("llm_d_epp_v0_10.prom"), "chat-pool", "llm", LLAMA)
    assert isinstance(for_llama, PoolQueue) and for_llama.other_counted
    assert dict(for_llama.by_model) == {LLAMA: 7, "other": 5}


def test_a_page_with_both_names_counts_once_and_prefers_the_current_one() -> None:
    text = epp_page("chat-pool", {Queued("llama"): 3}, names=(epp.QUEUE_OLD,))
    text += epp_page("chat-pool", {Queued("llama"): 4}).split("\n", 3)[3]  # the current family after it
    reading = read_queue(page_queue(text), "chat-pool", "llm", None)
    assert isinstance(reading, PoolQueue)
    assert (reading.total, reading.family) == (4, epp.QUEUE)


def test_flow_control_off_tells_to_enable_the_feature_gate() -> None:
    reading = read_queue(page("llm_d_epp_flow_control_off.prom"), "chat-pool", "llm", None)
    assert isinstance(reading, QueueMissing)
    assert reading.kind is GatewayProblem.FLOW_CONTROL_OFF
    assert "flowControl" in reading.reason and "feature gate" in reading.reason


@pytest.mark.parametrize("model", [None, LLAMA, "llama"])
def test_nan_or_negative_sizes_are_no_value_never_zero(model: str | None) -> None:
    reading = read_queue(page("llm_d_epp_nan.prom"), "chat-pool", "llm", model)
    if model == LLAMA:  # no series of that model, no unusable one either: nothing is queued for it
        assert isinstance(reading, PoolQueue) and reading.total == 0
        return
    assert isinstance(reading, QueueMissing)
    assert reading.kind is GatewayProblem.NO_VALUE
    assert "nan" in reading.reason.lower() or "-1" in reading.reason


def test_another_pools_epp_is_named_not_read_as_ours() -> None:
    reading = read_queue(page("llm_d_epp_other_pool.prom"), "chat-pool", "llm", None)
    assert isinstance(reading, QueueMissing) and reading.kind is GatewayProblem.OTHER_POOL
    assert "code-pool" in reading.reason


IDLE_FIXTURES = ("llm_d_epp_flow_control_idle.prom", "gie_epp_flow_control_idle.prom")


@pytest.mark.parametrize("fixture", IDLE_FIXTURES)
def test_another_pools_idle_epp_is_named_not_read_as_an_empty_queue(fixture: str) -> None:
    """Flow control on and nothing queued yet: no queue series tells the pool, but its saturation (and its
    turned-away counters) do. Every one of them naming code-pool: code-pool's picker, never chat-pool's 0."""
    text = (FIXTURES / fixture).read_text().replace("chat-pool", "code-pool")
    reading = read_queue(page_queue(text), "chat-pool", "llm", None)
    assert isinstance(reading, QueueMissing) and reading.kind is GatewayProblem.OTHER_POOL, reading
    assert "code-pool" in reading.reason
    turned_away = (
        "# TYPE llm_d_epp_flow_control_requests_total counter\n"
        'llm_d_epp_flow_control_requests_total{inference_pool="code-pool",outcome="RejectedNoEndpoints",'
        'priority="0"} 2\n'
    )
    without_saturation = epp_page("code-pool", {}, flow_control=False) + turned_away
    reading = read_queue(page_queue(without_saturation), "chat-pool", "llm", None)
    assert isinstance(reading, QueueMissing) and reading.kind is GatewayProblem.OTHER_POOL, reading
    # Ours by name (with or without its namespace), or naming no pool at all: an idle picker of ours.
    for label in ("chat-pool", "llm/chat-pool"):
        mine = (
            (FIXTURES / fixture)
            .read_text()
            .replace('inference_pool="chat-pool"', f'inference_pool="{label}"')
        )
        reading = read_queue(page_queue(mine), "chat-pool", "llm", None)
        assert isinstance(reading, PoolQueue) and reading.total == 0, reading


def test_the_pool_label_may_carry_its_namespace() -> None:
    text = epp_page("llm/chat-pool", {Queued("llama"): 2})
    reading = read_queue(page_queue(text), "chat-pool", "llm", None)
    assert isinstance(reading, PoolQueue) and reading.total == 2


def test_a_queue_declared_as_a_counter_is_refused_naming_its_type() -> None:
    body = (FIXTURES / "llm_d_epp_queue_counter.prom").read_bytes()
    assert wrong_types(body) == {epp.QUEUE: "counter"}
    with pytest.raises(NotOurPage, match=r"llm_d_epp_flow_control_queue_size is a counter"):
        read_page(body, gateway_reader("llm", "chat-pool", "epp-0"))


def test_a_page_that_is_not_an_epps_is_refused() -> None:
    vllm = b'# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="llama"} 3\n'
    with pytest.raises(NotOurPage, match="no endpoint-picker"):
        read_page(vllm, gateway_reader("llm", "chat-pool", "epp-0"))


def test_a_replica_page_is_filed_under_its_pool_and_replica() -> None:
    body = (FIXTURES / "llm_d_epp_v0_10.prom").read_bytes()
    by_namespace = read_page(body, gateway_reader("llm", "chat-pool", "epp-0"))
    (replica,) = by_namespace["llm"]
    assert (replica.namespace, replica.pool, replica.replica, replica.table.family) == (
        "llm",
        "chat-pool",
        "epp-0",
        epp.QUEUE,
    )  # type: ignore[attr-defined]


def test_the_simulated_page_reads_back_its_queue() -> None:
    queue = {Queued("llama", "a"): 2, Queued("llama", "b", "5"): 1.0, Queued("qwen"): 0}
    text = epp_page("chat-pool", queue)
    reading = read_queue(page_queue(text), "chat-pool", "llm", "llama")
    assert isinstance(reading, PoolQueue) and reading.total == 3
    off = epp_page("chat-pool", queue, flow_control=False)
    assert isinstance(read_queue(page_queue(off), "chat-pool", "llm", None), QueueMissing)
    assert not math.isnan(reading.total)


def _line(name: str, labels: str, value: str) -> str:
    return f"{name}{{{labels}}} {value}\n"


SORTED = 'fairness_id="a",inference_pool="chat-pool",model_name="m1",priority="0",target_model_name="{t}"'


def test_client_golangs_layout_and_any_other_read_alike() -> None:
    fast = epp_page("chat-pool", {Queued("m1", "a"): 2, Queued("m2", "b", "5"): 3, Queued("m1", "c"): 1})
    # The same series as Prometheus' /federate prints them: other labels, another order, a timestamp.
    federated = "".join(
        f'{epp.QUEUE}{{target_model_name="{m}",job="epp",fairness_id="{f}",inference_pool="chat-pool",'
        f'priority="{p}",model_name="{m}"}} {v} 1764633600000\n'
        for m, f, p, v in (("m1", "a", "0", 2), ("m2", "b", "5", 3), ("m1", "c", "0", 1))
    )
    one_odd_line = fast.replace('fairness_id="c"', 'fairness_id="c",instance="10.0.0.7:9090"')
    tables = [page_queue(text) for text in (fast, federated + "llm_d_epp_ready_endpoints 0\n", one_odd_line)]
    assert tables[0].totals == (("chat-pool", "m1", 3.0), ("chat-pool", "m2", 3.0))
    assert tables[1].totals == tables[0].totals and tables[2].totals == tables[0].totals


def test_a_series_printed_twice_counts_once_or_fails_the_page_when_its_values_differ() -> None:
    head = "llm_d_epp_ready_endpoints 0\n"
    twice = head + _line(epp.QUEUE, SORTED.format(t="m1"), "0") * 2
    assert page_queue(twice).totals == (("chat-pool", "m1", 0.0),)
    again = head + _line(epp.QUEUE, SORTED.format(t="m1"), "2") * 2
    assert page_queue(again).totals == (("chat-pool", "m1", 2.0),)
    differ = (
        head + _line(epp.QUEUE, SORTED.format(t="m1"), "2") + _line(epp.QUEUE, SORTED.format(t="m1"), "5")
    )
    with pytest.raises(NotAGatewayPage, match="printed twice"):
        page_queue(differ)


def test_an_unlabelled_queue_line_is_read_not_skipped() -> None:
    table = page_queue(f"{epp.QUEUE} 4\n" + _line(epp.QUEUE, SORTED.format(t="m1"), "1"))
    assert table.totals == (("", "", 4.0), ("chat-pool", "m1", 1.0))


def test_more_queue_series_than_the_limit_fail_the_page() -> None:
    body = "".join(_line(epp.QUEUE, SORTED.format(t=f"m{i}"), "1") for i in range(11)).encode()
    with pytest.raises(NotAGatewayPage, match="11 series; at most 10"):
        epp.queue_table(body, 10)


def test_a_page_without_any_epp_family_is_not_an_epps() -> None:
    with pytest.raises(NotAGatewayPage, match="no endpoint-picker"):
        page_queue('vllm:num_requests_waiting{model_name="l"} 3\n')


def test_client_golangs_layout_takes_the_fast_path() -> None:
    """The speed of reading an EPP at its caps comes from this path: a page in client_golang's layout
    must not fall back to the general parser (the result would be the same, only 5× slower)."""
    for text in (
        epp_page("chat-pool", {Queued(f"m{i}", f"t{i % 3}", str(i % 2)): i for i in range(30)}),
        (FIXTURES / "llm_d_epp_v0_10.prom").read_text(),
    ):
        lines = epp._count_lines(text, epp.QUEUE, epp._indentation(text))
        assert lines > 0 and epp._fast_columns(text, epp.QUEUE, lines) is not None


@pytest.mark.parametrize(
    "joint",
    [
        "} 3 1764633600000\n",  # a timestamp
        "} 1_000\n",  # not a number in the text format, though float() reads it
        "}\t3\n",  # a tab
    ],
)
def test_anything_else_between_two_series_goes_through_the_general_parser(joint: str) -> None:
    first = _line(epp.QUEUE, SORTED.format(t="m1"), "2")
    second = _line(epp.QUEUE, SORTED.format(t="m2"), "1")
    text = "llm_d_epp_ready_endpoints 0\n" + first.replace("} 2\n", joint) + second
    fast = epp._fast_columns(text, epp.QUEUE, 2)
    assert fast is None or epp._totals(fast, epp.QUEUE) is None
    if joint.startswith("} 3 "):  # valid text: the general parser reads it
        assert page_queue(text).totals == (("chat-pool", "m1", 3.0), ("chat-pool", "m2", 1.0))


def test_a_queue_line_with_blanks_before_its_name_is_read_not_skipped() -> None:
    # The text format allows blanks before a sample's name: such a line holds requests too.
    text = epp_page("chat-pool", {Queued(LLAMA): 5})
    indented = text.replace(f"\n{epp.QUEUE}{{", f"\n  {epp.QUEUE}{{")
    assert indented != text
    assert page_queue(indented).totals == page_queue(text).totals == (("chat-pool", LLAMA, 5.0),)


@pytest.mark.parametrize("blank", [" ", "\t", "  "], ids=["space", "tab", "two-spaces"])
def test_a_queue_declared_as_a_counter_with_any_blanks_is_refused(blank: str) -> None:
    body = f'# TYPE{blank}{epp.QUEUE}{blank}counter\n{epp.QUEUE}{{inference_pool="p"}} 3\n'.encode()
    assert wrong_types(body) == {epp.QUEUE: "counter"}


def test_a_page_at_the_caps_with_as_many_other_lines_is_not_refused_for_its_size() -> None:
    # 1,000 models × 10 fairness ids of queue series, and as many lines of another family beside them:
    # over 20,000 lines, but only the queue's 10,000 series are read.
    queue = {Queued(f"model-{m}", f"tenant-{f}"): 1.0 for m in range(1_000) for f in range(10)}
    text = epp_page("chat-pool", queue)
    other = "".join(f'llm_d_epp_request_running{{model_name="model-{i}"}} 1\n' for i in range(12_000))
    body = (text + other).encode()
    reader = gateway_reader("llm", "chat-pool", "epp-0")
    # The screen a page over 256 KiB passes before it is read must not count lines it does not read.
    assert len(body) > scrape.PARSE_OFF_LOOP_BYTES
    assert scrape._screen(body, reader, None)[1] is None
    (reading,) = read_page(body, reader)["llm"]
    assert sum(total for _, _, total in reading.table.totals) == 10_000


def test_a_queue_printed_without_model_labels_counts_for_every_model() -> None:
    # Older Inference Extension pickers label their queue by fairness id and priority only: which model
    # the held requests are for is unknown, so they count for any `model` (as `other` does). `model:
    # llama` read them as 0 and inactive, saying nothing was queued for it: a missed wake.
    from keda_gpu_scaler.core.pending import ReplicaInput, pending_evaluation
    from keda_gpu_scaler.core.trigger_parse import parse_trigger

    page = 'inference_extension_flow_control_queue_size{fairness_id="default",priority="0"} 7\n'
    spec = parse_trigger(
        {"metric": "pending", "threshold": "1", "inferencePool": "chat-pool", "model": "llama"}
    )
    found = pending_evaluation([ReplicaInput("epp-0", page_queue(page))], spec, "llm", "none")
    assert (found.evaluation.value, found.evaluation.active) == (7.0, True)
    assert any("no model label" in note for note in found.notes), found.notes
