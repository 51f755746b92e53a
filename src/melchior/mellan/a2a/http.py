"""What both bindings check before they read a request: version, content type, size.

The order is deliberate: the content type is checked before a byte of the body is
parsed (a ``text/plain`` body is refused as such, not as bad JSON), and a missing
``A2A-Version`` means 0.3, which this relay does not speak.
"""

from __future__ import annotations

from starlette.requests import Request

from melchior.mellan.a2a.errors import ContentTypeNotSupported, PayloadTooLarge, VersionNotSupported

VERSION_HEADER = "A2A-Version"
JSON_TYPES = ("application/json", "application/a2a+json")
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
    length = request.headers.get("content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return "transfer-encoding" in request.headers


def check_content_type(request: Request) -> None:
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype not in JSON_TYPES:
        raise ContentTypeNotSupported(
            f"content type {ctype or '(none)'!r} is not supported; send application/json "
            "or application/a2a+json",
            metadata={"contentType": ctype},
        )


async def read_body(request: Request, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def response_type(request: Request) -> str:
    """``application/a2a+json`` when the client asks for it, else ``application/json``."""
    return A2A_JSON if A2A_JSON in request.headers.get("accept", "") else "application/json"
