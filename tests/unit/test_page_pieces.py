"""Passes over a page made in pieces (so that none holds the GIL for long) find what one pass finds."""

from __future__ import annotations

import re
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from keda_gpu_scaler.pages import exposition
from keda_gpu_scaler.pages.exposition import ExpositionError, Sample
from keda_gpu_scaler.pages.gateways import epp, page_queue

NAMES = ["up", "up_total", "vllm:num_requests_waiting", "vllm:num_requests_running"]
NAME = st.sampled_from([*NAMES, "other", "u"])
BLANKS = st.sampled_from([" ", "\t", "  ", " \t"])


@st.composite
def lines(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["type", "help", "sample", "blank-led", "hash-inside", "empty", "junk"]))
    name = draw(NAME)
    if kind == "type":
        kind_word = draw(st.sampled_from(["gauge", "counter", "untyped", "", "gauge x", "g\u00e9"]))
        trailing = draw(st.sampled_from(["", " ", "\r", " \t\r"]))
        return f"#{draw(BLANKS)}TYPE{draw(BLANKS)}{name}{draw(BLANKS)}{kind_word}{trailing}"
    if kind == "help":
        return f"# HELP {name} some help"
    if kind == "sample":
        labels = draw(st.sampled_from(["", '{a="1"}', '{a="1",b="2"}', '{a="x y"}', '{a="1"']))
        value = draw(st.sampled_from(["1", "2.5", "NaN", "+Inf", "x", "1 1700000000000"]))
        return f"{name}{labels} {value}"
    if kind == "blank-led":
        return f"{draw(BLANKS)}{name} {draw(st.sampled_from(['1', '2']))}"
    if kind == "hash-inside":
        return f'{name}{{a="# TYPE {draw(NAME)} counter"}} 1'
    if kind == "empty":
        return ""
    return draw(st.text(alphabet='ab_:{}="# \t\r1\u00e9', max_size=30))


@st.composite
def pages(draw: st.DrawFn) -> tuple[str | bytes, set[str], int]:
    text = "\n".join(draw(st.lists(lines(), max_size=25)))
    if draw(st.booleans()):
        text += "\n"
    page: str | bytes = text
    if draw(st.booleans()):
        data = text.encode()
        if draw(st.booleans()) and data:
            # Bytes that are not UTF-8, anywhere, a newline's neighbour included.
            at = draw(st.integers(0, len(data)))
            data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82"])) + data[at:]
        page = data
    names = set(draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4)))
    return page, names, draw(st.integers(1, 48))


def one_pass_declared_types(page: str | bytes, names: set[str]) -> dict[str, str]:
    """declared_types as it was: one multiline regular expression over the whole decoded page."""
    text = page.decode("utf-8", "replace") if isinstance(page, bytes) else page
    alternation = "|".join(re.escape(name) for name in sorted(names))
    finder = re.compile(rf"^#[ \t]+TYPE[ \t]+({alternation})[ \t]+([^\s]*)[ \t\r]*$", re.MULTILINE)
    found: dict[str, str] = {}
    for match in finder.finditer(text):
        found.setdefault(match.group(1), match.group(2))
    return found


def parsed(page: str | bytes, names: set[str] | None, **options: object) -> list[tuple[object, ...]] | str:
    """The samples (NaN compared by its spelling) or the error, with its line number and reason."""
    try:
        samples: list[Sample] = exposition.parse_exposition(page, names, **options)  # type: ignore[arg-type]
    except ExpositionError as error:
        return f"error: {error}"
    return [(s.name, s.labels, repr(s.value), s.timestamp_ms) for s in samples]


def whole(page: str | bytes) -> mock._patch[int]:
    """One piece for the whole page: the single pass the pieces replace."""
    return mock.patch.object(exposition, "PIECE", len(page) + 1)


@given(pages())
def test_the_pieces_make_up_the_page_and_never_cut_a_line(case: tuple[str | bytes, set[str], int]) -> None:
    page, _, piece = case
    with mock.patch.object(exposition, "PIECE", piece):
        cuts = list(exposition.line_pieces(page))
    empty = page[:0]
    assert empty.join([page[start:end] for start, end in cuts]) == page  # type: ignore[arg-type]
    newline = "\n" if isinstance(page, str) else b"\n"
    for start, end in cuts[:-1]:
        assert page[end - 1 : end] == newline
        assert end - start >= piece
    assert all(end > start for start, end in cuts)
    assert [end for _, end in cuts[:-1]] == [start for start, _ in cuts[1:]]
    assert bool(cuts) == bool(page)


@given(pages())
def test_declared_types_in_pieces_finds_what_one_pass_over_the_page_finds(
    case: tuple[str | bytes, set[str], int],
) -> None:
    page, names, piece = case
    with mock.patch.object(exposition, "PIECE", piece):
        assert exposition.declared_types(page, names) == one_pass_declared_types(page, names)


@given(pages())
def test_the_parse_in_pieces_reads_what_one_pass_reads(case: tuple[str | bytes, set[str], int]) -> None:
    page, names, piece = case
    for wanted in (names, None):
        with whole(page):
            expected = parsed(page, wanted, max_samples=5, reject_conflicts=True)
        with mock.patch.object(exposition, "PIECE", piece):
            assert parsed(page, wanted, max_samples=5, reject_conflicts=True) == expected


@given(pages(), st.integers(0, 6))
def test_counting_series_in_pieces_refuses_where_one_pass_refuses(
    case: tuple[str | bytes, set[str], int], limit: int
) -> None:
    page, names, piece = case
    data = page.encode() if isinstance(page, str) else page
    with whole(data):
        expected = exposition.too_many_samples(data, names, limit)
    with mock.patch.object(exposition, "PIECE", piece):
        found = exposition.too_many_samples(data, names, limit)
    assert str(found) == str(expected)


@given(pages())
def test_blank_led_lines_counted_in_pieces_are_those_one_pass_counts(
    case: tuple[str | bytes, set[str], int],
) -> None:
    page, names, piece = case
    text = page.decode("utf-8", "replace") if isinstance(page, bytes) else page
    indented = re.compile(rf"^[ \t]+(?:{'|'.join(map(re.escape, sorted(names)))})(?=[{{ \t])", re.MULTILINE)
    with mock.patch.object(exposition, "PIECE", piece):
        assert exposition.count_in_pieces(indented, text) == len(indented.findall(text))
        assert exposition.has_blank_led_line(text) == (
            "\n " in text or "\n\t" in text or text.startswith((" ", "\t"))
        )


def test_a_queue_whose_lines_lie_far_apart_is_read_whole_without_splitting_what_lies_between() -> None:
    """An EPP page with the queue's two lines at its top and bottom: the fast path would split the
    whole page between them in one call, the general parser reads them in pieces; the queue is the same."""
    line = '{f}{{fairness_id="{a}",inference_pool="chat-pool",model_name="m",priority="0",target_model_name="m"}} {v}\n'
    first = line.format(f=epp.QUEUE, a="a", v=2)
    last = line.format(f=epp.QUEUE, a="b", v=3)
    between = "".join(f'other_family{{i="{i}"}} {i}\n' for i in range(2 * epp.MAX_LINE_CHARS // 10))
    assert epp._fast_columns(first + last, epp.QUEUE, 2) is not None  # together: the fast path
    apart = first + between + last
    assert epp._fast_columns(apart, epp.QUEUE, 2) is None
    assert page_queue(apart).totals == page_queue(first + last).totals == (("chat-pool", "m", 5.0),)
