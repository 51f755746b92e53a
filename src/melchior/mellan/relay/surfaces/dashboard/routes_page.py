"""The dashboard's Routes page: task routes by state, approved or revoked by the owner.

A route is proposed from the agent's own machine (``mellan connect``); here the owner
reads exactly what it would run — adapter, bound session, working directory, unattended
profile, options — and approves or revokes it. Both go through
:mod:`melchior.mellan.relay.surfaces.route_changes`, the functions the control API calls, so the
rules, refusals and audit records are the same.
"""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import Response

from melchior.mellan.relay.refusals import ApiError
from melchior.mellan.relay.store.base import Route, RouteState
from melchior.mellan.relay.surfaces import route_changes
from melchior.mellan.relay.surfaces.dashboard import render
from melchior.mellan.relay.surfaces.dashboard.forms import Form
from melchior.mellan.relay.surfaces.dashboard.guard import relay_of
from melchior.mellan.relay.surfaces.dashboard.pages import (
    _error,
    _page,
    _read,
    _store,
    done,
    refused,
)
from melchior.mellan.relay.surfaces.dashboard.sessions import Owner

REVOKED_SHOWN = 50
"""Revoked routes listed, newest first (the audit log keeps every one)."""


async def _routes_page(
    request: Request,
    owner: Owner,
    *,
    status: int = 200,
    error: dict[str, str] | None = None,
) -> Response:
    store = _store(request)
    listed: list[Route] = await _read(request, store.list_routes, owner.workspace)
    by_state = {state: [r for r in listed if r.state is state] for state in RouteState}
    return _page(
        request, owner, "routes.html", "routes", status=status,
        pending=by_state[RouteState.PENDING], approved=by_state[RouteState.APPROVED],
        revoked=by_state[RouteState.REVOKED][:REVOKED_SHOWN],
        error=error, **({"notice": ""} if error else {}),
    )  # fmt: skip


async def routes_page(request: Request, owner: Owner) -> Response:
    return await _routes_page(request, owner)


async def approve_route(request: Request, owner: Owner, form: Form) -> Response:
    try:
        await route_changes.approve(
            relay_of(request), owner.principal, request.path_params["route_id"]
        )
    except ApiError as exc:
        return await refused(
            request,
            exc,
            partial(_routes_page, request, owner, status=exc.status, error=_error(exc)),
        )
    return done(request, "route-approved", f"{render.base_path(request)}/routes")


async def revoke_route(request: Request, owner: Owner, form: Form) -> Response:
    try:
        await route_changes.revoke(
            relay_of(request), owner.principal, request.path_params["route_id"]
        )
    except ApiError as exc:
        return await refused(
            request,
            exc,
            partial(_routes_page, request, owner, status=exc.status, error=_error(exc)),
        )
    return done(request, "route-revoked", f"{render.base_path(request)}/routes")
