"""The control plane's changes, written once for every door onto them.

The control API (JSON, :mod:`.control`) and the dashboard (forms, :mod:`.dashboard`) read
their inputs each in their own way, then call these: the same validation, the same policy
decisions (:func:`melchior.policy.grants.may_grant`, :mod:`melchior.policy.visibility`),
the same audit records written in the transaction of the change (``record=``), and the
same refusals — an :class:`~melchior.mellan.relay.refusals.ApiError` naming its rule, which
each door renders its own way (a JSON error body, a message on the page).
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from melchior.mellan.ids import AGENT_ID, CAPABILITY_ID
from melchior.mellan.relay.auth import hash_token, parties_of, viewer_of
from melchior.mellan.relay.caches.limits import WORKSPACE_DEFAULTS
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.notify import receiver_topic, task_topic
from melchior.mellan.relay.store.base import (
    Agent,
    AgentKey,
    Capability,
    Conflict,
    CredentialKind,
    Grant,
    NotFoundError,
    Outcome,
    Principal,
    Record,
    Task,
)
from melchior.mellan.relay.surfaces.http import ApiError, actor, record, require_owner
from melchior.mellan.sealing import PRIVATE_PREFIX, PublicKey
from melchior.policy.grants import may_grant
from melchior.policy.send_limits import Overrides, check_value, effective
from melchior.policy.visibility import Party, may_see_task

ENROLL_TTL_DEFAULT = 15 * 60
ENROLL_TTL_MAX = 7 * 24 * 3600
CODE_PREFIX = "mlj_"
MAX_DESCRIPTION = 2000
"""Longest agent or capability description (characters); limits are in docs/mellan.md."""
MAX_CAPABILITIES = 256
"""Most capabilities one agent declares, or one grant names."""


def is_owner(p: Principal) -> bool:
    return p.kind is CredentialKind.OWNER


def bad(reason: str, code: str = "bad-request") -> ApiError:
    return ApiError(400, code, reason)


def not_found(what: str) -> ApiError:
    return ApiError(404, "not-found", f"no {what} visible to this credential")


async def owner_only(relay: Relay, me: Principal, action: str) -> None:
    """Refuse a non-owner, and record the refusal: an agent reaching for owner powers is a
    decision worth an audit line."""
    if is_owner(me):
        return
    await record(
        relay, me.workspace, actor(me), action, me.subject, False, "owner-only",
        "an agent credential asked for an owner-only operation",
    )  # fmt: skip
    require_owner(me)


def may_see(me: Principal, task: Task | None, party: Party = "any") -> bool:
    """The visibility rule every surface shares (:mod:`melchior.policy.visibility`)."""
    if task is None:
        return False
    return may_see_task(viewer_of(me), parties_of(task), party=party).allowed


# -- agents --------------------------------------------------------------------------------------


def capabilities(raw: Any) -> list[Capability]:
    """Declared capabilities from ids or ``{id, description}`` objects, each checked."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise bad("'capabilities' must be a list of ids or {id, description} objects")
    if len(raw) > MAX_CAPABILITIES:
        raise bad(f"an agent declares at most {MAX_CAPABILITIES} capabilities")
    out: dict[str, Capability] = {}
    for item in raw:
        if isinstance(item, str):
            cap = Capability(item)
        elif isinstance(item, dict) and isinstance(item.get("id"), str):
            desc = item.get("description", "")
            if not isinstance(desc, str):
                raise bad("a capability's description must be a string")
            if len(desc) > MAX_DESCRIPTION:
                raise bad(f"a capability's description is longer than {MAX_DESCRIPTION} characters")
            cap = Capability(item["id"], desc)
        else:
            raise bad("each capability must be an id string or an {id, description} object")
        if not CAPABILITY_ID.match(cap.id):
            raise bad(
                f"capability id {cap.id!r} is not valid: use letters, digits and . _ : / - "
                "(at most 128), e.g. 'incident.inspect'"
            )
        if cap.id in out:
            raise bad(f"capability {cap.id!r} is listed twice")
        out[cap.id] = cap
    return list(out.values())


async def add_agent(
    relay: Relay, me: Principal, agent_id: str, description: str, declared: Any
) -> Agent:
    """Add an agent with its declared capabilities (raw, as :func:`capabilities` reads)."""
    await owner_only(relay, me, "agent.add")
    if len(description) > MAX_DESCRIPTION:
        raise bad(f"field 'description' is longer than {MAX_DESCRIPTION} characters")
    if not AGENT_ID.match(agent_id):
        raise bad(
            f"agent id {agent_id!r} is not valid: one to four '/'-separated parts of letters, "
            "digits and . _ - (e.g. 'local/codex', 'private/ops')"
        )
    caps = capabilities(declared)
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
        return await relay.call(
            relay.store.add_agent, me.workspace, agent_id, description, caps, record=audit
        )
    except Conflict:
        raise conflict from None


# -- enrollment ----------------------------------------------------------------------------------


class Code(NamedTuple):
    """A freshly minted enrollment code: shown once, stored only as its hash."""

    code: str
    agent: str
    workspace: str
    expires_at: str


def plus_seconds(iso_now: str, seconds: int) -> str:
    """``iso_now`` (the database clock) plus ``seconds``, in the store's own ISO form."""
    dt = datetime.fromisoformat(iso_now.replace("Z", "+00:00")) + timedelta(seconds=seconds)
    text = dt.isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z") if iso_now.endswith("Z") else text


async def enroll(relay: Relay, me: Principal, agent_id: str, ttl: int) -> Code:
    """Mint a one-time, expiring enrollment code for an agent; shown once, stored hashed."""
    await owner_only(relay, me, "enrollment.add")
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
    expires_at = plus_seconds(now, ttl)
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
    return Code(code, agent_id, me.workspace, expires_at)


async def revoke_enrollment(relay: Relay, me: Principal, enrollment_id: str) -> None:
    """Make a pending enrollment code unusable at once (it was never redeemed)."""
    await owner_only(relay, me, "enrollment.revoke")
    audit = Record(
        actor(me), "enrollment.revoke", "owner",
        "enrollment code revoked before it was used; it is refused from now on",
        {"enrollment": enrollment_id},
    )  # fmt: skip
    if not await relay.call(
        relay.store.revoke_enrollment, me.workspace, enrollment_id, record=audit
    ):
        raise ApiError(
            404,
            "not-found",
            f"no pending enrollment code {enrollment_id!r} in this workspace (already used, "
            "expired or revoked)",
        )


# -- grants --------------------------------------------------------------------------------------


async def add_grant(
    relay: Relay, me: Principal, caller: str, receiver: str, caps: Any, *, sealed: bool = False
) -> Grant:
    """Let ``caller`` invoke ``caps`` on ``receiver``, this direction only, as
    :func:`melchior.policy.grants.may_grant` decides; refusals are audited. ``sealed``:
    every send on it must be sealed (refused at the door otherwise)."""
    await owner_only(relay, me, "grant.add")
    if not isinstance(caps, list) or not caps or not all(isinstance(c, str) for c in caps):
        raise bad("'capabilities' must be a non-empty list of capability ids")
    if len(caps) > MAX_CAPABILITIES or any(len(c) > 128 for c in caps):
        raise bad(
            f"a grant names at most {MAX_CAPABILITIES} capability ids of at most 128 characters"
        )
    caps = list(dict.fromkeys(caps))
    detail = {"caller": caller, "receiver": receiver, "capabilities": caps, "sealed": sealed}
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
    try:
        return await relay.call(
            relay.store.add_grant, me.workspace, caller, receiver, caps, record=audit,
            sealed=sealed,
        )  # fmt: skip
    finally:
        relay.facts.forget()  # the door sees it at once here (other replicas: within 2 s)


async def revoke_grant(relay: Relay, me: Principal, grant_id: str) -> None:
    await owner_only(relay, me, "grant.revoke")
    audit = Record(
        actor(me), "grant.revoke", "owner",
        "grant revoked; new tasks on this route are refused from now on",
    )  # fmt: skip
    try:
        revoked = await relay.call(relay.store.revoke_grant, me.workspace, grant_id, record=audit)
    finally:
        relay.facts.forget()  # refused at once here (other replicas: within 2 s)
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


# -- tasks ---------------------------------------------------------------------------------------


async def cancel_task(relay: Relay, me: Principal, task_id: str) -> tuple[Task, Outcome]:
    """Cancel a queued task at once, or revoke a leased task's lease (the receiver's next
    renew answers lease-lost, reason "cancelled"). Owners, and the task's caller, may."""
    task = await relay.call(relay.store.get_task, me.workspace, task_id)
    if not may_see(me, task, "caller"):
        raise not_found(f"task {task_id!r}")
    assert task is not None
    rule = "owner" if is_owner(me) else "caller"
    after, outcome = await relay.call(
        relay.store.cancel, me.workspace, task_id, actor=actor(me), rule=rule
    )  # audited by the store, allowed or refused, in the cancel's own transaction
    if outcome is Outcome.NOT_FOUND or after is None:
        raise not_found(f"task {task_id!r}")
    if outcome is Outcome.LEASE_LOST:
        reason = f"the task is already {after.state.value}; only queued or running tasks cancel"
        raise ApiError(409, "not-cancelable", reason, {"outcome": outcome.value})
    if outcome is Outcome.OK:
        relay.notifier.publish(task_topic(task_id))
        relay.notifier.publish(receiver_topic(me.workspace, task.receiver))
    return after, outcome


# -- credentials ---------------------------------------------------------------------------------


async def revoke_credential(relay: Relay, me: Principal, credential_id: str) -> None:
    """Revoke a credential at once. Owners may revoke any in their workspace; an agent only
    its own (e.g. a machine being retired). A revoked owner credential also ends the
    dashboard sessions it signed in."""
    if not is_owner(me) and credential_id != me.credential_id:
        raise not_found(f"credential {credential_id!r}")
    audit = Record(
        actor(me), "credential.revoke", "owner" if is_owner(me) else "self",
        "credential revoked; it is refused from now on",
    )  # fmt: skip
    revoked = await relay.call(
        relay.store.revoke_credential, me.workspace, credential_id, record=audit
    )
    relay.credentials.forget()  # refused at once here (other replicas: within their ttl)
    if not revoked:
        raise ApiError(404, "not-found", f"no live credential {credential_id!r} in this workspace")


# -- push notifications --------------------------------------------------------------------------


async def push_secret(relay: Relay, me: Principal, agent: str | None, rotate: bool) -> str:
    """The secret an agent's push deliveries are signed with (its webhooks verify with it):
    an agent reads or rotates its own, an owner any agent's. Rotating is audited; the old
    secret stops signing at once."""
    subject = agent or me.subject
    if is_owner(me):
        if agent is None:
            raise bad("name the agent whose push secret you want (field 'agent')")
    elif subject != me.subject:
        raise not_found(f"agent {subject!r}")
    audit = Record(
        actor(me), "push.rotate_secret", "owner" if is_owner(me) else "self",
        "the push signing secret was replaced; deliveries are signed with the new one",
    )  # fmt: skip
    secret = await relay.call(
        relay.store.push_secret, me.workspace, subject, rotate=rotate, record=audit
    )
    if secret is None:
        raise not_found(f"agent {subject!r}")
    return secret


async def set_push_private(relay: Relay, me: Principal, allowed: bool) -> None:
    """Owner only: may this workspace's push deliveries go to loopback, link-local and
    private addresses (:mod:`melchior.policy.outbound`)? Audited."""
    await owner_only(relay, me, "push.settings")
    why = "push deliveries may reach private addresses" if allowed else "public addresses only"
    audit = Record(actor(me), "push.settings", "owner", why, {"allow_private": allowed})
    try:
        await relay.call(relay.store.set_push_allow_private, me.workspace, allowed, record=audit)
    finally:
        relay.facts.forget()


# -- send limits ---------------------------------------------------------------------------------


def limits_view(relay: Relay, stored: dict[str, Overrides], agent: str) -> dict[str, Any]:
    """An agent's limits (or with ``'*'`` the workspace defaults): what is stored for it,
    the workspace defaults, the relay's built-in defaults, and what is in force."""
    none = Overrides()
    workspace = stored.get(WORKSPACE_DEFAULTS, none)
    own = stored.get(agent, none) if agent != WORKSPACE_DEFAULTS else none
    return {
        "agent": agent,
        "stored": stored.get(agent, none)._asdict(),
        "workspace_defaults": workspace._asdict(),
        "relay_defaults": relay.limits.base._asdict(),
        "effective": effective(workspace, own, relay.limits.base)._asdict(),
    }


async def set_limits(
    relay: Relay, me: Principal, agent: str, values: Overrides, *, reset: bool
) -> dict[str, Any]:
    """Owner only: change an agent's send limits (``'*'``: the workspace defaults), each
    value checked by :func:`melchior.policy.send_limits.check_value`; audited
    (``limits.set``) in the change's transaction."""
    await owner_only(relay, me, "limits.set")
    if agent != WORKSPACE_DEFAULTS and not AGENT_ID.match(agent):
        raise bad(f"agent id {agent!r} is not valid (or '*' for the workspace defaults)")
    given = {k: v for k, v in values._asdict().items() if v is not None}
    try:
        checked = Overrides(**{k: check_value(k, v) for k, v in given.items()})  # type: ignore[arg-type]
    except ValueError as exc:
        raise bad(str(exc)) from None
    who = "the workspace defaults" if agent == WORKSPACE_DEFAULTS else f"{agent}'s limits"
    what = ", ".join(f"{k}={v:g}" for k, v in given.items()) or "nothing"
    audit = Record(
        actor(me), "limits.set", "owner",
        f"{who}: {'reset, then ' if reset else ''}set {what}",
        {"reset": reset, **given},
    )  # fmt: skip
    try:
        await relay.call(
            relay.store.set_limits, me.workspace, agent, checked, reset=reset, record=audit
        )
    except NotFoundError:
        raise not_found(f"agent {agent!r}") from None
    relay.limits.forget(me.workspace)
    stored = await relay.call(relay.store.limit_overrides, me.workspace)
    return limits_view(relay, stored, agent)


# -- agents' public keys (sealed tasks) ----------------------------------------------------------


async def set_agent_key(relay: Relay, me: Principal, agent: str, text: object) -> dict[str, Any]:
    """Register an agent's public key: only the agent itself, with its own credential (the
    key pair is made on its machine; an owner cannot bind a key it holds to an agent). The
    text must be a public key (never a private one: refused with the reason). Audited when
    the fingerprint changes, so every key a caller's pin would refuse is on the record."""
    if is_owner(me) or agent != me.subject:
        raise ApiError(
            403, "forbidden", "an agent's key is registered by the agent itself ('mellan join')"
        )
    if isinstance(text, str) and text.startswith(PRIVATE_PREFIX):
        raise bad("that is a private key; send only the public half (it never leaves the agent)")
    try:
        key = PublicKey.parse(text)
    except ValueError as exc:
        raise bad(f"public_key: {exc}") from None
    audit = Record(
        actor(me), "agent.key", "self", "the agent registered its public key",
        {"fingerprint": key.fingerprint}, subject=agent,
    )  # fmt: skip
    try:
        stored, changed = await relay.call(
            relay.store.set_agent_key, me.workspace, agent, key.text(), key.fingerprint,
            record=audit,
        )  # fmt: skip
    except NotFoundError:
        raise not_found(f"agent {agent!r}") from None
    return key_view(stored) | {"changed": changed}


async def agent_key(relay: Relay, me: Principal, agent: str) -> dict[str, Any]:
    """An agent's public key, for the owner, the agent itself, or an agent on either side of
    a grant with it (a caller seals to it; a receiver checks the caller's signature and
    seals the result back). Others are answered as for an unknown agent."""
    if not is_owner(me) and agent != me.subject:
        grants = await relay.call(
            relay.store.list_grants, me.workspace, caller=me.subject, receiver=agent
        )
        if not grants:
            grants = await relay.call(
                relay.store.list_grants, me.workspace, caller=agent, receiver=me.subject
            )
        if not grants:
            raise not_found(f"agent {agent!r}")
    stored = await relay.call(relay.store.agent_key, me.workspace, agent)
    if stored is None:
        raise ApiError(
            404, "no-key", f"agent {agent!r} has registered no key; it cannot receive sealed tasks"
        )
    return key_view(stored)


def key_view(key: AgentKey) -> dict[str, Any]:
    return {
        "agent": key.agent,
        "public_key": key.public_key,
        "fingerprint": key.fingerprint,
        "registered_at": key.registered_at,
    }
