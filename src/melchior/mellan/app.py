"""The relay's ASGI application: control API, receiver API and the A2A entry, one app.

Any replica serves any request: all state is in the store, and ``request.app.state.relay``
holds the shared :class:`~melchior.mellan.relay.Relay`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from melchior.mellan.relay import Relay


async def healthz(request: Request) -> JSONResponse:
    relay: Relay = request.app.state.relay
    try:
        now = await relay.call(relay.store.now)
    except Exception as exc:  # the database is the relay's heart; say so plainly
        return JSONResponse({"ok": False, "error": f"database unavailable: {exc}"}, 503)
    return JSONResponse({"ok": True, "now": now})


def create_app(relay: Relay) -> Starlette:
    from melchior.mellan import a2a, control, receiver_api

    routes: list[BaseRoute] = [Route("/healthz", healthz)]
    routes += control.routes()
    routes += receiver_api.routes()
    routes += a2a.routes()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await relay.notifier.start()
        try:
            yield
        finally:
            await relay.notifier.stop()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.relay = relay
    return app
