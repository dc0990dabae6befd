"""The soaks of `make soak` and the caches benchmark start: their modules import, their arguments parse, their pieces work."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import soak_hostile, soak_registry
from keda_gpu_scaler._proto import externalscaler_pb2 as pb


def test_registry_soak_arguments() -> None:
    args = soak_registry.parser().parse_args(["--minutes", "3", "--objects", "500", "--ttl", "5"])
    assert (args.minutes, args.objects, args.ttl, args.cap) == (3.0, 500, 5.0, 2000)


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


def test_hostile_soak_arguments_and_variants() -> None:
    args = soak_hostile.parser().parse_args(["--minutes", "2.5", "--exporters", "big", "--rate", "0"])
    assert (args.minutes, args.exporters, args.rate, args.role) == (2.5, "big", 0.0, "soak")
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


def test_every_cache_switch_of_the_caches_benchmark_is_a_seam_that_is_on() -> None:
    import importlib

    from bench.bench_caches import SWITCHES

    for _, switch, _ in SWITCHES:
        module, _, path = switch.partition(":")
        owner: object = importlib.import_module(module)
        *parents, attribute = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        assert getattr(owner, attribute) is True, switch
