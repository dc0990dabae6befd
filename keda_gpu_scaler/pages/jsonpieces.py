"""JSON documents decoded a piece at a time, for large answers decoded in a worker thread.

json.loads is one C call that holds the GIL from the first byte to the last: 0.7 s for a 15 MiB
Prometheus answer, during which the event loop answers no RPC, whichever thread runs it. Here the one
array that makes a document large (a query's `data.result`, a list's `items`) is decoded an element at a
time, each element by the same C decoder, so a worker thread lets the loop have the GIL between elements,
and a document with more elements than its reader accepts is refused before the rest is decoded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from keda_gpu_scaler.pages.exposition import release_in_slices

# Documents larger than this are decoded in pieces in a worker thread; smaller ones (a few ms at most)
# cost the loop less than the hand-off to a thread.
OFF_LOOP_BYTES = 256 * 1024

_DECODER = json.JSONDecoder()
_BLANKS = re.compile(r"[ \t\n\r]*")


class TooManyItems(ValueError):
    """The array at the path holds more elements than allowed."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit:,} elements")
        self.limit = limit


def loads_in_pieces(
    body: bytes | str,
    path: tuple[str, ...],
    max_items: int | None = None,
    convert: Callable[[Any], Any] | None = None,
) -> Any:
    """What json.loads(body) gives (a ValueError where it fails), the array at `path` (object keys from
    the top) decoded element by element, each element replaced by convert(element) when given;
    TooManyItems once that array has more than `max_items`."""
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    value, end = _value(text, _skip(text, 0), path, _Array(max_items, convert))
    if _skip(text, end) != len(text):
        raise ValueError(f"extra data at character {end}")
    return value


def _skip(text: str, at: int) -> int:
    match = _BLANKS.match(text, at)
    assert match is not None  # the pattern matches the empty string
    return match.end()


@dataclass(frozen=True, slots=True)
class _Array:
    max_items: int | None
    convert: Callable[[Any], Any] | None


def _value(text: str, at: int, path: tuple[str, ...], array: _Array) -> tuple[Any, int]:
    if not path:
        if text.startswith("[", at):
            return _array(text, at, array)
        return _DECODER.raw_decode(text, at)
    if not text.startswith("{", at):
        return _DECODER.raw_decode(text, at)  # not the object the path goes through: decoded whole
    document: dict[str, Any] = {}
    at = _skip(text, at + 1)
    if text.startswith("}", at):
        return document, at + 1
    while True:
        if not text.startswith('"', at):
            raise ValueError(f"expected a key at character {at}")
        key, at = _DECODER.raw_decode(text, at)
        at = _skip(text, at)
        if not text.startswith(":", at):
            raise ValueError(f"expected ':' at character {at}")
        at = _skip(text, at + 1)
        if key == path[0]:
            document[key], at = _value(text, at, path[1:], array)
        else:
            document[key], at = _DECODER.raw_decode(text, at)
        more, at = _after_element(text, at, "}")
        if not more:
            return document, at


def _array(text: str, at: int, array: _Array) -> tuple[list[Any], int]:
    items: list[Any] = []
    at = _skip(text, at + 1)
    if text.startswith("]", at):
        return items, at + 1
    while True:
        if array.max_items is not None and len(items) == array.max_items:
            # What was decoded goes in slices: dropped at once, its million objects would be freed in one
            # call holding the GIL for tens of ms.
            release_in_slices(items)
            raise TooManyItems(array.max_items)
        item, at = _DECODER.raw_decode(text, at)
        items.append(item if array.convert is None else array.convert(item))
        more, at = _after_element(text, at, "]")
        if not more:
            return items, at


def _after_element(text: str, at: int, close: str) -> tuple[bool, int]:
    """What follows an element of an object or array: (True, the next element's start) after a comma,
    (False, the end of the object or array) at its `close`."""
    at = _skip(text, at)
    if text.startswith(",", at):
        return True, _skip(text, at + 1)
    if text.startswith(close, at):
        return False, at + 1
    raise ValueError(f"expected ',' or '{close}' at character {at}")
