"""docs/DESIGN.md's layout names every module of the package: a module added or moved without it fails here."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "keda_gpu_scaler"


def test_design_names_every_module_of_the_package() -> None:
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    modules = sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" and "externalscaler" not in path.parts
    )
    assert modules, "no module found under keda_gpu_scaler/"
    missing = [module for module in modules if f"`{module}`" not in design]
    assert not missing, f"docs/DESIGN.md's layout names no line for: {', '.join(missing)}"
