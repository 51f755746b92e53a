"""A plain aligned text table: how mellan prints rows for a person.

No colours and no terminal width: it is piped as often as read. The ``mellan`` commands
and ``mellan receiver status`` print with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Headers upper-cased, each column as wide as its widest cell, no trailing spaces."""
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, v in enumerate(row):
            widths[i] = max(widths[i], len(v))
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True))]
    for row in cells:
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(line.rstrip() for line in lines)
