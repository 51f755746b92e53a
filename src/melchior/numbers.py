"""Whole numbers from untrusted JSON, judged by their size before they are built.

Converting a decimal such as ``1e1000000`` to an int is quadratic in its digits: one
such number in a request would hold a server's event loop for seconds, or exhaust its
memory. Every reader of an integer field that came from outside (the relay's bodies and
query strings, a hop count in a message) goes through :func:`whole`, which refuses a
number whose magnitude is past the range from its exponent alone. Pure, no I/O.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

_DIGITS = re.compile(r"[+-]?[0-9]{1,19}")


def whole(value: Any, lo: int, hi: int, *, text: bool = False) -> int:
    """The integer ``value`` stands for, if it is whole and within ``lo..hi``; else a
    ValueError whose message completes "field X …".

    Judged by the size of its spelling *before* any conversion: converting a decimal such
    as ``1e1000000`` to an int is quadratic in its digits and would stall the event loop
    for seconds (or run out of memory), so a number whose magnitude is past the range is
    refused from its exponent alone. With ``text=True`` a decimal string is accepted too
    (ProtoJSON writes 64-bit integers as strings; query parameters are text), but only
    ASCII digits: ``"²"`` is a digit to ``str.isdigit`` and not to ``int``.
    """
    span = f"must be a whole number between {lo} and {hi}"
    if isinstance(value, bool):
        raise ValueError(f"{span}, not true/false")
    if isinstance(value, str):
        if not text or _DIGITS.fullmatch(value.strip()) is None:
            raise ValueError(f"{span}, got {value[:40]!r}")
        number = int(value.strip())
    elif isinstance(value, int):
        number = value
    elif isinstance(value, Decimal | float):
        exact = value if isinstance(value, Decimal) else Decimal(value)
        if not exact.is_finite():
            raise ValueError(span)
        if exact and exact.adjusted() > max(len(str(abs(lo))), len(str(abs(hi)))):
            raise ValueError(f"{span} (got a number about 1e{exact.adjusted()})")
        if exact != exact.to_integral_value():
            raise ValueError(f"{span}, got a fraction")
        number = int(exact)
    else:
        raise ValueError(f"{span}, got {_json_kind(value)}")
    if not lo <= number <= hi:
        raise ValueError(f"{span}, got {number}")
    return number


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
