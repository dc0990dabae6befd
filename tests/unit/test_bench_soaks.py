"""The soaks of `make soak` and the caches benchmark start: their modules import, their arguments parse, their pieces work."""

from __future__ import annotations

import gzip
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench import soak_crowds, soak_hostile, soak_registry
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.pages.exposition import parse_exposition


def make_soak_arguments(module: str) -> list[str]:
    """The arguments `make soak` runs `python -m <module>` with."""
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    for line in makefile.splitlines():
        if f"-m {module} " not in line:
            continue
        words = shlex.split(line)
        if module in words:
            return words[words.index(module) + 1 :]
    raise AssertionError(f"make soak does not run {module}")


@pytest.mark.parametrize("soak", [soak_registry, soak_hostile])
def test_the_soaks_accept_the_command_lines_make_soak_runs(soak: Any) -> None:
    arguments = make_soak_arguments(soak.__name__)
    args = soak.parser().parse_args(arguments)
    assert args.minutes == float(arguments[arguments.index("--minutes") + 1])


def test_registry_soak_names_are_distinct_kubernetes_names() -> None:
    refs = [soak_registry.ref_for("churn", i) for i in range(3)]
    assert len({(r.namespace, r.name) for r in refs}) == 3
    assert refs[2].namespace == "churn-ns-2" and refs[2].name == "churn-so-2"


def test_metrics_summary_counts_series_and_reads_the_followed_gauge() -> None:
    page = "# HELP x y\n# TYPE x gauge\nkeda_gpu_scaler_scaledobjects_followed 12.0\nother 1\n"
    assert soak_registry.metrics_summary(page) == (len(page), 2, 12.0)


def test_write_section_replaces_its_own_block_and_keeps_the_rest(tmp_path: Path) -> None:
    doc = tmp_path / "SOAK.md"
    doc.write_text("# Soak\n\nkept\n")
    soak_registry.write_section(doc, "a", "## A\none")
    soak_registry.write_section(doc, "b", "## B")
    soak_registry.write_section(doc, "a", "## A\ntwo")
    text = doc.read_text()
    assert text.startswith("# Soak\n\nkept\n")
    assert "two" in text and "one" not in text and text.index("## A") < text.index("## B")


def test_hostile_soak_variants() -> None:
    assert soak_hostile.variant(list(soak_hostile.HOSTILE_EXPORTERS), soak_hostile.HOSTILE_RATE) == ""
    assert soak_hostile.variant(["big"], 0) == "big-rate0"


def test_hostile_requests_mix_valid_and_invalid_calls() -> None:
    methods = {method for i in range(32) for method, _ in soak_hostile.hostile_requests(i)}
    assert methods == {"GetMetricSpec", "GetMetrics", "IsActive"}
    new = pb.ScaledObjectRef.FromString(soak_hostile.hostile_requests(0)[0][1])
    assert (new.name, new.namespace) == ("h-so-0", "h-ns-0")
    with pytest.raises(Exception):  # noqa: B017 - any decode error: it is meant to be garbage
        pb.ScaledObjectRef.FromString(soak_hostile.hostile_requests(6)[0][1])


def test_the_manifests_memory_limit_is_read() -> None:
    assert soak_hostile.memory_limit_mib() == 512


def test_every_switch_of_the_caches_benchmark_replaces_a_part_of_the_scaler_and_puts_it_back() -> None:
    """The property tests of tests/unit/test_cached_paths.py compare each cache with its simple version
    through these switches: a switch that replaced nothing would compare the cache with itself."""
    from bench import cache_switches

    for name in [*cache_switches.SWITCHES, *cache_switches.POLICIES]:
        replaced = [(owner, attribute) for owner, attribute, _ in cache_switches._PATCHES[name]()]
        before = [getattr(owner, attribute) for owner, attribute in replaced]
        with cache_switches.switched_off(name):
            during = [getattr(owner, attribute) for owner, attribute in replaced]
        assert replaced and all(a != b for a, b in zip(before, during, strict=True)), name
        assert [getattr(owner, attribute) for owner, attribute in replaced] == before, name


def test_the_hostile_soak_runs_issue_39s_crowds_by_default_and_each_one_alone() -> None:
    assert set(soak_crowds.CROWDS) <= set(soak_hostile.HOSTILE_EXPORTERS)
    for role in ("models", "flood"):
        assert soak_hostile.parser().parse_args(["--role", role]).role == role


def test_the_crowds_are_what_issue_39_describes() -> None:
    triggers = soak_crowds.model_triggers()
    assert len({(t.name, tuple(sorted(t.scalerMetadata.items()))) for t in triggers}) == 25 * 16
    assert {t.scalerMetadata["metric"] for t in triggers} == {"demand"}
    flood = soak_crowds.flood_refs()
    assert len({r.name for r in flood}) == 5000 and {r.namespace for r in flood} == {"hostile-flood"}
    samples = parse_exposition(soak_crowds.models_page(reads=3), {"vllm:request_success_total"})
    models = {s.labels["model_name"] for s in samples}
    assert models == {f"model-{m}" for m in range(16)}


async def test_the_gzip_pods_serve_a_plain_page_until_armed_then_6_mb_of_empty_members() -> None:
    counts: Counter[str] = Counter()
    port, stop = await soak_crowds.serve_crowd_pages(counts)
    url = soak_crowds.gzip_urls(port)[5]
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as http:
            async with http.get(url) as response:
                assert "Content-Encoding" not in response.headers
            async with http.post(f"http://127.0.0.1:{port}/arm") as response:
                assert response.status == 200
            async with http.get(url) as response:
                body = await response.read()
                assert response.headers["Content-Encoding"] == "gzip"
    finally:
        await stop()
    # Empty members one after another (gzip.decompress walks 300,000 members in 86 s: checked as a whole).
    member = gzip.compress(b"", mtime=0)
    assert len(body) > 5_900_000 and body == member * (len(body) // len(member))
    assert gzip.decompress(member) == b"" and counts["gzip"] == 2
