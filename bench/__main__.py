"""`python -m bench`: run every benchmark and write docs/BENCHMARKS.md (and the README's summary table
where the README has one: its own Performance section is written by hand from these figures)."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib
import importlib.metadata
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import ROOT, Section

# Name → module; each has run(quick) → Section (bench_parse: run() → str, no quick mode of its own).
BENCHMARKS: dict[str, str] = {
    "parse": "bench.bench_parse",
    "scrape": "bench.bench_scrape",
    "http": "bench.bench_http",
    "freshness": "bench.bench_freshness",
    "gateway": "bench.bench_gateway",
    "rpc": "bench.bench_rpc",
    "scale": "bench.bench_scale",
    "decisions": "bench.bench_decisions",
    "llm": "bench.bench_llm",
    "cluster": "bench.bench_cluster",
    "caches": "bench.bench_caches",
}
OUTPUT = ROOT / "docs" / "BENCHMARKS.md"
README = ROOT / "README.md"
README_BLOCK = re.compile(r"(<!-- bench:begin -->\n).*?(<!-- bench:end -->)", re.S)
# In docs/BENCHMARKS.md, what follows this line up to the next section is written by hand: --merge keeps it.
KEPT = "<!-- kept by --merge: written by hand -->"
# Said on both date lines of a full run: a section run alone later (--merge) replaces its rows and says
# its own time in its section, so the full run's date is not every row's.
MERGED_SINCE = "sections run alone since with `--merge` give their own time in docs/BENCHMARKS.md"
PACKAGES = ("keda-gpu-scaler", "grpcio", "protobuf", "aiohttp", "prometheus-client", "matplotlib", "py-spy")


def _run_one(name: str, quick: bool) -> Section:
    module: Any = importlib.import_module(BENCHMARKS[name])
    runner: Callable[..., Any] = module.run
    if name == "parse":
        result = runner()
    else:
        result = runner(quick)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
    if isinstance(result, Section):
        return result
    return Section(str(result), _parse_headlines(str(result)))


def _parse_headlines(markdown: str) -> list[tuple[str, str, str, bool | None]]:
    """The parse section is plain markdown: take its filtered speed-up column back out for the summary."""
    headlines: list[tuple[str, str, str, bool | None]] = []
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and (m := re.fullmatch(r"([\d,.]+)×", cells[5])):
            ratio = float(m.group(1).replace(",", ""))
            headlines.append(
                (f"Parse, {cells[0]}: speed-up over prometheus_client", f"{ratio:g}×", "≥ 50×", ratio >= 50)
            )
    return headlines


def _first_line(command: list[str]) -> str:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "not installed"
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def machine() -> str:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.partition(":")[2].strip()
            break
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    versions = []
    for package in PACKAGES:
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    return (
        f"| CPUs (nproc) | {len(os.sched_getaffinity(0))} |\n"
        f"| CPU model | {cpu} |\n"
        f"| memory | {mem_kib / 1024 / 1024:.1f} GiB |\n"
        f"| kernel | {platform.system()} {platform.release()} |\n"
        f"| Python | {platform.python_implementation()} {platform.python_version()} |\n"
        f"| packages | {', '.join(versions)} |\n"
        f"| Prometheus | {_first_line(['prometheus', '--version'])} |"
    )


def _row(what: str, measured: str, goal: str, met: bool | None) -> str:
    verdict = "–" if met is None else ("met" if met else "**missed**")
    return f"| {what} | {measured} | {goal} | {verdict} |"


def summary(sections: list[Section]) -> str:
    rows = [_row(*headline) for section in sections for headline in section.headlines]
    return "| benchmark | measured | goal | |\n|---|---|---|---|\n" + "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short smoke run (figures not for publishing)")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(BENCHMARKS),
        metavar="NAME",
        help="run only NAME; repeatable",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="where to write the markdown (default: docs/BENCHMARKS.md for a full run; stdout otherwise)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="with --only: replace those sections of docs/BENCHMARKS.md (keeping their hand-written notes)"
        " and their rows in its summary (and in the README's table, where it has one)",
    )
    args = parser.parse_args(argv)
    if args.merge and (not args.only or args.quick or args.output):
        parser.error("--merge goes with --only, and neither with --quick nor with --output")
    names = [n for n in BENCHMARKS if not args.only or n in args.only]
    full = not args.quick and not args.only
    arguments = sys.argv[1:] if argv is None else argv
    command = (
        "`make bench` (`.venv/bin/python -m bench`)"
        if full
        else f"`{shlex.join(['.venv/bin/python', '-m', 'bench', *arguments])}`"
    )

    # A full run rewrites the document: each section's hand-written notes are carried over.
    previous = OUTPUT.read_text() if full and OUTPUT.exists() else ""

    def _notes_of(section: Section) -> str:
        notes = _kept_notes(previous, section.markdown.partition("\n")[0])
        return chr(10) + notes.rstrip() + chr(10) if notes else ""

    started = time.monotonic()
    sections: list[Section] = []
    failed = []
    for name in names:
        print(f"bench: {name} …", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            sections.append(_run_one(name, args.quick))
        except Exception:
            # One broken benchmark must not lose the others' figures; the document says what failed.
            failed.append(name)
            sections.append(Section(f"## {name}\n\nFailed:\n\n```\n{traceback.format_exc()}```\n"))
        print(f"bench: {name} done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    elapsed = time.monotonic() - started

    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    document = f"""# Benchmarks

Measured {now} with {command}, in {elapsed / 60:.1f} minutes, on this machine ({MERGED_SINCE}):

| | |
|---|---|
{machine()}

All traffic is on 127.0.0.1; every process a benchmark starts (page servers, `keda-gpu-scaler serve`,
Prometheus, load generators, py-spy) is stopped before the next one starts. Figures are medians of the
repeats each section states. `python -m bench --quick` is a smoke run; `--only NAME` runs one of
{", ".join(BENCHMARKS)} (`--merge` puts its sections and rows into this document).

## Summary

{summary(sections)}

{chr(10).join(section.markdown.rstrip() + chr(10) + _notes_of(section) for section in sections)}"""
    if args.merge:
        for path in merge(sections, now, command):
            print(f"bench: merged into {path}", file=sys.stderr)
    elif args.output or full:
        output = args.output or OUTPUT
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(document)
        print(f"bench: wrote {output}", file=sys.stderr)
    else:
        print(document)
    if full and README.exists():
        text = README.read_text()
        block = f"Measured {now} by `make bench` on {len(os.sched_getaffinity(0))} CPUs ({MERGED_SINCE}); details, method and profiles in [docs/BENCHMARKS.md](docs/BENCHMARKS.md).\n\n{summary(sections)}\n\n![step trace](docs/sim-step.png)\n"
        if README_BLOCK.search(text):
            README.write_text(README_BLOCK.sub(lambda m: m.group(1) + block + m.group(2), text))
    return 1 if failed else 0


def merge(sections: list[Section], now: str, command: str) -> list[Path]:
    """Put a partial run's sections into docs/BENCHMARKS.md and its rows into both summary tables.

    A section is replaced from its heading to the next one, except what follows a KEPT line; its rows are
    replaced in place (by their first cell), and a row the tables do not have yet is added at their end.
    Both date lines say so (MERGED_SINCE); each merged section says its own time."""
    document = OUTPUT.read_text()
    for section in sections:
        heading, _, body = section.markdown.partition("\n")
        span = _section_span(document, heading)
        if span is None:
            raise SystemExit(f"bench: {OUTPUT} has no section {heading!r}: run the full benchmark once")
        start, end = span
        kept = _kept_notes(document, heading)
        new = f"{heading}\n\nMeasured {now} with {command}, on the machine above.\n{body.rstrip()}\n\n{kept}"
        document = document[:start] + new + document[end:]
    rows = [(headline[0], _row(*headline)) for section in sections for headline in section.headlines]
    OUTPUT.write_text(_with_rows(document.rstrip("\n") + "\n", rows))
    written = [OUTPUT]
    # The README keeps a short Performance section of its own; it gets the rows only if it has the table.
    if README.exists() and README_BLOCK.search(README.read_text()):
        README.write_text(_with_rows(README.read_text(), rows))
        written.append(README)
    return written


def _section_span(document: str, heading: str) -> tuple[int, int] | None:
    """Where a section of `document` starts (its heading) and ends (the next one's start), or None."""
    start = document.find(heading + "\n")
    if start < 0:
        return None
    end = document.find("\n## ", start + len(heading))
    return start, len(document) if end < 0 else end + 1


def _kept_notes(document: str, heading: str) -> str:
    """The hand-written notes of a section of `document` (its KEPT line and what follows), or ""."""
    span = _section_span(document, heading)
    if span is None:
        return ""
    section = document[span[0] : span[1]]
    return section[section.index(KEPT) :].rstrip() + "\n\n" if KEPT in section else ""


def _with_rows(text: str, rows: list[tuple[str, str]]) -> str:
    """The first summary table of `text` with these rows replaced (by their first cell) or added."""
    lines = text.split("\n")
    header = next(i for i, line in enumerate(lines) if line.startswith("| benchmark | measured | goal |"))
    last = header + 1
    while last + 1 < len(lines) and lines[last + 1].startswith("| "):
        last += 1
    for what, row in rows:
        found = [i for i in range(header + 2, last + 1) if lines[i].startswith(f"| {what} | ")]
        if found:
            lines[found[0]] = row
        else:
            last += 1
            lines.insert(last, row)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
