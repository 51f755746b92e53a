"""Strict JSON encoding shared by every transport.

JSON is the encoding, not a transport: all three transports hand bytes here and
get back one JSON object, or a :class:`WireError` that says what was wrong in words
a user can act on. Decoding is strict (UTF-8 only, objects only, no NaN, no repeated
key) because a
lenient reader on one side of a wire is how two sides drift apart silently.
"""

from __future__ import annotations

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


class _Strict:
    """What :class:`json.JSONDecoder` hands its C scanner, with our two refusals."""

    strict = True
    object_hook = None
    object_pairs_hook = staticmethod(_unique)
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_reject_constant)


def _default(o: Any) -> Any:
    import json  # only to word the refusal exactly as json.dumps does

    return json.JSONEncoder().default(o)


try:
    # The json package's own C accelerator, driven as JSONEncoder.encode and
    # JSONDecoder.decode drive it, without importing the package: json imports re and
    # compiles five patterns, ~5 ms of every 'melchior tool' exec (with re's enum).
    # Anything but a clean value goes through the json package for its exact answer.
    from _json import encode_basestring, make_encoder, make_scanner

    _SCAN: Any = make_scanner(_Strict())  # type: ignore[arg-type]

    def _encode_text(obj: JSONObject) -> str:
        chunks = make_encoder({}, _default, encode_basestring, None, ":", ",", False, False, False)
        return "".join(chunks(obj, 0))

except ImportError:  # pragma: no cover - an interpreter without the accelerator
    _SCAN = None

    def _encode_text(obj: JSONObject) -> str:
        return str(_json_package().JSONEncoder(**_ENCODE_OPTIONS).encode(obj))


_ENCODE_OPTIONS: dict[str, Any] = {
    "ensure_ascii": False,
    "separators": (",", ":"),
    "allow_nan": False,
}


def _json_package() -> Any:
    import json

    return json


def _decode_text(text: str) -> Any:
    """``json.loads`` with our options: the error paths, and the whole when no accelerator."""
    json = _json_package()
    decoder = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_unique)
    return decoder.decode(text)


def encode(obj: JSONObject) -> bytes:
    """Encode one top-level object as compact UTF-8 JSON."""
    if not isinstance(obj, dict):
        raise WireError(f"only JSON objects go on the wire, not {type(obj).__name__}")
    try:
        text = _encode_text(obj)
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
        # The scan JSONDecoder.decode runs; anything but one value spanning the whole text
        # (surrounding whitespace, extra data, nothing, any error — the accelerator words
        # errors only when the json package is loaded) is decoded again by the package.
        try:
            value, end = _SCAN(text, 0)
        except Exception:
            end = -1
        if end != len(text):
            value = _decode_text(text)
    except _DuplicateKey as exc:
        raise WireError(f"message repeats a key: {exc}", code="bad-json") from None
    except (ValueError, RecursionError) as exc:
        raise WireError(f"message is not JSON: {exc}", code="bad-json") from None
    if not isinstance(value, dict):
        raise WireError(
            f"message must be a JSON object, got {type(value).__name__}", code="not-an-object"
        )
    return value
