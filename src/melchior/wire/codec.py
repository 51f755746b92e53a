"""Strict JSON encoding shared by every transport.

JSON is the encoding, not a transport: all three transports hand bytes here and
get back one JSON object, or a :class:`WireError` that says what was wrong in words
a user can act on. Decoding is strict (UTF-8 only, objects only, no NaN, no repeated
key) because a
lenient reader on one side of a wire is how two sides drift apart silently.
"""

from __future__ import annotations

import json

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (tool start-up)
if TYPE_CHECKING:
    from typing import Any

    JSONObject = dict[str, Any]
else:
    JSONObject = dict


class WireError(Exception):
    """A message could not be read or is not allowed on the wire.

    ``fatal`` is true when the framing itself is lost (a bad length, EOF inside a
    frame): the connection cannot be resynchronised and must close after the
    refusal is sent. Non-fatal errors leave the stream usable.
    """

    def __init__(self, reason: str, *, code: str = "refused", fatal: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.fatal = fatal


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _DuplicateKey(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> JSONObject:
    """Refuse a repeated key: with last-one-wins, ``{"call":"status","call":"verbs"}`` would
    be answered as whichever spelling the reader happened to keep, so two readers of one
    message could disagree about what it said."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(f"duplicate key {key!r}")
            seen.add(key)
    return out


# Built once: json.dumps/json.loads with options build a new encoder or decoder (and its
# C scanner) on every call, a measurable part of a small message's round trip.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_unique)
_SCAN = _DECODER.scan_once  # type: ignore[attr-defined]  # (set in JSONDecoder.__init__)


def encode(obj: JSONObject) -> bytes:
    """Encode one top-level object as compact UTF-8 JSON."""
    if not isinstance(obj, dict):
        raise WireError(f"only JSON objects go on the wire, not {type(obj).__name__}")
    try:
        text = _ENCODER.encode(obj)
    except (TypeError, ValueError) as exc:
        raise WireError(f"message cannot be encoded as JSON: {exc}") from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise WireError(
            f"message holds text that is not Unicode (a lone surrogate at {exc.start})",
            code="bad-encoding",
        ) from None


def decode(data: bytes) -> JSONObject:
    """Decode one message; anything but a UTF-8 JSON object is a non-fatal WireError."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(
            f"message is not valid UTF-8 (bad byte at offset {exc.start})", code="bad-encoding"
        ) from None
    if text.startswith("\ufeff"):
        raise WireError("message starts with a byte-order mark; send plain UTF-8", code="bad-json")
    try:
        # The decoder's own scan, as JSONDecoder.decode runs it, without its two whitespace
        # regex matches; anything but one value spanning the whole text (surrounding
        # whitespace, extra data, nothing) goes through decode() for its exact answer.
        try:
            value, end = _SCAN(text, 0)
        except StopIteration:
            end = -1
        if end != len(text):
            value = _DECODER.decode(text)
    except _DuplicateKey as exc:
        raise WireError(f"message repeats a key: {exc}", code="bad-json") from None
    except (ValueError, RecursionError) as exc:
        raise WireError(f"message is not JSON: {exc}", code="bad-json") from None
    if not isinstance(value, dict):
        raise WireError(
            f"message must be a JSON object, got {type(value).__name__}", code="not-an-object"
        )
    return value
