"""The mellan dashboard: the workspace owner's pages, served by the relay under ``/ui``.

Its own Starlette sub-app (like ``/api`` and ``/a2a``), with its own exception handlers
so that every refusal is a page that says why (or a sign-in redirect), its security
headers, its templates and its static assets shipped in the package — nothing to build,
no request leaving the machine. Module by concept:

- :mod:`.sessions` — owner sessions, cookies, CSRF and origin checks;
  :mod:`.guard` — the wrapper every protected route goes through; :mod:`.signin`;
- :mod:`.pages` — pages and forms (changes through :mod:`melchior.mellan.relay.surfaces.actions`,
  the same functions the control API calls); :mod:`.live` — server-sent updates;
- :mod:`.routes_page` — the Routes page (approve, revoke);
- :mod:`.timeline` — a task's recorded steps; :mod:`.pictures` — SVG pictures;
- :mod:`.render`, :mod:`.forms`, :mod:`.headers` — templates, bounded forms, headers.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.refusals import ApiError, client_gone, unavailable_reason
from melchior.mellan.relay.store.base import Conflict, NotFoundError, StoreError, StoreUnavailable
from melchior.mellan.relay.surfaces.dashboard import live, pages, render, routes_page, signin
from melchior.mellan.relay.surfaces.dashboard.guard import change, view
from melchior.mellan.relay.surfaces.dashboard.headers import SecurityHeaders
from melchior.mellan.relay.surfaces.dashboard.sessions import Refused, Settings

PREFIX = "/ui"
log = logging.getLogger("melchior.mellan")

__all__ = ["PREFIX", "Settings", "create_dashboard"]


def _error_page(request: Request, status: int, rule: str, reason: str) -> Response:
    accept = request.headers.get("accept", "")
    if "application/json" in accept:
        return JSONResponse({"error": {"code": rule, "reason": reason, "rule": rule}}, status)
    if "text/event-stream" in accept:
        return PlainTextResponse(f"{rule}: {reason}", status)
    return render.page(
        request, "error.html", {"status": status, "error": {"rule": rule, "reason": reason}},
        status=status,
    )  # fmt: skip


async def refused(request: Request, exc: Exception) -> Response:
    """Not signed in: a page asked for by the browser goes to the sign-in page (and comes
    back after); anything else, and every forbidden request, is refused where it stands."""
    assert isinstance(exc, Refused)
    accept = request.headers.get("accept", "")
    if (
        exc.status == 401
        and request.method in ("GET", "HEAD")
        and "text/event-stream" not in accept
        and "application/json" not in accept
    ):
        back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        query = urlencode({"next": back, "why": exc.decision.rule})
        return RedirectResponse(f"{render.base_path(request)}/signin?{query}", status_code=303)
    return _error_page(request, exc.status, exc.decision.rule, exc.decision.reason)


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return _error_page(request, exc.status, exc.rule, exc.reason)


async def store_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, StoreUnavailable):
        log.warning("database unavailable during %s %s: %s", request.method, request.url.path, exc)
        return _error_page(request, 503, "database-unavailable", unavailable_reason(exc))
    if isinstance(exc, Conflict):
        return _error_page(request, 409, "exists", str(exc))
    if isinstance(exc, NotFoundError):
        return _error_page(request, 404, "not-found", str(exc))
    return await internal_error(request, exc)


async def route_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    rule = {404: "no-such-page", 405: "method-not-allowed"}.get(exc.status_code, "http")
    return _error_page(
        request, exc.status_code, rule, f"{request.method} {request.url.path}: {exc.detail}"
    )


async def internal_error(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error in %s %s", request.method, request.url.path, exc_info=exc)
    return _error_page(
        request,
        500,
        "internal",
        f"the relay failed unexpectedly ({type(exc).__name__}); the relay log has the "
        "details. Changes are single transactions, so trying again is safe",
    )


HANDLERS: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
    ClientDisconnect: client_gone,
    Refused: refused,
    ApiError: api_error,
    StoreError: store_error,
    HTTPException: route_error,
    Exception: internal_error,
}
"""Exception handlers of the ``/ui`` mount."""


def routes() -> list[BaseRoute]:
    """The dashboard, relative to its mount: every route but sign-in and the assets goes
    through :func:`.guard.view` or :func:`.guard.change`."""
    get, post = ["GET"], ["POST"]
    return [
        Route("/signin", signin.signin_page, methods=get),
        Route("/signin", signin.signin, methods=post),
        Route("/signin/link", signin.link_page, methods=get),
        Route("/signin/link", signin.link_signin, methods=post),
        Route("/signout", change(signin.signout), methods=post),
        Route("/", view(pages.overview), methods=get),
        Route("/agents", view(pages.agents_page), methods=get),
        Route("/agents", change(pages.add_agent), methods=post),
        Route("/enrollments", change(pages.enroll), methods=post),
        Route("/enrollments/{code_id}/revoke", change(pages.revoke_code), methods=post),
        Route("/credentials/{credential_id}/revoke", change(pages.revoke_credential), methods=post),
        Route("/grants", view(pages.grants_page), methods=get),
        Route("/grants", change(pages.add_grant), methods=post),
        Route("/grants/{grant_id}/revoke", change(pages.revoke_grant), methods=post),
        Route("/routes", view(routes_page.routes_page), methods=get),
        Route("/routes/{route_id}/approve", change(routes_page.approve_route), methods=post),
        Route("/routes/{route_id}/revoke", change(routes_page.revoke_route), methods=post),
        Route("/tasks", view(pages.tasks_page), methods=get),
        Route("/tasks/live", view(live.tasks_live, touch=False), methods=get),
        Route("/tasks/{task_id}", view(pages.task_view), methods=get),
        Route("/tasks/{task_id}/live", view(live.task_live, touch=False), methods=get),
        Route("/tasks/{task_id}/cancel", change(pages.cancel_task), methods=post),
        Route("/audit", view(pages.audit_page), methods=get),
        Route("/audit/live", view(live.audit_live, touch=False), methods=get),
        Mount("/static", StaticFiles(directory=render.HERE / "static"), name="static"),
    ]


def create_dashboard(relay: Relay, settings: Settings | None = None) -> Starlette:
    """The dashboard sub-app for one relay replica (mount it at :data:`PREFIX`)."""
    app = Starlette(
        routes=routes(),
        exception_handlers=HANDLERS,
        middleware=[Middleware(SecurityHeaders)],
    )
    app.state.relay = relay
    app.state.settings = settings or Settings()
    return app
