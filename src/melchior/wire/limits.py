"""One place for the size limit every transport applies before allocating."""

from __future__ import annotations

import os

DEFAULT_LIMIT = 16 * 1024 * 1024
"""Largest frame or pipe line accepted, in bytes, unless configured otherwise."""

ENV = "MELCHIOR_FRAME_LIMIT"


def frame_limit(value: int | None = None) -> int:
    """The limit to apply: an explicit value, else ``$MELCHIOR_FRAME_LIMIT``, else 16 MiB.

    A malformed environment value is an error rather than a silent default, so a
    user who tried to raise the limit learns that it did not take.
    """
    if value is not None:
        if value < 1:
            raise ValueError(f"frame limit must be positive, got {value}")
        return value
    raw = os.environ.get(ENV)
    if raw is None or raw == "":
        return DEFAULT_LIMIT
    try:
        parsed = int(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r} is not a whole number of bytes") from None
    if parsed < 1:
        raise ValueError(f"{ENV}={raw!r} must be positive")
    return parsed
