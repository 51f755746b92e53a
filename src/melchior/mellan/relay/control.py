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

from melchior.mellan.relay.auth import hash_token, new_token
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.http import (
    JSON,
    ApiError,
    actor,
    authenticate,
    endpoint,
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
    """The rows an agent credential may see under a (caller, receiver) filter: those it is
    a party to, as the caller or as the receiver — one rule for grants and tasks alike.
    A filter naming someone else on both sides leaves nothing; each row appears once."""
    routes: list[tuple[str | None, str | None]] = []
    if caller in (None, me.subject):
        routes.append((me.subject, receiver))
    if receiver in (None, me.subject):
        routes.append((caller, me.subject))
    seen: dict[str, _Row] = {}
    for c, r in routes:
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


@endpoint
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


@endpoint
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


@endpoint
async def list_agents(request: Request) -> Response:
    relay, me = await _who(request)
    if _is_owner(me):
        agents = await relay.call(relay.store.list_agents, me.workspace)
    else:
        mine = await relay.call(relay.store.get_agent, me.workspace, me.subject)
        agents = [mine] if mine is not None else []
    return JSON({"agents": [agent_view(a) for a in agents]})


@endpoint
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


@endpoint
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


@endpoint
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


@endpoint
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
    subject = f"{caller} -> {receiver}"

    async def refuse(status: int, code: str, reason: str) -> ApiError:
        await record(
            relay, me.workspace, actor(me), "grant.add", subject, False, code, reason,
            {"caller": caller, "receiver": receiver, "capabilities": caps},
        )  # fmt: skip
        return ApiError(status, code, reason)

    if caller == receiver:
        raise await refuse(
            400, "self", f"{caller!r} cannot be granted capabilities on itself; grants join two "
            "different agents"
        )  # fmt: skip
    caller_agent = await relay.call(relay.store.get_agent, me.workspace, caller)
    if caller_agent is None:
        raise await refuse(
            404, "unknown-agent", f"no calling agent {caller!r} in workspace {me.workspace!r}; "
            f"add it first ('mellan agent add {caller}')"
        )  # fmt: skip
    receiver_agent = await relay.call(relay.store.get_agent, me.workspace, receiver)
    if receiver_agent is None:
        raise await refuse(
            404, "unknown-agent", f"no receiving agent {receiver!r} in workspace "
            f"{me.workspace!r}; add it first ('mellan agent add {receiver} --capability …')"
        )  # fmt: skip
    declared = {c.id for c in receiver_agent.capabilities}
    undeclared = [c for c in caps if c not in declared]
    if undeclared:
        have = ", ".join(sorted(declared)) or "none"
        raise await refuse(
            400, "unknown-capability", f"{receiver} declares no capability "
            f"{', '.join(repr(c) for c in undeclared)} (it declares: {have})"
        )  # fmt: skip
    audit = Record(
        actor(me), "grant.add", "owner",
        f"{caller} may invoke {', '.join(caps)} on {receiver} (this direction only)",
        {"caller": caller, "receiver": receiver, "capabilities": caps},
    )  # fmt: skip
    grant = await relay.call(
        relay.store.add_grant, me.workspace, caller, receiver, caps, record=audit
    )
    return JSON(grant_view(grant), 201)


@endpoint
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


@endpoint
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


@endpoint
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


def _may_see(me: Principal, task: Task | None) -> bool:
    if task is None or task.workspace != me.workspace:
        return False
    return _is_owner(me) or me.subject in (task.caller, task.receiver)


@endpoint
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


@endpoint
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


@endpoint
async def cancel_task(request: Request) -> Response:
    """Cancel a queued task at once, or revoke a leased task's lease (the receiver's next
    renew answers lease-lost, reason "cancelled"). Owners, and the task's caller, may."""
    relay, me = await _who(request)
    task_id = request.path_params["task_id"]
    task = await relay.call(relay.store.get_task, me.workspace, task_id)
    if not _may_see(me, task) or (
        task is not None and not _is_owner(me) and task.caller != me.subject
    ):
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


@endpoint
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
    if not revoked:
        raise ApiError(404, "not-found", f"no live credential {credential_id!r} in this workspace")
    return JSON({"outcome": "ok", "id": credential_id, "revoked": True})


def routes() -> list[BaseRoute]:
    return [
        Route("/api/whoami", whoami, methods=["GET"]),
        Route("/api/agents", add_agent, methods=["POST"]),
        Route("/api/agents", list_agents, methods=["GET"]),
        Route("/api/agents/{agent_id:path}", get_agent, methods=["GET"]),
        Route("/api/enrollments", enroll, methods=["POST"]),
        Route("/api/join", join, methods=["POST"]),
        Route("/api/grants", add_grant, methods=["POST"]),
        Route("/api/grants", list_grants, methods=["GET"]),
        Route("/api/grants/{grant_id}", revoke_grant, methods=["DELETE"]),
        Route("/api/grants/{grant_id}/revoke", revoke_grant, methods=["POST"]),
        Route("/api/audit", audit, methods=["GET"]),
        Route("/api/tasks", list_tasks, methods=["GET"]),
        Route("/api/tasks/{task_id}", get_task, methods=["GET"]),
        Route("/api/tasks/{task_id}/cancel", cancel_task, methods=["POST"]),
        Route("/api/credentials/{credential_id}", revoke_credential, methods=["DELETE"]),
        Route("/api/credentials/{credential_id}/revoke", revoke_credential, methods=["POST"]),
    ]
