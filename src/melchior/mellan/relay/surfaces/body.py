"""Reading a request body, bounded, once for every HTTP surface of the relay.

A relay faces callers it must not trust with its event loop. So a body is refused
before it is read when it says it is too large, counted while it streams and refused
the moment it passes the limit, and given a deadline to arrive at all (a client that
announces a length and then sends nothing would otherwise hold its connection, and a
slot, for ever). It must be labelled JSON (a ``text/plain`` body is refused as such,
not as bad JSON), UTF-8 without a byte-order mark (``json.loads`` on bytes would
quietly accept UTF-16), and once parsed it must be fit to carry
(:func:`melchior.mellan.rawjson.check_request`: nesting, lone surrogates). A large
body is parsed on a worker thread, so even the biggest allowed body costs the event
loop nothing.

Every refusal is a :class:`BodyError` with an HTTP status, a stable code and a reason;
each surface maps it to its own error shape (the control API's ``{"error":…}``, A2A's
JSON-RPC and ``google.rpc.Status``), so the rules live here and the wording of a
refusal is the same everywhere.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from melchior.mellan.rawjson import JSONTextError, check_request, decode

JSON_TYPES = ("application/json", "application/a2a+json")
INLINE_PARSE = 64 * 1024
"""Bodies up to this many bytes are parsed on the event loop (well under a millisecond);
larger ones on a worker thread."""
BODY_DEADLINE = 30.0
"""Seconds a client has to deliver a whole request body once its headers are in."""


class BodyError(Exception):
    """A request body refused: ``status`` (413, 408, 415, 400), a stable ``code``, a reason
    a user can act on, and for a body that parsed but is unfit, the ``path`` of the field."""

    def __init__(self, status: int, code: str, reason: str, path: str = "") -> None:
        super().__init__(reason)
        self.status = status
        self.code = code
        self.reason = reason
        self.path = path


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


def check_content_type(request: Request) -> None:
    """Refuse a body not labelled JSON (415): ``application/json``, ``application/a2a+json``
    or another ``application/…+json``."""
    ctype = media_type(request)
    if ctype in JSON_TYPES or (ctype.startswith("application/") and ctype.endswith("+json")):
        return
    raise BodyError(
        415,
        "unsupported-media-type",
        f"content type {ctype or '(none)'!r} is not supported; send the body as "
        "application/json (UTF-8)",
    )


def declared_length(request: Request) -> int | None:
    raw = request.headers.get("content-length")
    if raw is None:
        return None
    text = raw.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        raise BodyError(400, "bad-request", "Content-Length is not a number")
    return int(text)


def has_body(request: Request) -> bool:
    declared = declared_length(request)
    if declared is not None:
        return declared > 0
    return "transfer-encoding" in request.headers


async def read_bytes(request: Request, limit: int, deadline: float = BODY_DEADLINE) -> bytes:
    """The whole body, at most ``limit`` bytes, within ``deadline`` seconds."""
    too_big = BodyError(
        413,
        "payload-too-large",
        f"the request body is larger than this relay accepts ({limit} bytes); send large "
        "content by reference (a url part) instead",
    )
    declared = declared_length(request)
    if declared is not None and declared > limit:
        raise too_big
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(deadline):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_big
                chunks.append(chunk)
    except TimeoutError:
        raise BodyError(
            408,
            "request-timeout",
            f"the request body did not arrive within {deadline:g} s "
            f"({size} of {declared if declared is not None else '?'} bytes came); send it whole",
        ) from None
    return b"".join(chunks)


def parse(raw: bytes) -> Any:
    """Decode UTF-8 JSON exactly and check it is fit to carry (see module docstring)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(
            400,
            "bad-json",
            f"the request body is not UTF-8 (bad byte at offset {exc.start}); JSON bodies "
            "are UTF-8",
        ) from None
    if text.startswith("\ufeff"):
        raise BodyError(
            400, "bad-json", "the request body starts with a byte-order mark; send plain UTF-8"
        )
    if "\x00" in text:  # never valid in JSON text; the mark of UTF-16 or UTF-32
        raise BodyError(
            400,
            "bad-json",
            "the request body holds NUL bytes, so it is not UTF-8 (UTF-16 or UTF-32?); "
            "JSON bodies are UTF-8",
        )
    try:
        value = decode(text)
    except JSONTextError as exc:
        raise BodyError(
            400, "bad-json", f"the request body is not acceptable JSON: {exc}"
        ) from None
    except RecursionError:
        raise BodyError(400, "bad-json", "the request body is nested too deeply") from None
    except ValueError as exc:
        raise BodyError(400, "bad-json", f"the request body is not valid JSON: {exc}") from None
    try:
        check_request(value)
    except JSONTextError as exc:
        raise BodyError(400, "unfit-json", f"{exc.path}: {exc.reason}", exc.path) from None
    return value


async def read_json(
    request: Request, limit: int, deadline: float = BODY_DEADLINE, *, empty: Any = None
) -> Any:
    """The body as exact, checked JSON. An empty body is ``empty`` when that is given
    (e.g. ``{}`` for endpoints whose fields all have defaults) and needs no content type;
    otherwise it is refused like any other non-JSON body."""
    if empty is not None and not has_body(request):
        return empty
    check_content_type(request)
    raw = await read_bytes(request, limit, deadline)
    if empty is not None and not raw.strip():
        return empty
    request.state.body_bytes = len(raw)
    if len(raw) <= INLINE_PARSE:
        return parse(raw)
    return await run_in_threadpool(parse, raw)


def parsed_inline(request: Request) -> bool:
    """Whether the request's body was small enough to be parsed on the event loop — and so
    for the work on it that is proportional to its size (e.g. encoding it again)."""
    return int(getattr(request.state, "body_bytes", 0)) <= INLINE_PARSE
