"""Fast, filtered parser for the Prometheus text exposition format (version 0.0.4)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Set
from functools import lru_cache
from typing import Any, NamedTuple

from keda_gpu_scaler.pages.exposition_line import (
    BLANKS,
    SAMPLE,
    SAMPLE_NAME,
    ExpositionError,
    excerpt,
    label_identity,
    line_error,
    parse_labels,
    parse_timestamp,
    parse_value,
    split_line,
)

__all__ = ["ExpositionError", "Sample", "declared_types", "parse_exposition", "release_in_slices"]


class Sample(NamedTuple):
    name: str
    # Read-only: the samples of one page that print the same label set share one dict (readers key
    # per-label-set work on it), so changing it would change the other samples too.
    labels: dict[str, str]
    value: float
    timestamp_ms: int | None


LineNumber = Callable[[int], int]
"""Where a line is (its start in the page, or its number) → its line number."""


# Passes over a whole page (a regular expression, a split) are made in pieces of about this many
# characters, cut at line ends: each pass is one C call that holds the GIL, and over a 16 MB page one
# call held it for 100 ms, every other thread's time, the event loop's included. A piece takes ~1 ms.
PIECE = 256 * 1024


def line_pieces(page: str | bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of consecutive pieces that make up `page`, each at least PIECE long (but the last)
    and ending just after a newline (the last: where the page ends), so no line is ever cut. A line
    longer than PIECE is a piece of its own."""
    newline = "\n" if isinstance(page, str) else b"\n"
    size = max(PIECE, 1)
    start, length = 0, len(page)
    while start < length:
        cut = page.find(newline, start + size - 1)  # type: ignore[arg-type]
        end = length if cut < 0 else cut + 1
        yield start, end
        start = end


def count_in_pieces(pattern: re.Pattern[str], text: str) -> int:
    """How many times `pattern` matches in `text`, searched piece by piece (see line_pieces): for a
    pattern whose matches never span a newline, the same count as one findall over the whole text."""
    return sum(len(pattern.findall(text, start, end)) for start, end in line_pieces(text))


_BLANK_AFTER_NEWLINE = re.compile(r"\n[ \t]")


def has_blank_led_line(text: str) -> bool:
    """Whether some line of `text` begins with a blank or a tab, searched piece by piece (`"\n " in
    text` over a 16 MB page is one 12 ms call: the newline it starts with is on every line)."""
    if text.startswith((" ", "\t")):
        return True
    # From the newline before each piece: a line's first character is searched with its newline.
    return any(_BLANK_AFTER_NEWLINE.search(text, max(start - 1, 0), end) for start, end in line_pieces(text))


# A label set on one page: its labels, and (looking for conflicts) what they are whatever the order they
# were printed in.
_LabelSet = tuple[dict[str, str], frozenset[tuple[str, str]] | None]


def parse_exposition(
    page: str | bytes,
    names: Set[str] | None = None,
    *,
    max_samples: int | None = None,
    reject_conflicts: bool = False,
) -> list[Sample]:
    """Return the samples of `page` whose name is in `names` (all samples when `names` is None).

    max_samples: more kept samples than this is an ExpositionError (what one page may contribute is
    bounded, whatever its size in bytes). reject_conflicts: one series (name and label set, in any label
    order) printed twice with different values is an ExpositionError naming both lines, since nothing
    says which value is true; printed twice with the same value, it is kept twice (as the format's own
    parsers do) and the readers count it once.

    Samples come back in page order. Only the lines that are kept are validated: a line whose name is not
    wanted is skipped on its first characters without reading the rest, even if the rest is garbage.
    That is where the speed comes from (a dcgm-exporter page has ~30 families, a trigger needs ~5), and
    a broken line of another family cannot change what our lines mean. For the same reasons comment
    lines, # HELP and # TYPE included, are skipped unread: they hold nothing a sample needs.
    """
    text = _decode(page)
    # Exporters repeat each GPU's label set in every family, so each distinct set is parsed once per page.
    # label set text (None: no braces) → its labels.
    label_sets: dict[str | None, _LabelSet] = {}
    samples: list[Sample] = []
    # series → (value, where) of its first sample, when conflicts are looked for.
    seen: dict[tuple[str, frozenset[tuple[str, str]]], tuple[float, int]] | None = (
        {} if reject_conflicts else None
    )
    limit = -1 if max_samples is None else max_samples
    lines, line_number = _sample_lines(text, names, None if max_samples is None else max_samples + 1)
    for where, line in lines:
        # One loop body for every kept line, with no call per line where it can be helped: on a page of
        # new values this loop is most of the parse.
        try:
            if isinstance(line, str):
                split = split_line(line, where, names)
                if split is None:
                    continue
                name, block, value_text, timestamp_text = split
            else:
                name, block, value_text, timestamp_text = line
            label_set = label_sets.get(block)
            if label_set is None:
                labels = {} if block is None else parse_labels(block, where)
                label_set = label_sets[block] = (labels, None if seen is None else label_identity(labels))
            value = parse_value(value_text, where)
            timestamp = None if timestamp_text is None else parse_timestamp(timestamp_text, where)
        except ExpositionError as error:
            if line_number is _same:
                raise
            # Line numbers are counted only when one is needed: the error named the line's start.
            raise line_error(line_number(where), str(error).partition(": ")[2]) from None
        if len(samples) == limit:
            raise line_error(
                line_number(where), f"more than {limit:,} series on this page; the limit is {limit:,}"
            )
        # (Shared by the page's samples with this label set: see Sample.labels.)
        sample = Sample(name, label_set[0], value, timestamp)
        if seen is not None:
            identity = label_set[1]
            assert identity is not None  # computed for every set while conflicts are looked for
            first = seen.setdefault((name, identity), (value, where))
            if first[1] != where and first[0] != value:
                _conflict((first[0], line_number(first[1])), sample, line_number(where))
        samples.append(sample)
    # A huge page leaves huge caches: freed in pieces, so that a parse in a worker thread never holds
    # the GIL for one long deallocation (the event loop would stall on it).
    release_in_slices(label_sets)
    if seen is not None:
        release_in_slices(seen)
    return samples


# A line as _sample_lines hands it over: the stripped text, or, from the fast path, a well-formed sample
# already taken apart (name, label set text or None, value text, timestamp text or None).
Line = str | tuple[str, str | None, str, str | None]


def _sample_lines(
    text: str, names: Set[str] | None, enough: int | None = None
) -> tuple[list[tuple[int, Line]], LineNumber]:
    """Each line that may hold a wanted sample, in page order, with where it is; and how to turn that
    "where" into a line number (needed only to name a line in an error).

    Comment lines, # HELP and # TYPE included, are skipped unread: they hold nothing a sample needs.
    """
    # (An empty name, which no sample can have, is left to the line-by-line loop: every line starts with it.)
    if names is not None and "" not in names:
        found = _lines_starting_with(text, frozenset(names), enough)
        if found is not None:
            return found, lambda start: text.count("\n", 0, start) + 1
    wanted = None if names is None else tuple(names)
    lines: list[tuple[int, Line]] = []
    number = 0  # of the line before the piece's first
    for start, end in line_pieces(text):
        piece = text[start:end].split("\n")
        if end < len(text):
            piece.pop()  # the "" after the piece's last newline: the next piece's first line follows
        for index, line in enumerate(piece, start=number + 1):
            if wanted is not None and not line.startswith(wanted):
                # The format allows blanks before a sample; they are rare, so only then pay for a strip.
                if not line.startswith(BLANKS):
                    continue
                line = line.lstrip(" \t")
                if not line.startswith(wanted):
                    continue
            # "\r" is stripped too, so CRLF pages parse like LF pages.
            line = line.strip(" \t\r")
            if line and line[0] != "#":  # not a blank line or a comment
                lines.append((index, line))
        number += len(piece)
    return lines, _same


def _same(line_number: int) -> int:
    return line_number


def _lines_starting_with(
    text: str, names: frozenset[str], enough: int | None = None
) -> list[tuple[int, Line]] | None:
    """(start, line) of the lines that begin with one of `names` followed by anything but a name
    character, well-formed samples already taken apart, the first `enough` of them at most; None when
    some line before begins with a blank (allowed before a sample, but rare: the caller then reads the
    page line by line).

    One regular expression finds and splits them all in one C-speed pass over the page (the names merged
    into a prefix tree, so a line is tested once, not once per name): the ~85 % of a dcgm-exporter page
    that no trigger reads never reaches Python code.
    """
    if not names:
        return []
    lines: list[tuple[int, Line]] = []
    finder = _line_finder(names)
    # The finder runs on each piece after a "\n", so a piece's first line is found like the others; a
    # match starts at the "\n" before its line, so its index plus the piece's start is the line's start
    # in the text.
    for start, end in line_pieces(text):
        for match in finder.finditer("\n" + text[start:end]):
            blank, name, block, value, timestamp, malformed = match.groups()
            if blank is not None:
                return None
            if malformed is not None:
                lines.append((start + match.start(), (name + malformed).strip(" \t\r")))
            else:
                lines.append((start + match.start(), (name, block, value, timestamp)))
            if len(lines) == enough:
                # Every line found holds a wanted name, so each is a sample or an error: past the caller's
                # limit nothing more is read (a hostile page of 150,000 series costs what 20,000 do).
                return lines
    return lines


@lru_cache(maxsize=64)
def _line_finder(names: frozenset[str]) -> re.Pattern[str]:
    """A line that starts with a blank (group 1), or with a wanted name (2) followed by a well-formed
    rest (SAMPLE's label set 3, value 4 and timestamp 5, then blanks to the end of the line) or by
    anything else (6, left to split_line to explain)."""
    rest = SAMPLE.pattern.removeprefix(SAMPLE_NAME)
    return re.compile(
        rf"\n(?:([ \t])[^\n]*|({_alternation(sorted(names))})(?![a-zA-Z0-9_:])"
        rf"(?:{rest}[ \t\r]*(?![^\n])|([^\n]*)))"
    )


def too_many_samples(page: bytes, names: Set[str], limit: int) -> ExpositionError | None:
    """The error parse_exposition(page, names, max_samples=limit) ends with when the page holds more than
    `limit` lines of the wanted names, found without reading any of them; None when it holds no more.

    A hostile page is refused for what it costs to find the lines (a C-speed search per line, stopping
    one past the limit), not for what it costs to parse them: on a page of 150,000 series, a fifth of
    the parse. Run in a worker thread, it leaves the GIL to the event loop between lines.
    """
    finder = _line_start_finder(frozenset(names))
    # The pattern finds a line by the "\n" before it: the first line, which has none, is matched apart.
    first = finder.match(b"\n" + page[:MAX_NAME_BYTES])
    reason = f"more than {limit:,} series on this page; the limit is {limit:,}"
    count = 0 if first is None else 1
    if count > limit:
        return line_error(1, reason)
    for start, end in line_pieces(page):
        # From the newline before the piece (which belongs to the piece before) to the one it ends with
        # (which the next piece's search starts from): each line is searched once, with its newline.
        stop = end - 1 if page[end - 1 : end] == b"\n" else end
        for match in finder.finditer(page, max(start - 1, 0), stop):
            count += 1
            if count > limit:
                return line_error(page.count(b"\n", 0, match.start()) + 2, reason)
    return None


@lru_cache(maxsize=64)
def _line_start_finder(names: frozenset[str]) -> re.Pattern[bytes]:
    """A line (of a page in bytes) that begins, maybe after blanks, with one of `names` as a whole name:
    a sample the parser keeps, or a malformed line it refuses."""
    words = _alternation(sorted(names)).encode()
    return re.compile(rb"\n[ \t]*" + words + rb"(?![a-zA-Z0-9_:])")


# Enough of a page's start to hold its first line's blanks and metric name.
MAX_NAME_BYTES = 4096


def _alternation(words: list[str]) -> str:
    """A regular expression matching exactly `words` (sorted), written as a prefix tree: the engine
    then tests the shared prefix of DCGM_FI_DEV_* once instead of once per name."""
    if words == [""]:
        return ""
    branches: dict[str, list[str]] = {}
    for word in words:
        branches.setdefault(word[:1], []).append(word[1:])
    parts = []
    optional = "" in branches
    for first, rests in branches.items():
        if first:
            parts.append(re.escape(first) + _alternation(rests))
    body = parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
    return f"(?:{body})?" if optional else body


def release_in_slices(items: dict[Any, Any] | list[Any], big: int = 20_000, step: int = 2_000) -> None:
    """Empty a large dict or list a few thousand items at a time (small ones are left to refcounting).

    Freeing 150,000 objects is one C call that holds the GIL for tens of ms; in slices, other threads
    get the GIL between them.
    """
    if len(items) < big:
        return
    if isinstance(items, list):
        while items:
            del items[-step:]
        return
    keys = list(items)
    for start in range(0, len(keys), step):
        for key in keys[start : start + step]:
            del items[key]


def _conflict(first: tuple[float, int], sample: Sample, line_number: int) -> None:
    """Raise for a series printed again with another value, unless both values are NaN."""
    value, first_line = first
    if value != value and sample.value != sample.value:
        return
    raise line_error(
        line_number,
        f"series {excerpt(sample.name)} with the labels of line {first_line} printed again with another"
        f" value ({value:g} on line {first_line}, {sample.value:g} here): which one is true is unknown",
    )


def _decode(page: str | bytes) -> str:
    if isinstance(page, str):
        return page
    try:
        return page.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_number = page.count(b"\n", 0, exc.start) + 1
        raise ExpositionError(f"line {line_number}: invalid UTF-8") from None


@lru_cache(maxsize=64)
def _type_line_finder(names: frozenset[str]) -> re.Pattern[str]:
    # `# TYPE name type`: the format separates the tokens of a comment by blanks or tabs, any number.
    # The "#" comes first, so the engine looks for that one character at C speed instead of trying a
    # match at every position; that the "#" starts its line is checked on what is found.
    return re.compile(
        rf"#[ \t]+TYPE[ \t]+({_alternation(sorted(names))})[ \t]+([^\s]*)[ \t\r]*$", re.MULTILINE
    )


def declared_types(page: str | bytes, names: Set[str]) -> dict[str, str]:
    """The types a page declares for the wanted families (`# TYPE name type` lines): name → type.

    The sample parser skips comments, so a family declared as, say, a counter would otherwise be read
    as a level. The first declaration of a name counts, as in Prometheus.
    """
    if not names:
        return {}
    finder = _type_line_finder(frozenset(names))
    found: dict[str, str] = {}
    for start, end in line_pieces(page):
        piece = page[start:end]
        # (Cut after a newline, a piece decodes as its part of the whole page does.)
        text = piece.decode("utf-8", "replace") if isinstance(piece, bytes) else piece
        for match in finder.finditer(text):
            at = match.start()
            if at == 0 or text[at - 1] == "\n":  # a comment line, not a "#" inside another line
                found.setdefault(match.group(1), match.group(2))
    return found
