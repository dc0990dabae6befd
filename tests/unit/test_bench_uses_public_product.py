"""bench/ and `calibrate` decide through the product's own entries (the servicer, the store, the page
readers, decide()), never through the decision's pieces or the package's private names: what they measure
is what a user runs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
# The decision's pieces, which a benchmark would have to put together again around the product. (The
# HPA's formula, scaling.hpa_desired_replicas, is not one: the simulated HPA applies it to what the
# servicer answered, as Kubernetes does.)
DECISION_PIECES = re.compile(
    r"\b(pod_demand|over_window|with_pending|DemandPoint|DemandHistory|pending_evaluation|evaluate|pod_row"
    r"|aggregate)\b"
)
# A private module or name of the package, at any depth (KEDA's generated wire messages are the public
# keda_gpu_scaler.externalscaler: the protocol every client speaks).
PRIVATE = re.compile(r"keda_gpu_scaler(\.[a-z0-9_]+)*\._|from keda_gpu_scaler\S* import \(?[^)\n]*\b_[a-z]")


def offending_lines(pattern: re.Pattern[str]) -> list[str]:
    return [
        f"{path.relative_to(BENCH.parent)}:{number}: {line.strip()}"
        for path in sorted(BENCH.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]


def test_bench_uses_none_of_the_decisions_pieces() -> None:
    assert offending_lines(DECISION_PIECES) == []


def test_bench_uses_no_private_name_of_the_package() -> None:
    assert PRIVATE.search("from keda_gpu_scaler._proto import externalscaler_pb2")  # the pattern sees one
    assert offending_lines(PRIVATE) == []


def private_attributes(source: str) -> list[str]:
    """`module._name` where `module` is a module of the package imported by name (`from keda_gpu_scaler.x
    import scrape`, `import keda_gpu_scaler.x as y`), which the line pattern above cannot see."""
    tree = ast.parse(source)
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keda_gpu_scaler"):
            modules |= {alias.asname or alias.name for alias in node.names if alias.name.islower()}
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.asname and a.name.startswith("keda_gpu_scaler")}
    return [
        f"{node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in modules
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    ]


def test_bench_reaches_no_private_name_through_a_module_of_the_package() -> None:
    assert private_attributes("from keda_gpu_scaler.collect import scrape\nscrape._read(1)") == [
        "scrape._read"
    ]
    found = {
        f"{path.relative_to(BENCH.parent)}: {name}"
        for path in sorted(BENCH.rglob("*.py"))
        for name in private_attributes(path.read_text())
    }
    assert found == set()


def test_calibrate_turns_what_it_reads_into_values_through_the_one_decision() -> None:
    # calibrate's figure is what a `demand` threshold is compared with: decide() makes it, as in the server.
    source = (BENCH.parent / "keda_gpu_scaler" / "calibrate.py").read_text()
    pieces = re.compile(
        r"\b(pod_demand|demand_pod_values|with_pending|pending_evaluation|evaluate|pod_row)\b"
    )
    assert [line for line in source.splitlines() if pieces.search(line)] == []
    assert "from keda_gpu_scaler.core.decide import decide" in source


def simulator_imports() -> dict[str, set[str]]:
    """Each bench/simulator module → the bench/simulator modules it imports (anywhere in it: a function's
    late import or a TYPE_CHECKING one still ties the two)."""
    package = BENCH / "simulator"
    graph: dict[str, set[str]] = {}
    for path in sorted(package.glob("*.py")):
        imported = graph.setdefault(path.stem, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench.simulator."):
                imported.add((node.module or "").rpartition(".")[2])
    return graph


def circle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    """A path of imports from `start` back to itself, if there is one."""
    paths = [[start]]
    seen: set[str] = set()
    while paths:
        path = paths.pop()
        for module in sorted(graph.get(path[-1], ())):
            if module == start:
                return [*path, start]
            if module not in seen:
                seen.add(module)
                paths.append([*path, module])
    return None


def test_simulator_modules_import_one_another_without_a_circle() -> None:
    graph = simulator_imports()
    assert "llm_product" in graph  # the modules were found
    assert [c for m in graph if (c := circle_from(m, graph))] == []
