"""The code that docs/ and the README name still exists: a renamed module, class or function fails here."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "keda_gpu_scaler"
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
# Where a doc's file path may be relative to: the repository, the package, or a folder of the tree.
BASES = (ROOT, PACKAGE, ROOT / "bench", ROOT / "tests", ROOT / "scripts")
GENERATED = ("_pb2", "externalscaler/")

CODE_SPAN = re.compile(r"`([^`\n]+)`")
PY_PATH = re.compile(r"^[\w/.-]+\.py$")
DOTTED = re.compile(r"^([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?:\(\))?$")


@cache
def modules() -> dict[str, list[Path]]:
    """Every module of the package, bench and scripts by its file stem (and a package by its folder)."""
    found: dict[str, list[Path]] = {}
    for base in (PACKAGE, ROOT / "bench", ROOT / "scripts"):
        for path in base.rglob("*.py"):
            if (PACKAGE / "externalscaler") in path.parents:
                continue  # generated from KEDA's proto (never committed): `externalscaler.X` is its gRPC name
            stem = path.parent.name if path.name == "__init__.py" else path.stem
            found.setdefault(stem, []).append(path)
    return found


@cache
def names_in(path: Path) -> frozenset[str]:
    """The names a module defines at its top level and in its classes (methods, attributes, members)."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return frozenset(names)


@cache
def classes() -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for paths in modules().values():
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append(path)
    return found


def class_members(name: str) -> set[str]:
    members: set[str] = set()
    for path in classes().get(name, ()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name == name:
                for item in ast.walk(node):
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        members.add(item.name)
                    elif isinstance(item, ast.Name) and isinstance(item.ctx, ast.Store):
                        members.add(item.id)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        members.add(item.target.id)
                    elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                        members.add(item.attr)  # self.x = ... in a method
    return members


@cache
def our_folders() -> frozenset[str]:
    """Folder names of this tree: a path starting elsewhere (`vllm/engine/arg_utils.py`) is another project's."""
    return frozenset(
        p.name for base in BASES for p in base.rglob("*") if p.is_dir() and "__pycache__" not in p.parts
    ) | {base.name for base in BASES}


def problems(doc: Path) -> list[str]:
    found: list[str] = []
    for span in CODE_SPAN.findall(doc.read_text()):
        span = span.strip()
        ours = "/" not in span or span.split("/")[0] in our_folders()
        if PY_PATH.match(span) and ours and not any(part in span for part in GENERATED):
            if not any((base / span).exists() for base in BASES) and span.split("/")[-1] not in {
                p.name for paths in modules().values() for p in paths
            }:
                found.append(f"file {span}")
            continue
        match = DOTTED.match(span)
        if match is None:
            continue
        owner, member = match.groups()
        if owner in ("keda_gpu_scaler", "bench"):
            if member not in modules():
                found.append(f"{owner}.{member}")
        elif owner in modules():
            if not any(member in names_in(path) for path in modules()[owner]):
                found.append(f"{owner}.{member}")
        elif owner in classes() and member not in class_members(owner):
            found.append(f"{owner}.{member}")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_module_file_and_symbol_a_doc_names_exists(doc: Path) -> None:
    assert problems(doc) == [], f"{doc.relative_to(ROOT)} names code that is not there"


def test_the_check_finds_a_symbol_that_is_gone(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "`exposition.declared_types` and `collect/store.py` exist; `exposition.no_such_thing`,"
        " `collect/nowhere.py` and `Store.no_such_method()` do not."
    )
    assert problems(doc) == ["exposition.no_such_thing", "file collect/nowhere.py", "Store.no_such_method"]
