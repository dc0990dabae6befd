"""The README and the documents it moved its reference to: generated tables in step with the code, every
link leading somewhere, the first screen saying what a newcomer needs, and a README short enough to read."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from readme_tables import DOCUMENTS, TABLES, render  # a development tool, not part of the installed package

from keda_gpu_scaler import __version__
from keda_gpu_scaler.config.flags import FLAGS
from keda_gpu_scaler.core.trigger import KEYS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "reference.md"
# The README and what moved out of it: links are checked in each, commands run from each.
DOCS = (README, ROOT / "docs" / "operating.md", REFERENCE, ROOT / "docs" / "development.md")
README_LIMIT = 40 * 1024


def test_generated_tables_match_the_code() -> None:
    texts = {path: path.read_text() for path in DOCUMENTS}
    for name in TABLES:
        holders = [
            p
            for p, text in texts.items()
            if f"<!-- {name}:begin -->" in text and f"<!-- {name}:end -->" in text
        ]
        assert len(holders) == 1, (name, holders)
    for path, text in texts.items():
        assert render(text) == text, f"{path.name} tables are out of date: run `make docs`"


def test_every_flag_and_key_is_in_the_reference() -> None:
    text = REFERENCE.read_text()
    for flag in FLAGS:
        assert f"| `{flag.name}` | `{flag.env}` |" in text
    for key in KEYS:
        assert f"| `{key.key}` |" in text


def test_readme_starts_with_the_two_commands() -> None:
    head = README.read_text()[:1500]
    assert "make run" in head and "make test" in head


def test_the_first_screen_installs_the_released_chart_by_the_name_the_release_publishes() -> None:
    release = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    chart = f"{release['env']['CHARTS']}/keda-gpu-scaler"
    first_screen = README.read_text()[:2500]
    assert f"helm install keda-gpu-scaler {chart} --version {__version__} -n keda" in first_screen
    assert "LLM servers" in first_screen and "GPU workloads" in first_screen


def test_the_readme_is_at_most_40_kb() -> None:
    size = len(README.read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes; move reference material to docs/"


def test_the_readme_sections_come_in_the_order_a_user_reads_them() -> None:
    headings = re.findall(r"^## (.+)$", README.read_text(), re.M)
    assert headings == [
        "Try it",
        "Install",
        "Scaling LLM servers",
        "Waking from zero",
        "Scaling GPU workloads",
        "More",
    ]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def outside_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def anchors_of(path: Path) -> set[str]:
    return {github_anchor(h) for h in re.findall(r"^#+ (.+)$", outside_code(path.read_text()), re.M)}


def test_every_link_in_the_readme_and_docs_leads_somewhere() -> None:
    for document in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", outside_code(document.read_text())):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            linked = (document.parent / path).resolve() if path else document
            assert linked.exists(), f"{document.name} links to {path}: no such file"
            if anchor and linked.suffix == ".md":
                assert anchor in anchors_of(linked), f"{document.name} links to {target}: no such heading"
