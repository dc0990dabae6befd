"""The README's tables of flags and metadata keys stay in step with the code."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from readme_tables import TABLES, render  # a development tool, not part of the installed package

from keda_gpu_scaler.settings import FLAGS
from keda_gpu_scaler.trigger import KEYS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_tables_match_the_code() -> None:
    text = README.read_text()
    for name in TABLES:
        assert f"<!-- {name}:begin -->" in text and f"<!-- {name}:end -->" in text
    assert render(text) == text, "README tables are out of date: run `make docs`"


def test_every_flag_and_key_is_in_the_readme() -> None:
    text = README.read_text()
    for flag in FLAGS:
        assert f"| `{flag.name}` | `{flag.env}` |" in text
    for key in KEYS:
        assert f"| `{key.key}` |" in text


def test_readme_starts_with_the_two_commands() -> None:
    head = README.read_text()[:1500]
    assert "make run" in head and "make test" in head


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_link_in_the_readme_leads_somewhere() -> None:
    text = README.read_text()
    outside_code = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    anchors = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", outside_code, re.M)}
    root = README.parent
    for target in re.findall(r"\]\(([^)\s]+)\)", outside_code):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        if not path:
            assert anchor in anchors, f"README link to #{anchor}: no such heading"
        else:
            assert (root / path).exists(), f"README link to {path}: no such file"
