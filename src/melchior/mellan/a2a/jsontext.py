"""JSON in and out of the relay without changing a single value.

A relay must hand the destination exactly what the caller sent. Integers are exact in
Python already; fractions are read as :class:`~decimal.Decimal` and written back from
their own digits (``0.10000000000000000001`` and ``1.10`` survive, where a float would
round them) — the same rule the relay's other surfaces keep.
Inputs that cannot survive a round trip are refused with a reason: ``NaN``/``Infinity``
(not JSON), duplicate object keys (the last would silently win), a byte-order mark.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

from melchior.mellan.a2a.errors import ParseError


class JSONTextError(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise JSONTextError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JSONTextError(f"duplicate object key {key!r}")
        out[key] = value
    return out


def loads(data: bytes | str) -> Any:
    """Decode strict JSON (UTF-8, no BOM); raise :class:`ParseError` saying what is wrong."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"body is not UTF-8 (bad byte at offset {exc.start})") from None
    else:
        text = data
    if text.startswith("\ufeff"):
        raise ParseError("body starts with a byte-order mark; send plain UTF-8 JSON")
    try:
        return json.loads(
            text,
            parse_constant=_no_constant,
            parse_float=Decimal,
            object_pairs_hook=_unique_keys,
        )
    except JSONTextError as exc:
        raise ParseError(f"body is not acceptable JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"body is not JSON: {exc}") from None


def _encode(value: Any, out: list[str]) -> None:
    if isinstance(value, dict):
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            if i:
                out.append(",")
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


def dumps(value: Any) -> str:
    """Compact JSON text; exact decimals written from their own digits."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out)


def dumpb(value: Any) -> bytes:
    return dumps(value).encode("utf-8")
