"""The control-plane API under ``/api``: agents, enrollment, grants, audit, tasks, credentials.

Owners (the workspace owner credential) manage everything in their workspace. Agent
credentials may read only what concerns their own agent: itself, grants naming it, tasks
where it is the caller or the receiver. Anything else answers exactly like something
that does not exist, so a credential cannot probe another agent's inventory. Nothing
crosses workspaces: every store call is scoped by the credential's workspace.

Every decision (allowed or refused) is appended to the audit log with its rule and reason.
Errors are ``{"error": {"code", "reason"}}`` (see :mod:`melchior.mellan.relay.refusals`).
The changes themselves (validation, policy, audit) are
:mod:`melchior.mellan.relay.surfaces.actions`,
shared with the dashboard; these handlers read JSON and answer JSON.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from melchior.mellan.relay.auth import hash_token, new_token, viewer_of
from melchior.mellan.relay.caches import presence
from melchior.mellan.relay.caches.limits import WORKSPACE_DEFAULTS
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.notify import audit_topic
from melchior.mellan.relay.store.base import (
    Agent,
    AuditRecord,
    Grant,
    Principal,
    Task,
    TaskState,
)
from melchior.mellan.relay.surfaces import actions
from melchior.mellan.relay.surfaces.actions import (
    ENROLL_TTL_DEFAULT,
    ENROLL_TTL_MAX,
    MAX_DESCRIPTION,
    bad,
    is_owner,
    may_see,
    not_found,
    owner_only,
)
from melchior.mellan.relay.surfaces.http import (
    JSON,
    ApiError,
    authenticate,
    event_view,
    field_bool,
    field_int,
    field_number,
    field_str,
    query_int,
    read_object,
    require_owner,
    task_view,
)
from melchior.policy.send_limits import Overrides
from melchior.policy.visibility import party_filters


def _relay(request: Request) -> Relay:
    relay: Relay = request.app.state.relay
    return relay


async def _who(request: Request) -> tuple[Relay, Principal]:
    relay = _relay(request)
    return relay, await authenticate(request, relay)


_Row = TypeVar("_Row", Grant, Task)


async def _as_party(
    relay: Relay,
    me: Principal,
    caller: str | None,
    receiver: str | None,
    query: Callable[[str | None, str | None], list[_Row]],
) -> list[_Row]:
    """The rows a credential may see under a (caller, receiver) filter: for an agent those
    it is a party to (:func:`melchior.policy.visibility.party_filters`), each once."""
    seen: dict[str, _Row] = {}
    for c, r in party_filters(viewer_of(me), caller, receiver):
        for row in await relay.call(query, c, r):
            seen[row.id] = row
    return list(seen.values())


# -- views ---------------------------------------------------------------------------------------


def agent_view(agent: Agent, now: str | None = None) -> dict[str, Any]:
    """An agent as JSON; with the database clock ``now``, its receiver's presence too
    (:func:`melchior.mellan.relay.caches.presence.view`) and whether a wake URL is set."""
    view: dict[str, Any] = {
        "id": agent.id,
        "workspace": agent.workspace,
        "description": agent.description,
        "capabilities": [{"id": c.id, "description": c.description} for c in agent.capabilities],
        "created_at": agent.created_at,
    }
    if now is not None:
        view["receiver"] = presence.view(agent, now)
        view["wake"] = agent.wake_url is not None
    return view


def grant_view(grant: Grant) -> dict[str, Any]:
    return {
        "id": grant.id,
        "workspace": grant.workspace,
        "caller": grant.caller,
        "receiver": grant.receiver,
        "capabilities": list(grant.capabilities),
        "created_at": grant.created_at,
        "revoked_at": grant.revoked_at,
        "sealed": grant.sealed,
    }


def audit_view(rec: AuditRecord) -> dict[str, Any]:
    return {
        "seq": rec.seq,
        "at": rec.at,
        "actor": rec.actor,
        "action": rec.action,
        "subject": rec.subject,
        "allowed": rec.allowed,
        "rule": rec.rule,
        "reason": rec.reason,
        "detail": rec.detail,
        "request_id": rec.request_id,
    }


# -- who am I ------------------------------------------------------------------------------------


async def whoami(request: Request) -> Response:
    relay, me = await _who(request)
    return JSON(
        {
            "workspace": me.workspace,
            "kind": me.kind.value,
            "subject": me.subject,
            "credential_id": me.credential_id,
            "relay": relay.public_url,
        }
    )


# -- agents --------------------------------------------------------------------------------------


async def add_agent(request: Request) -> Response:
    relay, me = await _who(request)
    await owner_only(relay, me, "agent.add")
    body = await read_object(request, relay)
    agent_id = field_str(body, "id")
    description = field_str(body, "description", required=False, max_len=MAX_DESCRIPTION)
    agent = await actions.add_agent(relay, me, agent_id, description, body.get("capabilities"))
    return JSON(agent_view(agent), 201)


async def list_agents(request: Request) -> Response:
    relay, me = await _who(request)
    if is_owner(me):
        agents = await relay.call(relay.store.list_agents, me.workspace)
    else:
        mine = await relay.call(relay.store.get_agent, me.workspace, me.subject)
        agents = [mine] if mine is not None else []
    now = await relay.call(relay.store.now)
    return JSON({"agents": [agent_view(a, now) for a in agents]})


async def get_agent(request: Request) -> Response:
    relay, me = await _who(request)
    agent_id = request.path_params["agent_id"]
    if not is_owner(me) and agent_id != me.subject:
        raise not_found(f"agent {agent_id!r}")
    agent = await relay.call(relay.store.get_agent, me.workspace, agent_id)
    if agent is None:
        raise not_found(f"agent {agent_id!r}")
    return JSON(agent_view(agent, await relay.call(relay.store.now)))


# -- enrollment ----------------------------------------------------------------------------------


async def enroll(request: Request) -> Response:
    """Mint a one-time, expiring enrollment code for an agent; shown once, stored hashed."""
    relay, me = await _who(request)
    await owner_only(relay, me, "enrollment.add")
    body = await read_object(request, relay)
    agent_id = field_str(body, "agent")
    ttl = field_int(body, "ttl_seconds", ENROLL_TTL_DEFAULT, 30, ENROLL_TTL_MAX)
    code = await actions.enroll(relay, me, agent_id, ttl)
    return JSON(code._asdict(), 201)


async def list_enrollments(request: Request) -> Response:
    """Pending enrollment codes (never their text: only the hash is kept, as ``id``)."""
    relay, me = await _who(request)
    await owner_only(relay, me, "enrollment.read")
    pending = await relay.call(relay.store.list_enrollments, me.workspace)
    return JSON(
        {
            "enrollments": [
                {
                    "id": e.id,
                    "agent": e.agent,
                    "created_at": e.created_at,
                    "expires_at": e.expires_at,
                }
                for e in pending
            ]
        }
    )


async def revoke_enrollment(request: Request) -> Response:
    relay, me = await _who(request)
    enrollment_id = request.path_params["enrollment_id"]
    await actions.revoke_enrollment(relay, me, enrollment_id)
    return JSON({"outcome": "ok", "id": enrollment_id, "revoked": True})


async def join(request: Request) -> Response:
    """Exchange an enrollment code for an agent credential. No auth: the code is the credential.

    Redeeming the code, issuing the credential and recording it are one transaction, so a
    code works once even when two joins race, and is never used up without a credential
    to show for it; the agent token is shown only in this answer.
    """
    relay = _relay(request)
    body = await read_object(request, relay)
    code = field_str(body, "code").strip()
    token = new_token()
    joined = (
        await relay.call(relay.store.join, hash_token(code), hash_token(token)) if code else None
    )
    if joined is None:
        raise ApiError(
            401,
            "bad-code",
            "this enrollment code is unknown, expired or already used; ask the workspace "
            "owner for a new one ('mellan enroll AGENT_ID')",
        )
    workspace, agent_id, credential_id = joined
    return JSON(
        {
            "token": token,
            "workspace": workspace,
            "agent": agent_id,
            "credential_id": credential_id,
            "relay": relay.public_url,
        },
        201,
    )


# -- grants --------------------------------------------------------------------------------------


async def add_grant(request: Request) -> Response:
    relay, me = await _who(request)
    await owner_only(relay, me, "grant.add")
    body = await read_object(request, relay)
    caller = field_str(body, "caller")
    receiver = field_str(body, "receiver")
    sealed = field_bool(body, "sealed", False)
    grant = await actions.add_grant(
        relay, me, caller, receiver, body.get("capabilities"), sealed=sealed
    )
    return JSON(grant_view(grant), 201)


async def list_grants(request: Request) -> Response:
    relay, me = await _who(request)
    include_revoked = request.query_params.get("include_revoked", "") in ("1", "true", "yes")
    caller = request.query_params.get("caller") or None
    receiver = request.query_params.get("receiver") or None
    store = relay.store

    def query(c: str | None, r: str | None) -> list[Grant]:
        return store.list_grants(
            me.workspace, caller=c, receiver=r, include_revoked=include_revoked
        )

    if is_owner(me):
        grants = await relay.call(query, caller, receiver)
    else:
        grants = await _as_party(relay, me, caller, receiver, query)
        grants.sort(key=lambda g: (g.created_at, g.id))
    return JSON({"grants": [grant_view(g) for g in grants]})


async def revoke_grant(request: Request) -> Response:
    relay, me = await _who(request)
    grant_id = request.path_params["grant_id"]
    await actions.revoke_grant(relay, me, grant_id)
    return JSON({"outcome": "ok", "id": grant_id, "revoked": True})


# -- audit ---------------------------------------------------------------------------------------


async def audit(request: Request) -> Response:
    """Audit records after ``after`` (a seq); with ``wait`` > 0, long-poll for new ones."""
    relay, me = await _who(request)
    await owner_only(relay, me, "audit.read")
    after = query_int(request, "after", 0, 0, 2**62)
    limit = query_int(request, "limit", 100, 1, 1000)
    wait = query_int(request, "wait", 0, 0, 60)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    topic = audit_topic(me.workspace)
    while True:
        # armed before the read, so a record written during the read still wakes us
        remaining = deadline - loop.time()
        waiter = relay.notifier.listen(topic, max(0.0, min(remaining, relay.poll_interval)))
        try:
            records = await relay.call(relay.store.audit_since, me.workspace, after, limit)
            remaining = deadline - loop.time()
            if records or remaining <= 0 or relay.closing or await request.is_disconnected():
                break
            await waiter
        finally:
            waiter.cancel()
    last = records[-1].seq if records else after
    return JSON({"records": [audit_view(r) for r in records], "next": last})


# -- tasks ---------------------------------------------------------------------------------------


async def list_tasks(request: Request) -> Response:
    relay, me = await _who(request)
    q = request.query_params
    caller = q.get("caller") or None
    receiver = q.get("receiver") or None
    context_id = q.get("context_id") or None
    after = q.get("after") or None
    limit = query_int(request, "limit", 50, 1, 500)
    states: list[TaskState] | None = None
    if q.get("state"):
        try:
            states = [TaskState(s.strip()) for s in q["state"].split(",") if s.strip()]
        except ValueError:
            allowed = ", ".join(s.value for s in TaskState)
            raise bad(f"unknown state in {q['state']!r}; states are: {allowed}") from None
    store = relay.store

    def query(c: str | None, r: str | None) -> list[Task]:
        return store.list_tasks(
            me.workspace,
            caller=c,
            receiver=r,
            context_id=context_id,
            states=states,
            after=after,
            limit=limit,
        )

    if is_owner(me):
        tasks = await relay.call(query, caller, receiver)
    else:
        tasks = await _as_party(relay, me, caller, receiver, query)
        tasks = sorted(tasks, key=lambda t: (t.created_at, t.id), reverse=True)[:limit]
    return JSON(
        {
            "tasks": [task_view(t, payload=False) for t in tasks],
            "next": tasks[-1].id if len(tasks) == limit else None,
        }
    )


async def get_task(request: Request) -> Response:
    relay, me = await _who(request)
    task_id = request.path_params["task_id"]
    task = await relay.call(relay.store.get_task, me.workspace, task_id)
    if not may_see(me, task):
        raise not_found(f"task {task_id!r}")
    assert task is not None
    events = await relay.call(relay.store.events_after, task_id, 0)
    view = task_view(task)
    view["events"] = [event_view(e) for e in events]
    return JSON(view)


async def cancel_task(request: Request) -> Response:
    """Cancel a task (:func:`melchior.mellan.relay.surfaces.actions.cancel_task`): owners, and the
    task's caller, may."""
    relay, me = await _who(request)
    after, outcome = await actions.cancel_task(relay, me, request.path_params["task_id"])
    return JSON({"outcome": outcome.value, "task": task_view(after, payload=False)})


# -- credentials ---------------------------------------------------------------------------------


async def revoke_credential(request: Request) -> Response:
    """Revoke a credential at once. Owners may revoke any in their workspace; an agent only
    its own (e.g. a machine being retired)."""
    relay, me = await _who(request)
    credential_id = request.path_params["credential_id"]
    await actions.revoke_credential(relay, me, credential_id)
    return JSON({"outcome": "ok", "id": credential_id, "revoked": True})


async def push_secret(request: Request) -> Response:
    """``GET`` reads, ``POST …/rotate`` replaces the secret push deliveries are signed with:
    an agent its own, an owner any agent's (``?agent=`` / ``{"agent": …}``)."""
    relay, me = await _who(request)
    rotate = request.url.path.endswith("/rotate")
    if rotate:
        body = await read_object(request, relay)
        agent = field_str(body, "agent", required=False) or None
    else:
        agent = request.query_params.get("agent") or None
    secret = await actions.push_secret(relay, me, agent, rotate)
    return JSON({"agent": agent or me.subject, "secret": secret, "rotated": rotate})


async def push_settings(request: Request) -> Response:
    """``GET`` shows, ``PUT`` (owner) sets the workspace's push settings."""
    relay, me = await _who(request)
    if request.method == "PUT":
        body = await read_object(request, relay)
        allowed = field_bool(body, "allow_private", False)
        await actions.set_push_private(relay, me, allowed)
    allowed = await relay.call(relay.store.push_allow_private, me.workspace)
    return JSON({"workspace": me.workspace, "allow_private": allowed})


_LIMIT_FIELDS = {
    "send_rate": (0.0, 100_000.0),
    "burst": (1, 10_000_000),
    "max_unfinished_per_receiver": (1, 10_000_000),
    "max_queued": (1, 10_000_000),
}


async def limits(request: Request) -> Response:
    """``GET`` an agent's send limits (``*``: the workspace defaults; an agent may read its
    own), ``PUT`` (owner) change them: any of ``send_rate``, ``burst``,
    ``max_unfinished_per_receiver``, ``max_queued`` (null or absent: unchanged), and
    ``reset`` (forget what is stored first)."""
    relay, me = await _who(request)
    agent = request.path_params["agent_id"]
    if request.method == "PUT":
        body = await read_object(request, relay)
        unknown = sorted(set(body) - set(_LIMIT_FIELDS) - {"reset"})
        if unknown:
            raise bad(f"unknown field {unknown[0]!r}; limits are {', '.join(_LIMIT_FIELDS)}")
        values: dict[str, Any] = {}
        for name, (lo, hi) in _LIMIT_FIELDS.items():
            if body.get(name) is None:
                continue
            if name == "send_rate":
                values[name] = field_number(body, name, 0.0, lo, hi)
            else:
                values[name] = field_int(body, name, None, int(lo), int(hi))
        reset = field_bool(body, "reset", False)
        return JSON(await actions.set_limits(relay, me, agent, Overrides(**values), reset=reset))
    if not is_owner(me) and agent != me.subject:
        raise not_found(f"agent {agent!r}")
    if (
        agent != WORKSPACE_DEFAULTS
        and await relay.call(relay.store.get_agent, me.workspace, agent) is None
    ):
        raise not_found(f"agent {agent!r}")
    stored = await relay.call(relay.store.limit_overrides, me.workspace)
    return JSON(actions.limits_view(relay, stored, agent))


async def agent_key(request: Request) -> Response:
    """GET: an agent's public key (owner, itself, either side of a grant); PUT: the agent
    registers its own (``{"public_key": …}``; rules: ``actions.set_agent_key``)."""
    relay, me = await _who(request)
    agent_id = request.path_params["agent_id"]
    if request.method == "PUT":
        body = await read_object(request, relay)
        return JSON(await actions.set_agent_key(relay, me, agent_id, body.get("public_key")))
    return JSON(await actions.agent_key(relay, me, agent_id))


async def dashboard_link(request: Request) -> Response:
    """``POST`` (owner): a one-time link that signs a browser in to the dashboard, for
    :data:`~melchior.mellan.relay.surfaces.dashboard.sessions.LINK_TTL` seconds."""
    from melchior.mellan.relay.surfaces.dashboard import PREFIX, sessions

    relay, me = await _who(request)
    require_owner(me)
    code = await sessions.mint_link(relay, me)
    url = f"{relay.public_url}{PREFIX}/signin/link?code={code}"
    return JSON({"url": url, "expires_in": sessions.LINK_TTL})


def routes() -> list[BaseRoute]:
    return [
        Route("/whoami", whoami, methods=["GET"]),
        Route("/agents", add_agent, methods=["POST"]),
        Route("/agents", list_agents, methods=["GET"]),
        Route("/agents/{agent_id:path}", get_agent, methods=["GET"]),
        Route("/limits/{agent_id:path}", limits, methods=["GET", "PUT"]),
        Route("/keys/{agent_id:path}", agent_key, methods=["GET", "PUT"]),
        Route("/enrollments", enroll, methods=["POST"]),
        Route("/enrollments", list_enrollments, methods=["GET"]),
        Route("/enrollments/{enrollment_id}/revoke", revoke_enrollment, methods=["POST"]),
        Route("/join", join, methods=["POST"]),
        Route("/grants", add_grant, methods=["POST"]),
        Route("/grants", list_grants, methods=["GET"]),
        Route("/grants/{grant_id}", revoke_grant, methods=["DELETE"]),
        Route("/grants/{grant_id}/revoke", revoke_grant, methods=["POST"]),
        Route("/audit", audit, methods=["GET"]),
        Route("/tasks", list_tasks, methods=["GET"]),
        Route("/tasks/{task_id}", get_task, methods=["GET"]),
        Route("/tasks/{task_id}/cancel", cancel_task, methods=["POST"]),
        Route("/credentials/{credential_id}", revoke_credential, methods=["DELETE"]),
        Route("/credentials/{credential_id}/revoke", revoke_credential, methods=["POST"]),
        Route("/dashboard/links", dashboard_link, methods=["POST"]),
        Route("/push/secret", push_secret, methods=["GET"]),
        Route("/push/secret/rotate", push_secret, methods=["POST"]),
        Route("/push/settings", push_settings, methods=["GET", "PUT"]),
    ]
