"""One line of the Prometheus text exposition format taken apart and checked: its name, label set, value and
timestamp; a bad line is an ExpositionError that names the line and what is wrong with it."""

from __future__ import annotations

import re
from collections.abc import Set
from sys import intern


class ExpositionError(ValueError):
    """A page that is not valid text exposition; the message names the line and the reason."""


# One C-speed match takes a sample line apart: name, label set, value, optional timestamp. Blanks and
# tabs are the only whitespace the format knows inside a line. The label set runs to the last "}" since
# neither a value nor a timestamp may hold one; what is inside is checked separately (parse_labels).
# Braces are kept out of the value and the timestamp so that backtracking over the "}"s stays linear, and
# all whitespace, because float() and int() would quietly strip it.
SAMPLE_NAME = r"([a-zA-Z_:][a-zA-Z0-9_:]*)"
SAMPLE = re.compile(SAMPLE_NAME + r"(?:[ \t]*\{(.*)\}[ \t]*|[ \t]+)([^\s{}]+)(?:[ \t]+([^\s{}]+))?")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# The label sets exporters actually print: no blanks, no escapes, maybe a trailing comma. Once a set
# passes this one C-speed check, findall can pick out its pairs: no value holds a quote to confuse it.
_PLAIN_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*)"')
_PLAIN_LABELS = re.compile(rf"(?:{_PLAIN_PAIR.pattern},)*{_PLAIN_PAIR.pattern},?")
BLANKS = (" ", "\t")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def line_error(line_number: int, reason: str) -> ExpositionError:
    return ExpositionError(f"line {line_number}: {reason}")


def label_identity(labels: dict[str, str]) -> frozenset[tuple[str, str]]:
    """A label set whatever the order it was printed in; its hash is computed once and cached."""
    return frozenset(labels.items())


def split_line(
    line: str, line_number: int, names: Set[str] | None
) -> tuple[str, str | None, str, str | None] | None:
    """One sample line (stripped, not a comment) taken apart: name, label set text or None, value text,
    timestamp text or None; None if its name is not wanted."""
    match = SAMPLE.fullmatch(line)
    if match is None:
        _reject(line, line_number, names)
        return None
    name, block, value_text, timestamp_text = match.groups()
    # startswith only showed that a wanted name is a prefix: "gpu_used_vram" also starts "gpu_used_vram_x".
    if names is not None and name not in names:
        return None
    return name, block, value_text, timestamp_text


def _reject(line: str, line_number: int, names: Set[str] | None) -> None:
    """Say what is wrong with a line that SAMPLE does not match, unless its name is not wanted."""
    match = _METRIC_NAME.match(line)
    if match is None:
        raise line_error(line_number, f"invalid metric name in {excerpt(line)}")
    name = match.group()
    if names is not None and name not in names:
        return
    rest = line[match.end() :]
    if rest and rest[0] not in " \t{":
        raise line_error(line_number, f"invalid character {rest[0]!r} in metric name {excerpt(name)}")
    rest = rest.lstrip(" \t")
    if rest.startswith("{"):
        close = rest.rfind("}")
        # An error in the labels comes first on the line. Without any "}", the labels' own error (an
        # unterminated value, say) explains the line best; if they have none, the set is not closed.
        parse_labels(rest[1:close] if close >= 0 else rest[1:], line_number)
        if close < 0:
            raise line_error(line_number, f"label set of {excerpt(name)} not closed")
        rest = rest[close + 1 :]
    fields = rest.split()
    if not fields:
        raise line_error(line_number, f"missing value for {excerpt(name)}")
    if len(fields) > 2:
        raise line_error(
            line_number, f"unexpected text after the timestamp of {excerpt(name)}: {excerpt(rest)}"
        )
    raise line_error(line_number, f"malformed value or timestamp of {excerpt(name)}: {excerpt(rest)}")


def parse_labels(block: str, line_number: int) -> dict[str, str]:
    """Parse the text between "{" and "}": `name="value"` pairs separated by commas."""
    if not block:
        return {}
    if _PLAIN_LABELS.fullmatch(block):
        pairs = _PLAIN_PAIR.findall(block)
        # Label names interned: every set of every page shares them.
        labels = {intern(name): value for name, value in pairs}
        # A duplicate or reserved name is an error: leave it to the full parser below to report it.
        if len(labels) == len(pairs) and "__name__" not in labels:
            return labels
    return _parse_labels_fully(block, line_number)


def _parse_labels_fully(block: str, line_number: int) -> dict[str, str]:
    """Parse any label set the format allows (blanks, escapes), or say what is wrong with it."""
    labels: dict[str, str] = {}
    pos = 0
    while True:
        while block.startswith(BLANKS, pos):
            pos += 1
        if pos == len(block):  # the end of the block is the "}": empty set, or after a trailing comma
            return labels
        equals = block.find("=", pos)
        if equals < 0:
            raise line_error(line_number, f'expected label="value" in label set, got {excerpt(block[pos:])}')
        label = block[pos:equals].rstrip(" \t")
        # ASCII identifiers are exactly the format's label names: [a-zA-Z_][a-zA-Z0-9_]*.
        if not (label.isascii() and label.isidentifier()):
            raise line_error(line_number, f"invalid label name {excerpt(label)}")
        if label == "__name__":
            raise line_error(line_number, "label name '__name__' is reserved")
        pos = equals + 1
        while block.startswith(BLANKS, pos):
            pos += 1
        if not block.startswith('"', pos):
            raise line_error(line_number, f"value of label {excerpt(label)} is not quoted")
        value, pos = _read_label_value(block, pos + 1, line_number, label)
        if label in labels:
            raise line_error(line_number, f"duplicate label name {excerpt(label)}")
        labels[intern(label)] = value
        while block.startswith(BLANKS, pos):
            pos += 1
        if block.startswith(",", pos):
            pos += 1
        elif pos != len(block):
            raise line_error(line_number, f"expected ',' or '}}' after the value of label {excerpt(label)}")


def _read_label_value(block: str, start: int, line_number: int, label: str) -> tuple[str, int]:
    """Read a label value from `start` (after its opening quote); return it and the index after its end.

    \\\\, \\" and \\n are the format's escapes. Any other backslash is kept as it is, as the Prometheus
    server and prometheus_client do, rather than failing a whole page on it.
    """
    parts: list[str] = []
    pos = start
    quote = -1
    while True:
        # Each quote and each backslash is searched for once, so a value full of escapes stays linear.
        if quote < pos:
            quote = block.find('"', pos)
            if quote < 0:
                raise line_error(line_number, f"unterminated value of label {excerpt(label)}")
        backslash = block.find("\\", pos, quote)
        if backslash < 0:
            parts.append(block[pos:quote])
            return "".join(parts), quote + 1
        parts.append(block[pos:backslash])
        escaped = block[backslash + 1]  # exists: the quote comes after the backslash
        if escaped == "n":
            parts.append("\n")
        elif escaped in ('"', "\\"):
            parts.append(escaped)
        else:
            parts.append("\\" + escaped)
        pos = backslash + 2


def parse_value(text: str, line_number: int) -> float:
    # float() also takes "1_000" and non-ASCII digits; Go's ParseFloat, which defines the format, does not.
    # Both take NaN, Inf, +Inf and -Inf in any case.
    if text.isascii() and "_" not in text:
        try:
            return float(text)
        except ValueError:
            pass
    raise line_error(line_number, f"value {excerpt(text)} is not a number")


def parse_timestamp(text: str, line_number: int) -> int:
    if text.isascii() and "_" not in text:
        try:
            timestamp = int(text)
        except ValueError:
            pass
        else:
            if _INT64_MIN <= timestamp <= _INT64_MAX:
                return timestamp
    raise line_error(line_number, f"timestamp {excerpt(text)} is not a 64-bit integer of milliseconds")


def excerpt(text: str, limit: int = 60) -> str:
    """Quote a piece of a bad line for an error message without copying a huge line into it."""
    return repr(text if len(text) <= limit else text[:limit] + "...")
