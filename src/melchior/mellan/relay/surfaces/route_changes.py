"""Task routes over the control API: the receiving agent proposes, the owner approves.

A route says how one receiving agent runs one capability (adapter, bound session,
working directory, unattended profile, adapter options). It is proposed *from the
destination machine* with that agent's credential (``mellan connect …``: only the agent
knows its sessions and directories) and takes effect only once the workspace owner
approves it (``mellan route approve``). Approving a route for an (agent, capability)
that already has one revokes the old one in the same transaction. Every change is
audited in its own transaction (``route.propose``, ``route.approve``, ``route.revoke``),
refusals of owner-only operations too.

What a route may say is :func:`melchior.policy.task_routes.check_route`'s; refusals name the
field. The claim hands each lease the route approved for its capability
(:mod:`melchior.mellan.relay.surfaces.receiver`), and a route bound to a session gives its
tasks that session's queue key (:func:`melchior.policy.task_routes.session_key`, applied at the
A2A door).

HTTP (JSON; errors as everywhere in ``/api``)::

    POST /api/routes                 (agent) {"capability","adapter","session"?,"cwd"?,
                                              "profile"?,"options"?{}} → 201 route
    GET  /api/routes?agent=&state=&capability=   owner: all; agent: its own → {"routes":[…]}
    GET  /api/routes/{id}            owner, or the route's agent → route
    POST /api/routes/{id}/approve    (owner) → {"outcome":"ok"|"duplicate","route",
                                                "superseded":[ids]}
    POST /api/routes/{id}/revoke     (owner) → {"outcome":"ok"|"duplicate","route"}
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from melchior.mellan.ids import CAPABILITY_ID
from melchior.mellan.rawjson import Raw, encode
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.store.base import (
    NewRoute,
    Principal,
    Record,
    RouteState,
)
from melchior.mellan.relay.store.base import (
    Route as TaskRoute,
)
from melchior.mellan.relay.surfaces.actions import bad, is_owner, not_found, owner_only
from melchior.mellan.relay.surfaces.http import (
    JSON,
    ApiError,
    actor,
    authenticate,
    field_str,
    read_object,
    record,
)
from melchior.policy.task_routes import FIELD, MAX_CWD, check_route

MAX_PENDING = 50
"""Pending routes one agent may have at once (a proposal flood stops here)."""


def route_view(route: TaskRoute) -> dict[str, Any]:
    return {
        "id": route.id,
        "workspace": route.workspace,
        "agent": route.agent,
        "capability": route.capability,
        "adapter": route.adapter,
        "session": route.session,
        "cwd": route.cwd,
        "profile": route.profile,
        "options": Raw(route.options),
        "state": route.state.value,
        "proposed_at": route.proposed_at,
        "proposed_by": route.proposed_by,
        "approved_at": route.approved_at,
        "approved_by": route.approved_by,
        "revoked_at": route.revoked_at,
        "revoked_by": route.revoked_by,
    }


def lease_route(route: TaskRoute | None) -> dict[str, Any] | None:
    """A route as a claimed lease carries it: what the receiver needs to run the task."""
    if route is None:
        return None
    return {
        "id": route.id,
        "capability": route.capability,
        "adapter": route.adapter,
        "session": route.session,
        "cwd": route.cwd,
        "profile": route.profile,
        "options": Raw(route.options),
    }


def states_from(text: str | None) -> list[RouteState] | None:
    """``pending,approved`` → states; None for no filter; a bad name refused by name."""
    if not text:
        return None
    try:
        return [RouteState(s.strip()) for s in text.split(",") if s.strip()]
    except ValueError:
        names = ", ".join(s.value for s in RouteState)
        raise bad(f"unknown route state in {text!r}; states are: {names}") from None


# -- the changes (shared by the control API and the dashboard) ------------------------------------


async def propose(relay: Relay, me: Principal, body: dict[str, Any]) -> TaskRoute:
    """The agent behind ``me`` proposes how it runs a capability; pending until approved."""
    if is_owner(me):
        raise ApiError(
            403, "agent-only",
            "a route is proposed by the receiving agent itself, with its agent credential on "
            "its machine ('mellan connect …'); the owner approves it",
        )  # fmt: skip
    capability = field_str(body, "capability", max_len=128)
    adapter = field_str(body, "adapter", max_len=64)
    session = field_str(body, "session", required=False, max_len=256) or None
    cwd = field_str(body, "cwd", required=False, max_len=MAX_CWD) or None
    profile = field_str(body, "profile", required=False, max_len=64) or None
    options = body.get("options", {})
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise ApiError(400, "bad-request", "field 'options' must be a JSON object",
                       {"field": "options"})  # fmt: skip
    options_text = encode(options)
    if not CAPABILITY_ID.match(capability):
        raise ApiError(
            400, "bad-request",
            f"field 'capability': {capability!r} is not a capability id (letters, digits and "
            ". _ : / -, at most 128)",
            {"field": "capability"},
        )  # fmt: skip
    agent = await relay.call(relay.store.get_agent, me.workspace, me.subject)
    if agent is None:
        raise not_found(f"agent {me.subject!r}")
    decision = check_route(
        agent=me.subject,
        capability=capability,
        adapter=adapter,
        declared={c.id for c in agent.capabilities},
        session=session,
        cwd=cwd,
        profile=profile,
        options_bytes=len(options_text.encode("utf-8")),
    )
    if not decision:
        raise ApiError.of(400, decision, "bad-request", field=FIELD.get(decision.rule, ""))
    pending = await relay.call(
        relay.store.list_routes,
        me.workspace,
        agent=me.subject,
        states=[RouteState.PENDING],
        limit=MAX_PENDING,
    )
    if len(pending) >= MAX_PENDING:
        raise ApiError(
            429, "too-many-pending",
            f"{me.subject} already has {MAX_PENDING} routes waiting for approval; the owner "
            "approves or revokes them first ('mellan route list --state pending')",
        )  # fmt: skip
    new = NewRoute(
        workspace=me.workspace,
        agent=me.subject,
        capability=capability,
        adapter=adapter,
        proposed_by=actor(me),
        session=session,
        cwd=cwd,
        profile=profile,
        options=options_text,
    )
    detail = {"capability": capability, "adapter": adapter, "session": session, "cwd": cwd,
              "profile": profile}  # fmt: skip
    audit = Record(actor(me), "route.propose", decision.rule, decision.reason, detail)
    return await relay.call(relay.store.propose_route, new, record=audit)


async def list_for(
    relay: Relay,
    me: Principal,
    *,
    agent: str | None = None,
    states: list[RouteState] | None = None,
    capability: str | None = None,
) -> list[TaskRoute]:
    """Routes the credential may see: an owner all, an agent its own only."""
    if not is_owner(me):
        if agent is not None and agent != me.subject:
            return []
        agent = me.subject
    return await relay.call(
        relay.store.list_routes, me.workspace, agent=agent, capability=capability, states=states
    )


async def approve(relay: Relay, me: Principal, route_id: str) -> tuple[TaskRoute, bool, list[str]]:
    """Owner only: the route applies from now on (superseding the one approved before)."""
    await owner_only(relay, me, "route.approve")
    current = await relay.call(relay.store.get_route, me.workspace, route_id)
    if current is None:
        await _refused(relay, me, "route.approve", route_id)
    assert current is not None
    audit = Record(
        actor(me), "route.approve", "owner",
        f"{current.agent} runs {current.capability} with the {current.adapter} adapter"
        + (f", bound to session {current.session}" if current.session else ""),
        {"agent": current.agent, "capability": current.capability,
         "adapter": current.adapter, "session": current.session, "cwd": current.cwd,
         "profile": current.profile},
    )  # fmt: skip
    try:
        change = await relay.call(
            relay.store.approve_route, me.workspace, route_id, actor(me), record=audit
        )
    finally:
        relay.facts.forget()  # new sends here key by it at once (other replicas: within 2 s)
    route = change.route
    if route is None:
        await _refused(relay, me, "route.approve", route_id)
    assert route is not None
    if not change.changed and route.state is RouteState.REVOKED:
        raise ApiError(
            409, "not-pending",
            f"route {route_id} was revoked; a revoked route is never approved again. Ask "
            f"{route.agent} to propose it again ('mellan connect …' on its machine)",
        )  # fmt: skip
    return route, change.changed, [r.id for r in change.superseded]


async def revoke(relay: Relay, me: Principal, route_id: str) -> tuple[TaskRoute, bool]:
    """Owner only: the route stops applying at once (a task already leased keeps the route
    it was handed; the next claim sees none)."""
    await owner_only(relay, me, "route.revoke")
    audit = Record(
        actor(me), "route.revoke", "owner",
        "route revoked; its capability has no route until another is approved",
    )  # fmt: skip
    try:
        change = await relay.call(
            relay.store.revoke_route, me.workspace, route_id, actor(me), record=audit
        )
    finally:
        relay.facts.forget()  # new sends here key by it at once (other replicas: within 2 s)
    if change.route is None:
        await _refused(relay, me, "route.revoke", route_id)
    assert change.route is not None
    return change.route, change.changed


async def _refused(relay: Relay, me: Principal, action: str, route_id: str) -> None:
    await record(
        relay, me.workspace, actor(me), action, route_id[:128], False, "not-found",
        "no route with this id",
    )  # fmt: skip
    raise ApiError(
        404, "not-found",
        f"no route {route_id!r} in this workspace (a typo? see 'mellan route list')",
    )  # fmt: skip


# -- HTTP -----------------------------------------------------------------------------------------


async def _who(request: Request) -> tuple[Relay, Principal]:
    relay: Relay = request.app.state.relay
    return relay, await authenticate(request, relay)


async def post_route(request: Request) -> Response:
    relay, me = await _who(request)
    body = await read_object(request, relay)
    route = await propose(relay, me, body)
    return JSON(route_view(route), 201)


async def get_routes(request: Request) -> Response:
    relay, me = await _who(request)
    q = request.query_params
    capability = q.get("capability") or None
    routes = await list_for(
        relay,
        me,
        agent=q.get("agent") or None,
        states=states_from(q.get("state")),
        capability=capability,
    )
    return JSON({"routes": [route_view(r) for r in routes]})


async def get_route(request: Request) -> Response:
    relay, me = await _who(request)
    route_id = request.path_params["route_id"]
    route = await relay.call(relay.store.get_route, me.workspace, route_id)
    if route is None or (not is_owner(me) and route.agent != me.subject):
        raise not_found(f"route {route_id!r}")
    return JSON(route_view(route))


async def post_approve(request: Request) -> Response:
    relay, me = await _who(request)
    route, changed, superseded = await approve(relay, me, request.path_params["route_id"])
    return JSON(
        {
            "outcome": "ok" if changed else "duplicate",
            "route": route_view(route),
            "superseded": superseded,
        }
    )


async def post_revoke(request: Request) -> Response:
    relay, me = await _who(request)
    route, changed = await revoke(relay, me, request.path_params["route_id"])
    return JSON({"outcome": "ok" if changed else "duplicate", "route": route_view(route)})


def http_routes() -> list[BaseRoute]:
    return [
        Route("/routes", post_route, methods=["POST"]),
        Route("/routes", get_routes, methods=["GET"]),
        Route("/routes/{route_id}", get_route, methods=["GET"]),
        Route("/routes/{route_id}/approve", post_approve, methods=["POST"]),
        Route("/routes/{route_id}/revoke", post_revoke, methods=["POST"]),
    ]
