"""A source's next page read through the plan of its last one (ReadingsMemo) reads exactly as without it."""

from __future__ import annotations

import math
import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from keda_gpu_scaler.collect.scrape import GPU_EXPORTER_PAGES, SourceMemo, read_page
from keda_gpu_scaler.exposition import LabelMemo, Sample, parse_exposition
from keda_gpu_scaler.vendors import (
    MAX_PLANNED_SAMPLES,
    SAMPLE_NAMES,
    Family,
    ReadingsMemo,
    readings_from_samples,
)

FIXTURES = Path(__file__).parent.parent / "fixtures"
PAGES = sorted(FIXTURES.glob("*.prom"))

# Values that reach every branch of the readers: NaN and ±Inf (present but no value), 0, out-of-range.
VALUES = st.sampled_from([0.0, 0.5, 1.0, 37.0, 100.0, 150.0, -3.0, 8000.0, math.nan, math.inf, -math.inf])
_MOVED_VALUE = re.compile(rb"(\} )(\d+)")  # a sample's value after its label set (its integer part)


@st.composite
def page_sequences(draw: st.DrawFn) -> list[list[Sample]]:
    """Pages of one source: fixture pages with new values, sometimes the same series again (the label
    dicts shared, as the label memo hands them over, or equal copies), sometimes another shape."""
    parsed = {path.name: parse_exposition(path.read_text(), SAMPLE_NAMES) for path in PAGES}
    names = sorted(parsed)
    sequence = []
    previous: list[Sample] | None = None
    for _ in range(draw(st.integers(1, 6))):
        how = draw(
            st.sampled_from(
                ["again", "copies", "fixture", "one-less", "reordered", "swap-labels", "swap-names"]
            )
        )
        if previous is None or how == "fixture":
            base = parsed[draw(st.sampled_from(names))]
        elif how == "again":
            base = previous
        elif how == "copies":
            base = [sample._replace(labels=dict(sample.labels)) for sample in previous]
        elif how == "one-less" and previous:
            base = list(previous)
            del base[draw(st.integers(0, len(base) - 1))]
        elif how in ("swap-labels", "swap-names") and len(previous) > 1:
            # The same names with other label sets, or the same label sets under other names.
            i, j = draw(st.lists(st.integers(0, len(previous) - 1), min_size=2, max_size=2, unique=True))
            base = list(previous)
            if how == "swap-labels":
                base[i], base[j] = (
                    base[i]._replace(labels=base[j].labels),
                    base[j]._replace(labels=base[i].labels),
                )
            else:
                base[i], base[j] = base[i]._replace(name=base[j].name), base[j]._replace(name=base[i].name)
        else:
            base = list(reversed(previous))
        page = [sample._replace(value=draw(VALUES)) for sample in base]
        sequence.append(page)
        previous = page
    return sequence


@settings(max_examples=300, deadline=None)
@given(page_sequences())
def test_pages_read_through_a_memo_read_as_without_it(pages: list[list[Sample]]) -> None:
    memo = ReadingsMemo()
    for page in pages:
        # NaN values read as None in readings, so == compares them exactly.
        assert readings_from_samples(page, memo) == readings_from_samples(page)


def test_a_page_of_the_same_series_reuses_the_plan_and_another_replaces_it() -> None:
    label_memo = LabelMemo()
    page = (FIXTURES / "dcgm_virtual_gpus_pod_uid.prom").read_text()
    memo = ReadingsMemo()
    first = readings_from_samples(parse_exposition(page, SAMPLE_NAMES, label_memo=label_memo), memo)
    plan = memo.plans[Family.NVIDIA]
    moved = page.replace(" 48\n", " 49\n")
    assert moved != page
    second = readings_from_samples(parse_exposition(moved, SAMPLE_NAMES, label_memo=label_memo), memo)
    assert memo.plans[Family.NVIDIA] is plan
    assert second == readings_from_samples(parse_exposition(moved, SAMPLE_NAMES))
    assert second != first
    other = (FIXTURES / "dcgm_2xh100.prom").read_text()
    readings_from_samples(parse_exposition(other, SAMPLE_NAMES, label_memo=label_memo), memo)
    assert memo.plans[Family.NVIDIA] is not plan


def test_a_plan_does_not_fit_once_the_exporters_own_pod_is_known() -> None:
    """The same NVIDIA series mean other pods when the page's other samples name the exporter's own pod
    (an `exported_pod` beside `pod`): the plan's pods depend on it, so it is made again."""
    gpu = 'gpu="0",UUID="GPU-1",Hostname="n1"'
    nvidia_lines = f'DCGM_FI_DEV_GPU_UTIL{{{gpu},namespace="ops",pod="exporter"}} 40\n'
    learnt = 'gpu_gfx_activity{gpu_id="0",namespace="ops",pod="exporter",exported_namespace="ns",exported_pod="w"} 5\n'
    memo = ReadingsMemo()
    before = readings_from_samples(parse_exposition(nvidia_lines, SAMPLE_NAMES), memo)
    assert [(r.family, r.pod) for r in before] == [(Family.NVIDIA, "exporter")]
    after = readings_from_samples(parse_exposition(nvidia_lines + learnt, SAMPLE_NAMES), memo)
    assert [(r.family, r.pod) for r in after] == [(Family.AMD, "w")]


def test_no_plan_is_kept_for_a_page_of_too_many_series() -> None:
    memo = ReadingsMemo()
    small = (FIXTURES / "dcgm_2xh100.prom").read_text()
    readings_from_samples(parse_exposition(small, SAMPLE_NAMES), memo)
    assert Family.NVIDIA in memo.plans
    huge = "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="GPU-{i}",Hostname="n",namespace="ns",pod="p{i}"}} 1\n'
        for i in range(MAX_PLANNED_SAMPLES + 1)
    )
    readings = readings_from_samples(parse_exposition(huge, SAMPLE_NAMES), memo)
    assert len(readings) == MAX_PLANNED_SAMPLES + 1
    assert Family.NVIDIA not in memo.plans


def test_read_page_with_a_source_memo_reads_as_without_it() -> None:
    """The scrape path end to end: label memo and plans together, over pages that move and change shape."""
    memo = SourceMemo()
    bodies = [path.read_bytes() for path in PAGES if path.name.startswith("dcgm_")]
    moved = [_MOVED_VALUE.sub(lambda m: m[1] + str(int(m[2]) + 1).encode(), body) for body in bodies]
    assert all(new != old for new, old in zip(moved, bodies, strict=True))
    for body in [*bodies, *bodies, *moved]:
        assert read_page(body, GPU_EXPORTER_PAGES, memo) == read_page(body, GPU_EXPORTER_PAGES)


def test_the_same_label_sets_under_other_names_are_another_plan() -> None:
    """Which families carry pod_uid decides whose value a series is: same label sets, other names, other pods."""
    gpu = 'gpu="0",UUID="GPU-1",Hostname="n1"'
    labels = [f'{gpu},namespace="ops",pod="exporter"', f'{gpu},namespace="ns",pod="p",pod_uid="u1",vgpu="0"']
    first = f"DCGM_FI_DEV_GPU_UTIL{{{labels[0]}}} 80\nDCGM_FI_DEV_GPU_UTIL{{{labels[1]}}} 30\n"
    second = f"DCGM_FI_DEV_GPU_UTIL{{{labels[0]}}} 80\nDCGM_FI_DEV_FB_FREE{{{labels[1]}}} 30\n"
    label_memo, memo = LabelMemo(), ReadingsMemo()
    for page in (first, second):
        samples = parse_exposition(page, SAMPLE_NAMES, label_memo=label_memo)
        assert readings_from_samples(samples, memo) == readings_from_samples(samples)
    assert [r.pod for r in readings_from_samples(parse_exposition(second, SAMPLE_NAMES))] == ["p", "exporter"]
