"""The door of the relay: who may send what to whom, decided before anything is stored.

Steps 2 and 3 of the seed's task flow. ``decide`` authorizes one send — owner or
agent, same workspace, the message's place in an existing conversation, the
directional grant (``policy.grants.may_invoke``), the hop budget — and audits every
refusal with its precise rule while the caller hears only what it may learn. An allowed
send is stored, with its acceptance record in the same transaction, through the
group-committing batcher; a commit whose outcome the database left unclear is looked up
before the caller is answered.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

from melchior.mellan.relay.a2a import hops, jsontext, views
from melchior.mellan.relay.a2a.access import Caller
from melchior.mellan.relay.a2a.errors import (
    Forbidden,
    HopLimit,
    InvalidParams,
    TaskNotFound,
    Unavailable,
    UnsupportedOperation,
)
from melchior.mellan.relay.a2a.requests import SendRequest
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.store.base import (
    NewTask,
    Record,
    Store,
    StoreError,
    StoreUnavailable,
    Task,
    TaskState,
)
from melchior.policy.grants import NOT_GRANTED, chosen_capability, may_invoke

HOP_KEYS = ("chain", "hop")
REFUSED_QUIETLY = frozenset({"unknown-agent", "unknown-capability", "no-grant", "other-workspace"})
"""Refusal rules whose reason the caller must not learn (it would reveal the inventory)."""


def _capability_from(req: SendRequest) -> str | None:
    for md in (req.metadata, req.message.get("metadata")):
        if isinstance(md, dict) and "capability" in md:
            cap = md["capability"]
            if not isinstance(cap, str) or not cap:
                raise InvalidParams(
                    "metadata.capability must be a non-empty string",
                    violations=[("metadata.capability", "non-empty string")],
                )
            return cap
    return None


def _refuse(store: Store, caller: Caller, rule: str, reason: str, detail: dict[str, Any]) -> None:
    """Audit a refused send, then raise what the caller hears.

    The record goes to the caller's workspace, and also to the target workspace when that
    is another one and the agent exists there (its owners should see who knocked; made-up
    names get no records, so nobody can flood a log by inventing URLs)."""
    subject = f"{caller.target.workspace}/{caller.target.agent}"
    store.audit(
        caller.principal.workspace, caller.actor, "task.refuse", subject, False, rule, reason,
        detail,
    )  # fmt: skip
    if not caller.same_workspace and store.get_agent(caller.target.workspace, caller.target.agent):
        with contextlib.suppress(StoreError):
            store.audit(
                caller.target.workspace,
                f"{caller.principal.workspace}:{caller.actor}",
                "task.refuse", subject, False, rule, reason, detail,
            )  # fmt: skip
    if rule in REFUSED_QUIETLY:
        raise Forbidden(NOT_GRANTED)
    if rule == "ambiguous":  # the caller holds several grants here: it may know that
        raise InvalidParams(reason, violations=[("metadata.capability", "name one")])
    if rule == "hop-limit":
        raise HopLimit(reason, metadata={k: str(v) for k, v in detail.items() if k in HOP_KEYS})
    raise Forbidden(reason)


def decide(store: Store, caller: Caller, req: SendRequest) -> NewTask:
    """Authorize one send (a worker-thread call: every read, and the audit of a refusal)."""
    p, target = caller.principal, caller.target
    detail: dict[str, Any] = {"messageId": req.message.get("messageId")}
    capability = _capability_from(req)
    if capability is not None:
        detail["capability"] = capability
    if caller.is_owner:
        raise Forbidden(
            "owner credentials act for the workspace, not as an agent; "
            "send with the calling agent's credential"
        )
    if not caller.same_workspace:
        _refuse(
            store,
            caller,
            "other-workspace",
            f"credential of {p.workspace} used on {target.workspace}",
            detail,
        )

    context_id = req.context_id
    previous: Task | None = None
    if req.task_id is not None:
        previous = store.get_task(target.workspace, req.task_id)
        if previous is None or not caller.can_see(previous):
            raise TaskNotFound(metadata={"taskId": req.task_id})
        if previous.state.terminal:
            raise UnsupportedOperation(
                f"task {previous.id} is {views.A2A_STATE[previous.state]}; it takes no more "
                "messages. Send a new message (same contextId to continue the conversation).",
                metadata={"taskId": previous.id},
            )
        if previous.state is not TaskState.INPUT_REQUIRED:
            raise UnsupportedOperation(
                f"task {previous.id} is still {views.A2A_STATE[previous.state]}; wait for it "
                "to finish or ask for input, or cancel it",
                metadata={"taskId": previous.id},
            )
        if context_id is not None and context_id != previous.context_id:
            raise InvalidParams(
                f"contextId {context_id!r} does not match task {previous.id}'s context",
                violations=[("message.contextId", "must match the task's context")],
            )
        context_id = previous.context_id
        if capability is None:
            capability = previous.capability

    agent = store.get_agent(target.workspace, target.agent)
    declared = {c.id for c in agent.capabilities} if agent else set()
    granted = (
        store.granted_capabilities(target.workspace, p.subject, target.agent) if agent else set()
    )
    decision = may_invoke(
        caller=p.subject,
        receiver=target.agent,
        capability=capability,
        receiver_exists=agent is not None,
        declared=declared,
        granted=granted,
    )
    if not decision:
        _refuse(store, caller, decision.rule, decision.reason, detail)
    capability = chosen_capability(capability, granted & declared)

    chain = hops.envelope_of(p.subject, target.agent, req.message, req.metadata).chain
    assert chain is not None  # an A2A message always travels on a chain (hop 1 by default)
    try:
        hops.check(chain)
    except HopLimit as exc:
        _refuse(store, caller, "hop-limit", exc.message, {**detail, **chain.as_dict()})

    context_id = context_id or uuid.uuid4().hex
    accepted = Record(
        caller.actor,
        "task.accept",
        decision.rule,
        decision.reason,
        {**detail, "capability": capability, "hop": chain.hop},
    )
    return NewTask(
        workspace=target.workspace,
        caller=p.subject,
        receiver=target.agent,
        capability=capability,
        payload=jsontext.dumps(req.message),
        metadata=jsontext.dumps(req.metadata),
        context_id=context_id,
        message_id=req.message["messageId"],
        session_key=f"a2a-context:{context_id}",
        chain=chain.chain,
        hop=chain.hop,
        path=chain.path,
        accept=accepted,
    )


def settle(store: Store, lost: StoreUnavailable, new: NewTask) -> Task:
    """After an unclear commit, find out what happened before answering: the caller's
    answer must be true. Once the server has decided the lost transaction, a read by
    messageId tells; if it cannot be known yet, say exactly that (a resend is safe)."""
    if not store.settle(lost):
        raise Unavailable(
            "the relay lost its database while storing this task, so whether it was stored "
            "is not known yet; send the same request again (same messageId) once the relay "
            "is healthy: a resend never queues the work twice"
        ) from lost
    assert new.message_id is not None
    found = store.task_by_message(new.workspace, new.caller, new.message_id)
    if found is None:
        raise Unavailable() from lost  # now known: nothing was stored
    return found


def check_reuse(caller: Caller, new: NewTask, task: Task, created: bool) -> Task:
    """A messageId already used by this caller for a task it cannot see here (another
    agent's URL) is refused; a resend of the same request returns its task."""
    if not created and (task.receiver != caller.target.agent or not caller.can_see(task)):
        raise InvalidParams(
            f"messageId {new.message_id!r} was already used for another task",
            violations=[("message.messageId", "already used")],
        )
    return task


async def accept(relay: Relay, caller: Caller, req: SendRequest) -> Task:
    """The whole door: decide (refusals audited, nothing stored), then store the task and
    its acceptance record in one transaction (group-committed with concurrent accepts)."""
    new = await relay.call(decide, relay.store, caller, req)
    try:
        task, created = await relay.batcher.enqueue(new)
    except StoreUnavailable as lost:
        if not lost.unclear:
            raise
        task, created = await relay.call(settle, relay.store, lost, new), False
    return check_reuse(caller, new, task, created)
