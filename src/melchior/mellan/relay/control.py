"""The control-plane API under ``/api``: agents, enrollment, grants, audit, tasks, credentials.

Owners (the workspace owner credential) manage everything in their workspace. Agent
credentials may read only what concerns their own agent: itself, grants naming it, tasks
where it is the caller or the receiver. Anything else answers exactly like something
that does not exist, so a credential cannot probe another agent's inventory. Nothing
crosses workspaces: every store call is scoped by the credential's workspace.

Every decision (allowed or refused) is appended to the audit log with its rule and reason.
Errors are ``{"error": {"code", "reason"}}`` (see :mod:`melchior.mellan.relay.http`).
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from melchior.mellan.relay.auth import hash_token, new_token, parties_of, viewer_of
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.http import (
    JSON,
    ApiError,
    actor,
    authenticate,
    event_view,
    field_int,
    field_str,
    query_int,
    read_object,
    record,
    require_owner,
    task_view,
)
from melchior.mellan.relay.notify import audit_topic, receiver_topic, task_topic
from melchior.mellan.relay.store.base import (
    Agent,
    AuditRecord,
    Capability,
    Conflict,
    CredentialKind,
    Grant,
    Outcome,
    Principal,
    Record,
    Task,
    TaskState,
)
from melchior.policy.grants import may_grant
from melchior.policy.visibility import Party, may_see_task, party_filters

AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(/[A-Za-z0-9][A-Za-z0-9._-]{0,63}){0,3}$")
CAPABILITY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
ENROLL_TTL_DEFAULT = 15 * 60
ENROLL_TTL_MAX = 7 * 24 * 3600
CODE_PREFIX = "mlj_"
MAX_DESCRIPTION = 2000
"""Longest agent or capability description (characters); limits are in docs/mellan.md."""
MAX_CAPABILITIES = 256
"""Most capabilities one agent declares, or one grant names."""


def _relay(request: Request) -> Relay:
    relay: Relay = request.app.state.relay
    return relay


async def _who(request: Request) -> tuple[Relay, Principal]:
    relay = _relay(request)
    return relay, await authenticate(request, relay)


async def _owner_only(relay: Relay, me: Principal, action: str) -> None:
    """Refuse a non-owner, and record the refusal: an agent reaching for owner powers is a
    decision worth an audit line."""
    if _is_owner(me):
        return
    await record(
        relay, me.workspace, actor(me), action, me.subject, False, "owner-only",
        "an agent credential asked for an owner-only operation",
    )  # fmt: skip
    require_owner(me)


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


def _is_owner(p: Principal) -> bool:
    return p.kind is CredentialKind.OWNER


def _bad(reason: str, code: str = "bad-request") -> ApiError:
    return ApiError(400, code, reason)


def _not_found(what: str) -> ApiError:
    return ApiError(404, "not-found", f"no {what} visible to this credential")


# -- views ---------------------------------------------------------------------------------------


def agent_view(agent: Agent) -> dict[str, Any]:
    return {
        "id": agent.id,
        "workspace": agent.workspace,
        "description": agent.description,
        "capabilities": [{"id": c.id, "description": c.description} for c in agent.capabilities],
        "created_at": agent.created_at,
    }


def grant_view(grant: Grant) -> dict[str, Any]:
    return {
        "id": grant.id,
        "workspace": grant.workspace,
        "caller": grant.caller,
        "receiver": grant.receiver,
        "capabilities": list(grant.capabilities),
        "created_at": grant.created_at,
        "revoked_at": grant.revoked_at,
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


def _capabilities(raw: Any) -> list[Capability]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad("'capabilities' must be a list of ids or {id, description} objects")
    if len(raw) > MAX_CAPABILITIES:
        raise _bad(f"an agent declares at most {MAX_CAPABILITIES} capabilities")
    out: dict[str, Capability] = {}
    for item in raw:
        if isinstance(item, str):
            cap = Capability(item)
        elif isinstance(item, dict) and isinstance(item.get("id"), str):
            desc = item.get("description", "")
            if not isinstance(desc, str):
                raise _bad("a capability's description must be a string")
            if len(desc) > MAX_DESCRIPTION:
                raise _bad(
                    f"a capability's description is longer than {MAX_DESCRIPTION} characters"
                )
            cap = Capability(item["id"], desc)
        else:
            raise _bad("each capability must be an id string or an {id, description} object")
        if not CAPABILITY_ID.match(cap.id):
            raise _bad(
                f"capability id {cap.id!r} is not valid: use letters, digits and . _ : / - "
                "(at most 128), e.g. 'incident.inspect'"
            )
        if cap.id in out:
            raise _bad(f"capability {cap.id!r} is listed twice")
        out[cap.id] = cap
    return list(out.values())


async def add_agent(request: Request) -> Response:
    relay, me = await _who(request)
    await _owner_only(relay, me, "agent.add")
    body = await read_object(request, relay)
    agent_id = field_str(body, "id")
    description = field_str(body, "description", required=False, max_len=MAX_DESCRIPTION)
    if not AGENT_ID.match(agent_id):
        raise _bad(
            f"agent id {agent_id!r} is not valid: one to four '/'-separated parts of letters, "
            "digits and . _ - (e.g. 'local/codex', 'private/ops')"
        )
    caps = _capabilities(body.get("capabilities"))
    existing = await relay.call(relay.store.get_agent, me.workspace, agent_id)
    conflict = ApiError(
        409,
        "exists",
        f"agent {agent_id!r} already exists in workspace {me.workspace!r}; ids are stable, "
        "pick another id or keep using this one",
    )
    if existing is not None:
        raise conflict
    audit = Record(
        actor(me), "agent.add", "owner",
        f"added agent {agent_id} with {len(caps)} capabilit{'y' if len(caps) == 1 else 'ies'}",
        {"capabilities": [c.id for c in caps]},
    )  # fmt: skip
    try:
        agent = await relay.call(
            relay.store.add_agent, me.workspace, agent_id, description, caps, record=audit
        )
    except Conflict:
        raise conflict from None
    return JSON(agent_view(agent), 201)


async def list_agents(request: Request) -> Response:
    relay, me = await _who(request)
    if _is_owner(me):
        agents = await relay.call(relay.store.list_agents, me.workspace)
    else:
        mine = await relay.call(relay.store.get_agent, me.workspace, me.subject)
        agents = [mine] if mine is not None else []
    return JSON({"agents": [agent_view(a) for a in agents]})


async def get_agent(request: Request) -> Response:
    relay, me = await _who(request)
    agent_id = request.path_params["agent_id"]
    if not _is_owner(me) and agent_id != me.subject:
        raise _not_found(f"agent {agent_id!r}")
    agent = await relay.call(relay.store.get_agent, me.workspace, agent_id)
    if agent is None:
        raise _not_found(f"agent {agent_id!r}")
    return JSON(agent_view(agent))


# -- enrollment ----------------------------------------------------------------------------------


def _plus_seconds(iso_now: str, seconds: int) -> str:
    """``iso_now`` (the database clock) plus ``seconds``, in the store's own ISO form."""
    dt = datetime.fromisoformat(iso_now.replace("Z", "+00:00")) + timedelta(seconds=seconds)
    text = dt.isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z") if iso_now.endswith("Z") else text


async def enroll(request: Request) -> Response:
    """Mint a one-time, expiring enrollment code for an agent; shown once, stored hashed."""
    relay, me = await _who(request)
    await _owner_only(relay, me, "enrollment.add")
    body = await read_object(request, relay)
    agent_id = field_str(body, "agent")
    ttl = field_int(body, "ttl_seconds", ENROLL_TTL_DEFAULT, 30, ENROLL_TTL_MAX)
    agent = await relay.call(relay.store.get_agent, me.workspace, agent_id)
    if agent is None:
        await record(
            relay, me.workspace, actor(me), "enrollment.add", agent_id, False,
            "unknown-agent", f"no agent {agent_id!r} to enroll",
        )  # fmt: skip
        raise ApiError(
            404,
            "not-found",
            f"no agent {agent_id!r} in workspace {me.workspace!r}; add it first "
            f"('mellan agent add {agent_id} --capability …')",
        )
    code = CODE_PREFIX + secrets.token_urlsafe(24)
    now = await relay.call(relay.store.now)
    expires_at = _plus_seconds(now, ttl)
    audit = Record(
        actor(me), "enrollment.add", "owner",
        f"one-time enrollment code for {agent_id}, valid until {expires_at}",
        {"expires_at": expires_at},
    )  # fmt: skip
    await relay.call(
        relay.store.add_enrollment,
        me.workspace,
        agent_id,
        hash_token(code),
        expires_at,
        record=audit,
    )
    return JSON(
        {"code": code, "agent": agent_id, "workspace": me.workspace, "expires_at": expires_at},
        201,
    )


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
    await _owner_only(relay, me, "grant.add")
    body = await read_object(request, relay)
    caller = field_str(body, "caller")
    receiver = field_str(body, "receiver")
    caps = body.get("capabilities")
    if not isinstance(caps, list) or not caps or not all(isinstance(c, str) for c in caps):
        raise _bad("'capabilities' must be a non-empty list of capability ids")
    if len(caps) > MAX_CAPABILITIES or any(len(c) > 128 for c in caps):
        raise _bad(
            f"a grant names at most {MAX_CAPABILITIES} capability ids of at most 128 characters"
        )
    caps = list(dict.fromkeys(caps))
    detail = {"caller": caller, "receiver": receiver, "capabilities": caps}
    caller_agent = await relay.call(relay.store.get_agent, me.workspace, caller)
    receiver_agent = await relay.call(relay.store.get_agent, me.workspace, receiver)
    decision = may_grant(
        workspace=me.workspace,
        caller=caller,
        receiver=receiver,
        capabilities=caps,
        caller_exists=caller_agent is not None,
        receiver_exists=receiver_agent is not None,
        declared={c.id for c in receiver_agent.capabilities} if receiver_agent else set(),
    )
    if not decision:
        await record(
            relay, me.workspace, actor(me), "grant.add", f"{caller} -> {receiver}", False,
            decision.rule, decision.reason, detail,
        )  # fmt: skip
        raise ApiError.of(404 if decision.rule == "unknown-agent" else 400, decision)
    audit = Record(actor(me), "grant.add", decision.rule, decision.reason, detail)
    grant = await relay.call(
        relay.store.add_grant, me.workspace, caller, receiver, caps, record=audit
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

    if _is_owner(me):
        grants = await relay.call(query, caller, receiver)
    else:
        grants = await _as_party(relay, me, caller, receiver, query)
        grants.sort(key=lambda g: (g.created_at, g.id))
    return JSON({"grants": [grant_view(g) for g in grants]})


async def revoke_grant(request: Request) -> Response:
    relay, me = await _who(request)
    await _owner_only(relay, me, "grant.revoke")
    grant_id = request.path_params["grant_id"]
    audit = Record(
        actor(me), "grant.revoke", "owner",
        "grant revoked; new tasks on this route are refused from now on",
    )  # fmt: skip
    revoked = await relay.call(relay.store.revoke_grant, me.workspace, grant_id, record=audit)
    if not revoked:
        await record(
            relay, me.workspace, actor(me), "grant.revoke", grant_id, False, "not-found",
            "no active grant with this id",
        )  # fmt: skip
        raise ApiError(
            404,
            "not-found",
            f"no active grant {grant_id!r} in this workspace (already revoked, or a typo; "
            "see 'mellan grant list')",
        )
    return JSON({"outcome": "ok", "id": grant_id, "revoked": True})


# -- audit ---------------------------------------------------------------------------------------


async def audit(request: Request) -> Response:
    """Audit records after ``after`` (a seq); with ``wait`` > 0, long-poll for new ones."""
    relay, me = await _who(request)
    await _owner_only(relay, me, "audit.read")
    after = query_int(request, "after", 0, 0, 2**62)
    limit = query_int(request, "limit", 100, 1, 1000)
    wait = query_int(request, "wait", 0, 0, 60)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    topic = audit_topic(me.workspace)
    while True:
        records = await relay.call(relay.store.audit_since, me.workspace, after, limit)
        remaining = deadline - loop.time()
        if records or remaining <= 0 or relay.closing or await request.is_disconnected():
            break
        await relay.notifier.wait(topic, min(remaining, relay.poll_interval))
    last = records[-1].seq if records else after
    return JSON({"records": [audit_view(r) for r in records], "next": last})


# -- tasks ---------------------------------------------------------------------------------------


def _may_see(me: Principal, task: Task | None, party: Party = "any") -> bool:
    """The visibility rule every surface shares (:mod:`melchior.policy.visibility`)."""
    if task is None:
        return False
    return may_see_task(viewer_of(me), parties_of(task), party=party).allowed


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
            raise _bad(f"unknown state in {q['state']!r}; states are: {allowed}") from None
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

    if _is_owner(me):
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
    if not _may_see(me, task):
        raise _not_found(f"task {task_id!r}")
    assert task is not None
    events = await relay.call(relay.store.events_after, task_id, 0)
    view = task_view(task)
    view["events"] = [event_view(e) for e in events]
    return JSON(view)


async def cancel_task(request: Request) -> Response:
    """Cancel a queued task at once, or revoke a leased task's lease (the receiver's next
    renew answers lease-lost, reason "cancelled"). Owners, and the task's caller, may."""
    relay, me = await _who(request)
    task_id = request.path_params["task_id"]
    task = await relay.call(relay.store.get_task, me.workspace, task_id)
    if not _may_see(me, task, "caller"):
        raise _not_found(f"task {task_id!r}")
    assert task is not None
    rule = "owner" if _is_owner(me) else "caller"
    after, outcome = await relay.call(
        relay.store.cancel, me.workspace, task_id, actor=actor(me), rule=rule
    )  # audited by the store, allowed or refused, in the cancel's own transaction
    if outcome is Outcome.NOT_FOUND or after is None:
        raise _not_found(f"task {task_id!r}")
    if outcome is Outcome.LEASE_LOST:
        reason = f"the task is already {after.state.value}; only queued or running tasks cancel"
        raise ApiError(409, "not-cancelable", reason, {"outcome": outcome.value})
    if outcome is Outcome.OK:
        relay.notifier.publish(task_topic(task_id))
        relay.notifier.publish(receiver_topic(me.workspace, task.receiver))
    return JSON({"outcome": outcome.value, "task": task_view(after, payload=False)})


# -- credentials ---------------------------------------------------------------------------------


async def revoke_credential(request: Request) -> Response:
    """Revoke a credential at once. Owners may revoke any in their workspace; an agent only
    its own (e.g. a machine being retired)."""
    relay, me = await _who(request)
    credential_id = request.path_params["credential_id"]
    if not _is_owner(me) and credential_id != me.credential_id:
        raise _not_found(f"credential {credential_id!r}")
    audit = Record(
        actor(me), "credential.revoke", "owner" if _is_owner(me) else "self",
        "credential revoked; it is refused from now on",
    )  # fmt: skip
    revoked = await relay.call(
        relay.store.revoke_credential, me.workspace, credential_id, record=audit
    )
    relay.credentials.forget()  # refused at once here (other replicas: within their ttl)
    if not revoked:
        raise ApiError(404, "not-found", f"no live credential {credential_id!r} in this workspace")
    return JSON({"outcome": "ok", "id": credential_id, "revoked": True})


def routes() -> list[BaseRoute]:
    return [
        Route("/whoami", whoami, methods=["GET"]),
        Route("/agents", add_agent, methods=["POST"]),
        Route("/agents", list_agents, methods=["GET"]),
        Route("/agents/{agent_id:path}", get_agent, methods=["GET"]),
        Route("/enrollments", enroll, methods=["POST"]),
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
    ]
