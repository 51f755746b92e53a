"""Timestamps as A2A writes them: UTC, millisecond precision, ``Z`` suffix."""

from __future__ import annotations

from datetime import UTC, datetime


def parse_ts(text: str) -> datetime:
    """Parse an ISO-8601 timestamp (``Z`` or an offset; naive means UTC)."""
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def a2a_ts(text: str) -> str:
    """The store's clock text rendered as ``YYYY-MM-DDTHH:MM:SS.sssZ``; unparseable text is
    passed through rather than invented."""
    try:
        value = parse_ts(text)
    except ValueError:
        return text
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
