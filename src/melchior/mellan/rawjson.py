"""Exact JSON for a relay that must carry payloads faithfully.

Every number is read as a :class:`Number`: an exact decimal that remembers how it was
written, and is written back the same way (``6.02e23`` stays ``6.02e23``, ``1e400`` stays
``1e400``, ``-0`` stays ``-0``, where a float would round or respell them); integers are
Python's exact ints. Stored JSON text is spliced into output verbatim (:class:`Raw`). So
a payload comes out exactly as it went in, but for insignificant whitespace and the
escaping of strings (the same characters, written as UTF-8). No web framework imports
here: the CLI and the receiver client use it too and should start fast.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from melchior.numbers import whole  # re-exported: the relay's field readers use it

__all__ = [
    "MAX_DEPTH",
    "JSONTextError",
    "Number",
    "Raw",
    "check_request",
    "decode",
    "decode_stored",
    "encode",
    "encode_parts",
    "encode_pieces",
    "whole",
]

MAX_DEPTH = 100
"""Deepest nesting of arrays and objects a request body may have (docs/mellan.md, "Limits").
A2A's own structure uses about six levels, so a caller's data keeps more than ninety."""


class JSONTextError(ValueError):
    """Input that is JSON-shaped but could not survive a faithful round trip, or that a
    relay must not carry. ``path`` names where (``message.parts[0].text``), when known."""

    def __init__(self, reason: str, path: str = "") -> None:
        super().__init__(f"{path}: {reason}" if path else reason)
        self.reason = reason
        self.path = path


class Number(Decimal):
    """A JSON number as written: compares and computes as the exact decimal it is, and is
    encoded as its original text (Decimal alone would respell ``6.02e23`` as ``6.02E+23``)."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> Number:
        number = super().__new__(cls, text)
        number.text = text
        return number

    def __repr__(self) -> str:
        return f"Number({self.text!r})"


_INT_DIGITS = 4000
"""Integers longer than this are kept as :class:`Number` (Python refuses to convert
integer texts past 4300 digits, and converting is quadratic anyway)."""
_ODD_INT = re.compile(rf"-0(?![0-9.eE])|[0-9]{{{_INT_DIGITS + 1}}}")


def _int(text: str) -> int | Number:
    if text == "-0" or len(text) > _INT_DIGITS:
        return Number(text)
    return int(text)


@dataclass(frozen=True)
class Raw:
    """JSON text already validated by whoever stored it; written into a response as is."""

    text: str

    def utf8(self, size: int) -> tuple[bytes, ...]:
        """The text as UTF-8, ``size`` characters per piece (each ``str.encode`` a short C
        call), made once per Raw: a finished answer read by many clients is encoded once,
        not once per read (the views keep its Raw, ``a2a/views.py`` ``Kept``)."""
        made: tuple[int, tuple[bytes, ...]] | None = self.__dict__.get("_utf8")
        if made is None or made[0] != size:
            text = self.text
            pieces = tuple(text[i : i + size].encode("utf-8") for i in range(0, len(text), size))
            made = (size, pieces)
            object.__setattr__(self, "_utf8", made)
        return made[1]


def encode(value: Any) -> str:
    """Serialise ``value`` to JSON, splicing :class:`Raw` text and exact decimals verbatim."""
    return "".join(encode_parts(value))


def encode_parts(value: Any) -> list[str]:
    """:func:`encode` as the pieces that, joined, are the JSON text: a :class:`Raw` text is
    one piece of its own, so a caller turning a 15 MiB answer into bytes can do it a slice
    at a time (each C call short, so other threads get the GIL in between)."""
    return [p.text if isinstance(p, Raw) else p for p in encode_pieces(value)]


def encode_pieces(value: Any) -> list[str | Raw]:
    """:func:`encode_parts` with each :class:`Raw` left as itself, so a caller can use
    what the Raw holds already (its UTF-8 bytes, :meth:`Raw.utf8`)."""
    parts: list[str | Raw] = []
    _encode(value, parts)
    return parts


def _encode(value: Any, out: list[str | Raw]) -> None:
    if isinstance(value, Raw):
        out.append(value)
    elif isinstance(value, dict):
        out.append("{")
        first = True
        for key, item in value.items():
            if not first:
                out.append(",")
            first = False
            out.append(json.dumps(str(key), ensure_ascii=False))
            out.append(":")
            _encode(item, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, out)
        out.append("]")
    elif isinstance(value, Number):
        out.append(value.text)
    elif isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError("JSON has no NaN or Infinity")
        out.append(str(value))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("JSON has no NaN or Infinity")
        out.append(repr(value))
    else:
        out.append(json.dumps(value, ensure_ascii=False))


def _no_constants(name: str) -> Any:
    raise JSONTextError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JSONTextError(f"duplicate object key {key!r}")
        out[key] = value
    return out


def decode(text: str | bytes) -> Any:
    """Parse JSON exactly: fractions and exponents become :class:`Number` (spelling kept),
    integers exact ints (but ``-0`` and integers of thousands of digits stay
    :class:`Number` too); NaN/Infinity and duplicate object keys (the last would silently
    win, so the receiver would see less than was sent) are refused with
    :class:`JSONTextError`."""
    if isinstance(text, bytes | bytearray):
        text = text.decode("utf-8")
    # The odd integers are rare: only then pay for a Python call per integer.
    parse_int = _int if _ODD_INT.search(text) else None
    return json.loads(
        text,
        parse_float=Number,
        parse_int=parse_int,
        parse_constant=_no_constants,
        object_pairs_hook=_unique_keys,
    )


RAW_OVER = 64 * 1024
"""String literals longer than this (in characters of JSON text) are kept as
:class:`Raw` by :func:`decode_stored`, not parsed."""


def decode_stored(text: str, *, raw_over: int = RAW_OVER) -> Any:
    """:func:`decode` for JSON text the relay wrote itself (a stored result, payload or
    event body), where every string literal longer than ``raw_over`` stays its own JSON
    text, a :class:`Raw`, quotes and escapes included. Why: such a string is nearly all
    of a big answer, and parsing it (``json.loads``) and writing it again (``json.dumps``)
    are each one C call over all of it, holding the GIL for the whole call — a 15 MiB
    answer stalled the relay's event loop for seconds while three clients read it, even
    with the work on a worker thread. Spliced as is, it is only copied.

    The text is trusted to be valid JSON (it was checked before it was stored); the
    long literals are found by :func:`_long_strings` and each replaced, for the parse of
    the small rest, by a placeholder string no stored text can hold (a fresh random
    token), which is then swapped back. Object keys are never kept raw."""
    if len(text) <= raw_over:
        return decode(text)
    spans = _long_strings(text, raw_over)
    if not spans:
        return decode(text)
    token = secrets.token_hex(16)
    raws: dict[str, Raw] = {}
    pieces: list[str] = []
    last = 0
    for start, end in spans:
        mark = f"\x00raw:{token}:{len(raws)}"
        raws[mark] = Raw(text[start:end])
        pieces.append(text[last:start])
        pieces.append(json.dumps(mark))
        last = end
    pieces.append(text[last:])
    return _restore(decode("".join(pieces)), raws)


def _long_strings(text: str, longer: int) -> list[tuple[int, int]]:
    """(start, end) of each string literal longer than ``longer`` that is a value, not an
    object key. Outside strings JSON has no ``"``, so every quote found from outside one
    opens a literal; it ends at the next quote not escaped (preceded by an even run of
    backslashes). Each step is a ``str.find`` (memchr speed, short C calls) or a little
    Python, so the scan lets other threads run; its Python work grows with the number of
    quotes, not the length of the text."""
    spans: list[tuple[int, int]] = []
    find = text.find
    size = len(text)
    i = 0
    while True:
        start = find('"', i)
        if start < 0:
            return spans
        j = start + 1
        while True:
            end = find('"', j)
            if end < 0:
                raise JSONTextError("unterminated string")
            k = end - 1
            while text[k] == "\\":
                k -= 1
            if (end - 1 - k) % 2 == 0:
                break
            j = end + 1
        end += 1
        if end - start > longer:
            after = end
            while after < size and text[after] in " \t\r\n":
                after += 1
            if after >= size or text[after] != ":":
                spans.append((start, end))
        i = end


def _restore(value: Any, raws: dict[str, Raw]) -> Any:
    """``value`` with each placeholder string put back as its :class:`Raw` (iterative: the
    parsed rest is small, but may be deep)."""
    if isinstance(value, str):
        return raws.get(value, value)
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                if isinstance(item, str):
                    if item in raws:
                        node[key] = raws[item]
                elif isinstance(item, dict | list):
                    stack.append(item)
        elif isinstance(node, list):
            for index, item in enumerate(node):
                if isinstance(item, str):
                    if item in raws:
                        node[index] = raws[item]
                elif isinstance(item, dict | list):
                    stack.append(item)
    return value


# -- what JSON allows but a relay must not carry ----------------------------------------------


def _path(entry: tuple[Any, ...] | None) -> str:
    """The dotted path of a walk entry ``(node, depth, parent_entry, key)``, built only
    when an error must name it (so the walk itself allocates no strings)."""
    keys: list[str | int] = []
    while entry is not None and entry[2] is not None:
        keys.append(entry[3])
        entry = entry[2]
    out = ""
    for key in reversed(keys):
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out


def _unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_request(value: Any, *, max_depth: int = MAX_DEPTH) -> None:
    """Refuse a parsed request body that is valid JSON but not fit to carry: nesting deeper
    than ``max_depth``, or a string or key holding a lone surrogate (``"\\ud800"`` is valid
    JSON and not Unicode: it would fail in the first encoder it reached, as a 500).

    One iterative walk, linear in the body's size (bounded by the body limit), so no
    request can make it recurse or run long; the error names the first offending field.
    """
    stack: list[tuple[Any, int, Any, Any]] = [(value, 1, None, None)]
    while stack:
        entry = stack.pop()
        node, depth = entry[0], entry[1]
        if isinstance(node, str):
            if not _unicode(node):
                raise JSONTextError(_SURROGATE, _path(entry) or "body")
        elif isinstance(node, dict):
            if depth > max_depth:
                raise JSONTextError(f"nested deeper than {max_depth} levels", _path(entry))
            for key, item in node.items():
                if not _unicode(key):
                    raise JSONTextError(_SURROGATE_KEY, _path(entry) or "body")
                stack.append((item, depth + 1, entry, key))
        elif isinstance(node, list):
            if depth > max_depth:
                raise JSONTextError(f"nested deeper than {max_depth} levels", _path(entry))
            for index, item in enumerate(node):
                stack.append((item, depth + 1, entry, index))


_SURROGATE = "a string holds a lone surrogate (\\ud800-\\udfff); that is not Unicode text"
_SURROGATE_KEY = "an object key holds a lone surrogate (\\ud800-\\udfff); that is not Unicode text"
