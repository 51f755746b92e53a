"""The relay's ASGI application: control API, receiver API and the A2A entry, one app.

Any replica serves any request: all state is in the store, and ``request.app.state.relay``
holds the shared :class:`~melchior.mellan.relay.context.Relay`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from melchior.mellan.relay.context import Relay

log = logging.getLogger("melchior.mellan")

MAX_HEADER_BYTES = 64 * 1024
"""Largest request head (request line and headers) accepted; past it, 431."""


class HeaderLimit:
    """Answer ``431`` to a request whose headers, taken together, pass ``limit`` bytes.

    The HTTP parser only bounds a head that is still arriving; one that arrives whole in a
    few reads is parsed at any size, so the total is measured here too, before any route
    (or authentication) spends work on it."""

    def __init__(self, app: ASGIApp, limit: int = MAX_HEADER_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
            size += sum(len(k) + len(v) + 4 for k, v in scope["headers"])
            if size > self.limit:
                text = f"request headers are larger than this relay accepts ({self.limit} bytes)"
                response = PlainTextResponse(text, 431)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def healthz(request: Request) -> JSONResponse:
    relay: Relay = request.app.state.relay
    try:
        now = await relay.call(relay.store.now)
    except Exception as exc:  # the database is the relay's heart; say so plainly
        return JSONResponse({"ok": False, "error": f"database unavailable: {exc}"}, 503)
    return JSONResponse({"ok": True, "now": now})


async def sweep_leases(relay: Relay) -> None:
    """Fail expired leases that have no attempts left, every ``relay.sweep_interval``.

    Runs on every replica: the store's sweep is a single conditional statement, so two
    replicas sweeping at once do no double work. Reclaiming expired leases with attempts
    left needs no sweeper (claim does it); this only makes spent tasks visibly *failed*
    even when no receiver comes back. A database outage is logged and retried.
    """
    while True:
        await asyncio.sleep(relay.sweep_interval)
        try:
            changed = await relay.call(relay.store.sweep)
        except Exception as exc:
            log.warning("lease sweep failed (will retry): %s", exc)
            continue
        if changed:
            log.info("lease sweep: %d expired task(s) out of attempts marked failed", changed)


async def http_error(request: Request, exc: Exception) -> Response:
    """Router-level misses under ``/api`` (no such path, wrong method) answer in the API's
    JSON error shape; everything else keeps Starlette's default."""
    assert isinstance(exc, HTTPException)
    if not request.url.path.startswith("/api/"):
        return PlainTextResponse(exc.detail, exc.status_code, headers=exc.headers)
    code = {404: "no-such-endpoint", 405: "method-not-allowed"}.get(exc.status_code, "http")
    reason = f"{request.method} {request.url.path}: {exc.detail}; see docs/mellan.md for the API"
    return JSONResponse(
        {"error": {"code": code, "reason": reason}}, exc.status_code, headers=exc.headers
    )


def create_app(relay: Relay) -> Starlette:
    from melchior.mellan.relay import a2a, control, receiver_api

    routes: list[BaseRoute] = [Route("/healthz", healthz)]
    routes += control.routes()
    routes += receiver_api.routes()
    routes += a2a.routes()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await relay.notifier.start()
        sweeper = asyncio.create_task(sweep_leases(relay), name="mellan-lease-sweeper")
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await relay.notifier.stop()

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error},
        middleware=[Middleware(HeaderLimit)],
    )
    app.state.relay = relay
    return app
