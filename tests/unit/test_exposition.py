"""Tests for the filtered text-exposition parser: exact tables, errors, and agreement with prometheus_client."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from keda_gpu_scaler.pages.exposition import ExpositionError, Sample, parse_exposition

NAN = float("nan")
INF = float("inf")


def normalise(samples: list[Any]) -> list[tuple[str, dict[str, str], Any, Any]]:
    """Samples as comparable tuples: NaN == NaN here, and ints compare with floats."""
    return [(s.name, s.labels, "NaN" if math.isnan(s.value) else float(s.value), s[3]) for s in samples]


def reference(page: str) -> list[tuple[str, dict[str, str], Any, Any]]:
    """prometheus_client's reading of a page (its timestamps are in seconds: int(text) / 1000)."""
    return normalise([sample for family in text_string_to_metric_families(page) for sample in family.samples])


def ours(page: str) -> list[tuple[str, dict[str, str], Any, Any]]:
    """Our reading of a page, timestamps converted as prometheus_client does."""
    return [
        (name, labels, value, None if ts is None else ts / 1000)
        for name, labels, value, ts in normalise(parse_exposition(page))
    ]


NVIDIA_LABELS = {
    "gpu": "0",
    "UUID": "GPU-8b2281de-6d3c-22ed-0ec8-d3b864870b8b",
    "pci_bus_id": "00000000:8D:00.0",
    "device": "nvidia0",
    "modelName": "NVIDIA H100 80GB HBM3",
    "Hostname": "gpu-node-a",
    "DCGM_FI_DRIVER_VERSION": "550.144.03",
    "container": "vllm",
    "namespace": "llm",
    "pod": "vllm-qwen-7d9c8b6f5d-x2k4p",
}
NVIDIA_TEXT = ",".join(f'{k}="{v}"' for k, v in NVIDIA_LABELS.items())
NVIDIA_PAGE = f"""\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{{NVIDIA_TEXT}}} 87
DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-15338f3e",device="nvidia1",Hostname="gpu-node-a"}} 0
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{{{NVIDIA_TEXT}}} 73841
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{NVIDIA_TEXT}}} 0.812345
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",GPU_I_PROFILE="1g.10gb",GPU_I_ID="11",hostname="gpu-node-b"}} 0.412380
"""
AMD_LABELS = {
    "card_model": "102-G30211-0C",
    "container": "",
    "deployment_mode": "baremetal",
    "gpu_id": "1",
    "hostname": "mi300x-node-1",
    "job_id": "",
    "namespace": "",
    "pod": "",
    "serial_number": "692409005409",
}
AMD_TEXT = ",".join(f'{k}="{v}"' for k, v in AMD_LABELS.items())

# (id, page, names, expected samples)
VALID: list[tuple[str, str | bytes, set[str] | None, list[Sample]]] = [
    (
        "dcgm-exporter page, all",
        NVIDIA_PAGE,
        None,
        [
            Sample("DCGM_FI_DEV_GPU_UTIL", NVIDIA_LABELS, 87.0, None),
            Sample(
                "DCGM_FI_DEV_GPU_UTIL",
                {"gpu": "1", "UUID": "GPU-15338f3e", "device": "nvidia1", "Hostname": "gpu-node-a"},
                0.0,
                None,
            ),
            Sample("DCGM_FI_DEV_FB_USED", NVIDIA_LABELS, 73841.0, None),
            Sample("DCGM_FI_PROF_GR_ENGINE_ACTIVE", NVIDIA_LABELS, 0.812345, None),
            Sample(
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                {"gpu": "0", "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "11", "hostname": "gpu-node-b"},
                0.41238,
                None,
            ),
        ],
    ),
    (
        "dcgm-exporter page, filtered",
        NVIDIA_PAGE,
        {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"},
        [Sample("DCGM_FI_DEV_FB_USED", NVIDIA_LABELS, 73841.0, None)],
    ),
    (
        "amd page: sorted, empty labels, Go %g floats",
        f"# HELP gpu_energy_consumed uJ\n# TYPE gpu_energy_consumed gauge\n"
        f"gpu_energy_consumed{{{AMD_TEXT}}} 2.776148269e+09\ngpu_gfx_activity{{{AMD_TEXT}}} 1e-05\n",
        None,
        [
            Sample("gpu_energy_consumed", AMD_LABELS, 2776148269.0, None),
            Sample("gpu_gfx_activity", AMD_LABELS, 1e-05, None),
        ],
    ),
    ("no labels", "up 1\n", None, [Sample("up", {}, 1.0, None)]),
    ("empty label set", "up{} 1\n", None, [Sample("up", {}, 1.0, None)]),
    ("trailing comma", 'up{a="1",} 1\n', None, [Sample("up", {"a": "1"}, 1.0, None)]),
    (
        "escapes",
        r'm{a="q\"uote",b="back\\slash",c="new\nline",d="\\n",e="end\\"} 1' + "\n",
        None,
        [
            Sample(
                "m",
                {"a": 'q"uote', "b": "back\\slash", "c": "new\nline", "d": "\\n", "e": "end\\"},
                1.0,
                None,
            )
        ],
    ),
    ("unknown escape kept as written", r'm{a="x\ty"} 1', None, [Sample("m", {"a": "x\\ty"}, 1.0, None)]),
    (
        "separators and unicode in values",
        'm{a="x,y",b="}",c="k=v",d="{",e="GPU 0 — H100 ✓ 日本",f=""} 1\n',
        None,
        [
            Sample(
                "m",
                {"a": "x,y", "b": "}", "c": "k=v", "d": "{", "e": "GPU 0 — H100 ✓ 日本", "f": ""},
                1.0,
                None,
            )
        ],
    ),
    (
        "values that start or end with a comma or '='",
        'm{a=",",b=",x=",c="=",d="",} 1\nn{a=",",b=",x=\\"",} 2\n',
        None,
        [
            Sample("m", {"a": ",", "b": ",x=", "c": "=", "d": ""}, 1.0, None),
            Sample("n", {"a": ",", "b": ',x="'}, 2.0, None),
        ],
    ),
    (
        "numbers",
        "a 87\nb 0.812345\nc 2.776148269e+09\nd -1.5E-3\ne +Inf\nf -Inf\ng Inf\nh -7\ni 1e300\n",
        None,
        [
            Sample("a", {}, 87.0, None),
            Sample("b", {}, 0.812345, None),
            Sample("c", {}, 2776148269.0, None),
            Sample("d", {}, -0.0015, None),
            Sample("e", {}, INF, None),
            Sample("f", {}, -INF, None),
            Sample("g", {}, INF, None),
            Sample("h", {}, -7.0, None),
            Sample("i", {}, 1e300, None),
        ],
    ),
    ("NaN", "a NaN\n", None, [Sample("a", {}, NAN, None)]),
    (
        "timestamps",
        'a 1 1700000000123\nb{x="y"} 2 -5\nc 3 9223372036854775807\n',
        None,
        [
            Sample("a", {}, 1.0, 1700000000123),
            Sample("b", {"x": "y"}, 2.0, -5),
            Sample("c", {}, 3.0, 9223372036854775807),
        ],
    ),
    (
        "CRLF, no trailing newline",
        '# HELP a x\r\n# TYPE a gauge\r\na{b="c"} 1\r\n\r\nd 2 3',
        None,
        [Sample("a", {"b": "c"}, 1.0, None), Sample("d", {}, 2.0, 3)],
    ),
    (
        "comments, blank lines, HELP with odd text",
        '\n# just a comment\n#\n# HELP a says "hi" {x} \\n\n\n   \n# TYPE a counter\na 1\n# EOF\n',
        None,
        [Sample("a", {}, 1.0, None)],
    ),
    (
        "families and labels in any order",
        'z{b="1",a="2"} 1\na{a="2",b="1"} 2\nz{a="3"} 3\n',
        None,
        [
            Sample("z", {"b": "1", "a": "2"}, 1.0, None),
            Sample("a", {"a": "2", "b": "1"}, 2.0, None),
            Sample("z", {"a": "3"}, 3.0, None),
        ],
    ),
    (
        "whitespace the format allows",
        ' \t a { b = "1" ,\tc="2" , } \t 5 \t 6 \t\nd\t7\ne{f="g"}8\n  h 9  \n',
        None,
        [
            Sample("a", {"b": "1", "c": "2"}, 5.0, 6),
            Sample("d", {}, 7.0, None),
            Sample("e", {"f": "g"}, 8.0, None),
            Sample("h", {}, 9.0, None),
        ],
    ),
    ("bytes", 'a{b="é"} 1\n'.encode(), None, [Sample("a", {"b": "é"}, 1.0, None)]),
    (
        "filter: exact names, not prefixes",
        "gpu_used_vram 1\ngpu_used_vram_total 2\ngpu_used 3\namd_gpu_used_vram 4\n",
        {"gpu_used_vram"},
        [Sample("gpu_used_vram", {}, 1.0, None)],
    ),
    ("filter: nothing wanted", "a 1\nb 2\n", set(), []),
    (
        "filter: indented lines still found",
        "a 1\n   b 2\n\tb 3\n",
        {"b"},
        [Sample("b", {}, 2.0, None), Sample("b", {}, 3.0, None)],
    ),
    (
        "filter: malformed lines of other families are not validated",
        'a{b="unterminated 1\nc not-a-number\n1bad 1\nwanted 1\nwanted_x{{{ 2\n',
        {"wanted"},
        [Sample("wanted", {}, 1.0, None)],
    ),
    (
        "__name__-like but other label names",
        'a{__x="1",_="2"} 1',
        None,
        [Sample("a", {"__x": "1", "_": "2"}, 1.0, None)],
    ),
]


@pytest.mark.parametrize(
    ("page", "names", "expected"), [case[1:] for case in VALID], ids=[c[0] for c in VALID]
)
def test_valid_pages(page: str | bytes, names: set[str] | None, expected: list[Sample]) -> None:
    assert normalise(parse_exposition(page, names)) == normalise(expected)


# (page, line number, words the reason must contain)
INVALID: list[tuple[str | bytes, int, str]] = [
    ('a{b="c} 1', 1, "unterminated value of label 'b'"),
    ('# ok\na{b="c 1', 2, "unterminated value of label 'b'"),
    ('a{b="c\\"} 1', 1, "unterminated value"),
    ('a{b="c"', 1, "not closed"),
    ('a{b="c"}', 1, "missing value"),
    ("x 1\r\n\r\na", 3, "missing value"),
    ("a   \t", 1, "missing value"),
    ("a abc", 1, "'abc' is not a number"),
    ("a 1_000", 1, "not a number"),
    ("a ١", 1, "not a number"),
    ("a 0x10", 1, "not a number"),
    ("a 1 1.5", 1, "timestamp '1.5'"),
    ("a 1 9223372036854775808", 1, "timestamp"),
    ("a 1 2 3", 1, "unexpected text"),
    ('a{1b="c"} 1', 1, "invalid label name '1b'"),
    ('a{b-c="d"} 1', 1, "invalid label name 'b-c'"),
    ('a{"b"="c"} 1', 1, "invalid label name"),
    ('a{b="1",b="2"} 1', 1, "duplicate label name 'b'"),
    ('a{b="1", c="3" ,b="2"} 1', 1, "duplicate label name 'b'"),
    ('a{__name__="x"} 1', 1, "'__name__' is reserved"),
    ("a{b=c} 1", 1, "value of label 'b' is not quoted"),
    ('a{b="1" c="2"} 1', 1, "expected ',' or '}'"),
    ("a{,} 1", 1, "label"),
    ("a{b} 1", 1, "label"),
    ("1a 1", 1, "invalid metric name"),
    ("a-b 1", 1, "invalid character '-' in metric name 'a'"),
    ("a.b 1", 1, "invalid character '.'"),
    ("a 1\x0b", 1, "value"),
    ("a\x0b1", 1, "invalid character"),
    ("{} 1", 1, "invalid metric name"),
    (b'# ok\na 1\nb{c="\xff"} 1\n', 3, "invalid UTF-8"),
]


@pytest.mark.parametrize(("page", "line", "reason"), INVALID, ids=[repr(c[0])[:40] for c in INVALID])
def test_errors_name_line_and_reason(page: str | bytes, line: int, reason: str) -> None:
    with pytest.raises(ExpositionError) as caught:
        parse_exposition(page)
    message = str(caught.value)
    assert message.startswith(f"line {line}: "), message
    assert reason in message, message


def test_errors_are_raised_for_wanted_lines_when_filtering() -> None:
    with pytest.raises(ExpositionError, match=r"line 2: .*not a number"):
        parse_exposition("other garbage garbage garbage\nwanted nope\n", {"wanted"})


def test_an_error_is_a_value_error() -> None:
    assert issubclass(ExpositionError, ValueError)


def test_one_label_set_is_one_read_only_dict_per_page() -> None:
    # A label set repeated on the page is parsed once and shared (readers key per-label-set work on it);
    # nothing is shared between two parses, so a page never sees another page's labels.
    first, second, other = parse_exposition('a{x="1"} 1\nb{x="1"} 2\nc{x="2"} 3\n')
    assert first.labels is second.labels and first.labels is not other.labels
    again = parse_exposition('a{x="1"} 1\n')[0]
    assert again.labels == {"x": "1"} and again.labels is not first.labels


def test_huge_line_error_message_stays_short() -> None:
    with pytest.raises(ExpositionError) as caught:
        parse_exposition("a" * 100_000)
    assert len(str(caught.value)) < 200


# ---- property tests against prometheus_client -------------------------------------------------------

metric_names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True)
# prometheus_client rejects label names starting "__" (reserved); the format itself only reserves __name__.
label_names = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,10}|_[a-zA-Z0-9][a-zA-Z0-9_]{0,9}", fullmatch=True)
label_values = st.text(
    st.one_of(st.sampled_from('"\\\n,{}= #\t'), st.characters(codec="utf-8", exclude_characters="\r")),
    max_size=12,
)
help_texts = st.text(st.characters(codec="ascii", exclude_characters='\r\n"'), max_size=20)
blanks = st.sampled_from(["", " ", "\t", "  ", " \t "])
separators = st.sampled_from([" ", "\t", "   ", " \t"])


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def numbers(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["int", "float", "special"]))
    if kind == "int":
        return str(draw(st.integers(-(2**70), 2**70)))
    if kind == "special":
        return draw(st.sampled_from(["NaN", "+Inf", "-Inf", "Inf"]))
    value = draw(st.floats(allow_nan=True, allow_infinity=True))
    style = draw(st.sampled_from(["{!r}", "{:f}", "{:g}", "{:.17g}", "{:e}"]))
    return style.format(value)


@st.composite
def sample_lines(draw: st.DrawFn, name: str) -> str:
    labels = draw(st.dictionaries(label_names, label_values, max_size=5))
    # Half the lines are printed as exporters print them (no blanks in the label set), half spaced out.
    compact = draw(st.booleans())

    def blank() -> str:
        return "" if compact else draw(blanks)

    line = draw(st.sampled_from(["", " ", "\t "])) + name
    if draw(st.booleans()) or labels:
        pairs = [
            f'{blank()}{key}{blank()}={blank()}"{escape(value)}"{blank()}' for key, value in labels.items()
        ]
        trailing_comma = "," if draw(st.booleans()) and labels else ""
        line += blank() + "{" + ",".join(pairs) + trailing_comma + "}" + blank()
    else:
        line += draw(separators)
    if not line.endswith((" ", "\t")):
        line += draw(st.sampled_from(["", " "]))
    line += draw(numbers())
    if draw(st.booleans()):
        line += draw(separators) + str(draw(st.integers(-(2**63), 2**63 - 1)))
    return line + draw(st.sampled_from(["", " ", "\t"]))


@st.composite
def pages(draw: st.DrawFn) -> tuple[str, list[str]]:
    names = draw(st.lists(metric_names, unique=True, max_size=6))
    lines: list[str] = []
    for name in names:
        if draw(st.booleans()):
            lines.append(f"# HELP {name} {draw(help_texts)}")
        if draw(st.booleans()):
            lines.append(f"# TYPE {name} {draw(st.sampled_from(['gauge', 'untyped']))}")
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(["", "   ", "# a comment", "#"])))
        lines.extend(draw(st.lists(sample_lines(name), max_size=4)))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    page = newline.join(lines) + draw(st.sampled_from(["", newline]))
    return page, names


# The page properties build whole pages, each checked against prometheus_client: in `make test` a few
# dozen examples each keep the suite fast; `make soak` (HYPOTHESIS_PROFILE=soak) runs its full count.
_WHOLE_PAGES = settings(
    deadline=None,
    max_examples=settings.default.max_examples if settings.default.max_examples >= 1000 else 60,
)


@_WHOLE_PAGES
@given(pages())
def test_agrees_with_prometheus_client(page_and_names: tuple[str, list[str]]) -> None:
    page, _ = page_and_names
    assert ours(page) == reference(page)
    assert normalise(parse_exposition(page.encode())) == normalise(parse_exposition(page))


@_WHOLE_PAGES
@given(pages(), st.data())
def test_filtering_equals_filtering_the_full_result(
    page_and_names: tuple[str, list[str]], data: st.DataObject
) -> None:
    page, names = page_and_names
    wanted = data.draw(st.sets(st.sampled_from([*names, "x", "other_name"]) if names else st.just("x")))
    everything = normalise(parse_exposition(page))
    assert normalise(parse_exposition(page, wanted)) == [s for s in everything if s[0] in wanted]


@st.composite
def mangled_pages(draw: st.DrawFn) -> str:
    page, _ = draw(pages())
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(page)))
        if draw(st.booleans()) and at < len(page):
            page = page[:at] + page[at + 1 :]
        else:
            page = page[:at] + draw(st.sampled_from(list('{}",=\\ \t\n#ae1.-_'))) + page[at:]
    return page


@settings(deadline=None)
@given(
    st.one_of(st.text(), st.binary(), mangled_pages()),
    st.one_of(st.none(), st.sets(st.sampled_from(["a", "b", "up", "x_total", ""]))),
)
def test_any_input_parses_or_raises_exposition_error(page: str | bytes, names: set[str] | None) -> None:
    try:
        samples = parse_exposition(page, names)
    except ExpositionError as error:
        assert str(error).startswith("line ")
    else:
        assert all(isinstance(sample, Sample) for sample in samples)
        assert names is None or all(sample.name in names for sample in samples)


# ---- conflicting duplicates and the per-page series limit (the scrape path's options) ---------------


def test_conflicting_duplicate_series_are_an_error_naming_both_lines() -> None:
    page = 'a{x="1",y="2"} 30\nb 1\na{y="2",x="1"} 90\n'  # the same series, its labels in another order
    assert [s.value for s in parse_exposition(page)] == [30, 1, 90]  # off by default, as the format's parsers
    with pytest.raises(ExpositionError) as caught:
        parse_exposition(page, reject_conflicts=True)
    message = str(caught.value)
    assert message.startswith("line 3: ") and "line 1" in message and "30" in message and "90" in message


@pytest.mark.parametrize(
    "page",
    [
        'a{x="1"} 30\na{x="1"} 30\n',
        "a NaN\na NaN\n",
        'a{x="1"} 1\na{x="2"} 2\na 3\nb 3\n',
        "a 1 100\na 1 200\n",
    ],
    ids=["same value", "NaN twice", "other series", "same value, other timestamps"],
)
def test_same_value_twice_or_distinct_series_are_not_conflicts(page: str) -> None:
    assert normalise(parse_exposition(page, reject_conflicts=True)) == normalise(parse_exposition(page))


def test_conflicts_among_unwanted_lines_are_not_looked_at() -> None:
    assert len(parse_exposition("a 1\na 2\nb 3\n", {"b"}, reject_conflicts=True)) == 1


def test_more_samples_than_the_limit_is_an_error_naming_it() -> None:
    page = "".join(f'a{{i="{i}"}} 1\n' for i in range(6))
    assert len(parse_exposition(page, max_samples=6)) == 6
    with pytest.raises(ExpositionError, match=r"^line 6: more than 5 series on this page; the limit is 5"):
        parse_exposition(page, max_samples=5)
    # Only kept samples count.
    assert len(parse_exposition(page + "b 1\n", {"b"}, max_samples=1)) == 1


def _conflicting(samples: list[tuple[str, dict[str, str], Any, Any]]) -> bool:
    first: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
    for name, labels, value, _ in samples:
        key = (name, tuple(sorted(labels.items())))
        if key in first and first[key] != value:
            return True
        first.setdefault(key, value)
    return False


@_WHOLE_PAGES
@given(pages())
def test_conflicts_are_refused_exactly_when_prometheus_client_reads_two_values_for_one_series(
    page_and_names: tuple[str, list[str]],
) -> None:
    page, _ = page_and_names
    try:
        checked = parse_exposition(page, reject_conflicts=True)
    except ExpositionError as error:
        assert "printed again with another value" in str(error)
        assert _conflicting(reference(page))
    else:
        assert not _conflicting(reference(page))
        assert normalise(checked) == normalise(parse_exposition(page))
