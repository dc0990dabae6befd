"""The soaks of `make soak` and the caches benchmark start: their modules import, their arguments parse, their pieces work."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from bench import soak_hostile, soak_registry
from keda_gpu_scaler._proto import externalscaler_pb2 as pb


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
