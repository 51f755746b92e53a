"""Exact JSON for a relay that must carry payloads faithfully.

Bodies are parsed with exact decimals (``parse_float=Decimal``; Python ints are already
exact) and re-encoded without going through binary floats, and stored JSON text is
spliced into output verbatim (:class:`Raw`). So ``12345678901234567890`` and
``0.10000000000000000001`` come out exactly as they went in. No web framework imports
here: the CLI and the receiver client use it too and should start fast.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = ["JSONTextError", "Raw", "decode", "encode"]


class JSONTextError(ValueError):
    """Input that is JSON-shaped but could not survive a faithful round trip."""


@dataclass(frozen=True)
class Raw:
    """JSON text already validated by whoever stored it; written into a response as is."""

    text: str


def encode(value: Any) -> str:
    """Serialise ``value`` to JSON, splicing :class:`Raw` text and exact decimals verbatim."""
    parts: list[str] = []
    _encode(value, parts)
    return "".join(parts)


def _encode(value: Any, out: list[str]) -> None:
    if isinstance(value, Raw):
        out.append(value.text)
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
    """Parse JSON exactly: floats become :class:`Decimal`; NaN/Infinity and duplicate object
    keys (the last would silently win, so the receiver would see less than was sent) are
    refused with :class:`JSONTextError`."""
    return json.loads(
        text, parse_float=Decimal, parse_constant=_no_constants, object_pairs_hook=_unique_keys
    )
