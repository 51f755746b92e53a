"""Security headers on every dashboard answer (pages, fragments, streams, assets).

The content security policy allows scripts, styles and images from the relay itself and
nothing inline (the dashboard's script is a static file; its pictures are inline SVG with
presentation attributes, which a policy does not count as inline style), no framing, and
form posts only back to the relay. The referrer policy is ``same-origin`` rather than
``no-referrer``: with the latter a browser sends ``Origin: null`` on form posts, and the
origin check could no longer tell our own pages from a sandboxed foreign one."""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "x-content-type-options": "nosniff",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "permissions-policy": "camera=(), microphone=(), geolocation=()",
}


class SecurityHeaders:
    """ASGI middleware: add :data:`HEADERS`; pages and streams also get ``no-store`` (they
    hold workspace data), static assets keep their own caching."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        static = "/static/" in path

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for key, value in HEADERS.items():
                    headers[key] = value
                if not static:
                    headers["cache-control"] = "no-store"
            await send(message)

        await self.app(scope, receive, send_with_headers)
