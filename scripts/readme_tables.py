"""The tables of `serve` and `demo` flags and trigger metadata in docs/reference.md (and wherever the README
holds one of their blocks), made from what the code runs on."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from keda_gpu_scaler.cli import add_demo_arguments
from keda_gpu_scaler.config.flags import FLAGS
from keda_gpu_scaler.core.trigger import KEYS


def flags_table() -> str:
    rows = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for flag in FLAGS:
        default = f"`{flag.default}`" if flag.default else "none"
        choices = f" (`{'`, `'.join(flag.choices)}`)" if flag.choices else ""
        rows.append(f"| `{flag.name}` | `{flag.env}` | {default} | {flag.help}{choices} |")
    return "\n".join(rows) + "\n"


def metadata_table() -> str:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    rows += [f"| `{k.key}` | {k.default_text} | {k.help} |" for k in KEYS]
    return "\n".join(rows) + "\n"


def demo_flags_table() -> str:
    parser = argparse.ArgumentParser(add_help=False)
    add_demo_arguments(parser)
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    rows += [f"| `{a.option_strings[0]}` | `{a.default}` | {a.help} |" for a in parser._actions]
    return "\n".join(rows) + "\n"


TABLES = {"flags": flags_table, "metadata": metadata_table, "demo-flags": demo_flags_table}
# Only our own blocks: other generated blocks (e.g. the benchmark summary) belong to their generators.
_BLOCK = re.compile(rf"(<!-- (?P<name>{'|'.join(TABLES)}):begin -->\n).*?(<!-- (?P=name):end -->)", re.S)


def render(readme: str) -> str:
    """The text with every `<!-- NAME:begin -->…<!-- NAME:end -->` block made anew from the code."""
    return _BLOCK.sub(lambda m: m.group(1) + TABLES[m.group("name")]() + m.group(3), readme)


ROOT = Path(__file__).resolve().parent.parent
# The documents whose blocks this script writes: each table lives in exactly one of them.
DOCUMENTS = (ROOT / "README.md", ROOT / "docs" / "reference.md")

if __name__ == "__main__":
    for path in DOCUMENTS:
        path.write_text(render(path.read_text()))
