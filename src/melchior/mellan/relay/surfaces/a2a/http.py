"""What both bindings check before they read a request: version, content type, size.

The order is deliberate: the content type is checked before a byte of the body is
parsed (a ``text/plain`` body is refused as such, not as bad JSON), and a missing
``A2A-Version`` means 0.3, which this relay does not speak.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.surfaces import body
from melchior.mellan.relay.surfaces.a2a.errors import (
    A2AError,
    ContentTypeNotSupported,
    InvalidParams,
    InvalidRequest,
    ParseError,
    PayloadTooLarge,
    RequestTimeout,
    VersionNotSupported,
)

VERSION_HEADER = "A2A-Version"
A2A_JSON = "application/a2a+json"


def check_version(request: Request) -> None:
    raw = request.headers.get(VERSION_HEADER) or request.query_params.get(VERSION_HEADER) or ""
    version = raw.strip() or "0.3"
    major = version.split(".", 1)[0]
    if major != "1":
        raise VersionNotSupported(
            f"A2A version {version!r} is not supported; this relay speaks 1.0 "
            f"(send '{VERSION_HEADER}: 1.0'; a missing header means 0.3)",
            metadata={"requested": version, "supported": "1.0"},
        )


def has_body(request: Request) -> bool:
    try:
        return body.has_body(request)
    except body.BodyError as exc:
        raise as_a2a(exc) from None


def as_a2a(exc: body.BodyError) -> A2AError:
    """A refused body (:mod:`melchior.mellan.relay.surfaces.body`, the rules shared by every
    surface) as
    the A2A error a caller of either binding expects."""
    if exc.status == 413:
        return PayloadTooLarge(exc.reason)
    if exc.status == 408:
        return RequestTimeout(exc.reason)
    if exc.status == 415:
        return ContentTypeNotSupported(exc.reason)
    if exc.path:
        return InvalidParams(exc.reason, violations=[(exc.path, exc.reason)])
    if exc.code == "bad-request":
        return InvalidRequest(exc.reason)
    return ParseError(exc.reason)


async def read_json(request: Request, relay: Relay, *, optional: bool = False) -> Any:
    """The request's JSON (content type, size, deadline, UTF-8, fitness: all checked);
    with ``optional`` an absent or blank body reads as ``{}``."""
    try:
        return await body.read_json(
            request, relay.max_body, relay.body_deadline, empty={} if optional else None
        )
    except body.BodyError as exc:
        raise as_a2a(exc) from None


def response_type(request: Request) -> str:
    """``application/a2a+json`` when the client asks for it, else ``application/json``."""
    return A2A_JSON if A2A_JSON in request.headers.get("accept", "") else "application/json"


def json_response(chunks: list[bytes], media_type: str) -> Response:
    """An answer's JSON, sent a chunk at a time when there are several (a big task's): the
    event loop writes one chunk, waits for the socket to drain, and serves other requests
    in between, rather than copying megabytes into one body and one write. The length is
    known, so it is sent as ``Content-Length`` (no chunked encoding): the same bytes on the
    wire as a one-piece answer."""
    if len(chunks) == 1:
        return Response(chunks[0], media_type=media_type)

    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    length = str(sum(len(c) for c in chunks))
    return StreamingResponse(body(), media_type=media_type, headers={"Content-Length": length})
