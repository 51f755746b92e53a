"""The door of the relay: who may send what to whom, decided before anything is stored.

Steps 2 and 3 of the seed's task flow. ``decide`` authorizes one send — owner or
agent, same workspace, the message's place in an existing conversation, the
directional grant (``policy.grants.may_invoke``), the hop budget — and audits every
refusal with its precise rule while the caller hears only what it may learn. An allowed
send is stored, with its acceptance record in the same transaction, through the
group-committing batcher; a commit whose outcome the database left unclear is looked up
before the caller is answered.

A new task's session key (tasks sharing one run one at a time, in order) is its A2A
context's, unless the receiver's approved route for the capability is bound to a coding
agent's session: then it is that session's (:func:`melchior.policy.task_routes.session_key`),
so tasks for one session never overlap, whichever context or caller they came from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn

from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.outbound import resolve, vet
from melchior.mellan.relay.store.base import (
    Caps,
    FollowUp,
    NewPush,
    NewTask,
    OverLimit,
    Record,
    Store,
    StoreError,
    StoreUnavailable,
    Task,
    TaskState,
)
from melchior.mellan.relay.surfaces.a2a import hops, jsontext, views
from melchior.mellan.relay.surfaces.a2a.access import Caller
from melchior.mellan.relay.surfaces.a2a.errors import (
    Forbidden,
    HopLimit,
    InvalidParams,
    QuotaExceeded,
    TaskNotFound,
    Unavailable,
    UnsupportedOperation,
)
from melchior.mellan.relay.surfaces.a2a.requests import SendRequest
from melchior.mellan.sealing import is_sealed
from melchior.policy.grants import NOT_GRANTED, chosen_capability, may_invoke, may_send_unsealed
from melchior.policy.outbound import check_url
from melchior.policy.send_limits import RATE, Limits
from melchior.policy.task_routes import session_key

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


def _record_refusal(
    store: Store, caller: Caller, rule: str, reason: str, detail: dict[str, Any]
) -> None:
    """Audit a refused send (a worker-thread call).

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


async def _refuse(
    relay: Relay, caller: Caller, rule: str, reason: str, detail: dict[str, Any]
) -> NoReturn:
    """Audit a refused send, then raise what the caller hears."""
    await relay.call(_record_refusal, relay.store, caller, rule, reason, detail)
    if rule in REFUSED_QUIETLY:
        raise Forbidden(NOT_GRANTED)
    if rule == "ambiguous":  # the caller holds several grants here: it may know that
        raise InvalidParams(reason, violations=[("metadata.capability", "name one")])
    if rule == "hop-limit":
        raise HopLimit(reason, metadata={k: str(v) for k, v in detail.items() if k in HOP_KEYS})
    raise Forbidden(reason)


class Answering(NamedTuple):
    """The task a message answers (``taskId``), and — when that task no longer waits for
    input — the task this very message went to before, if it is a resend."""

    previous: Task
    resent: Task | None


def _answering(store: Store, caller: Caller, req: SendRequest) -> Answering:
    """A worker-thread call: the task named by ``taskId`` as this caller may see it."""
    assert req.task_id is not None
    previous = store.get_task(caller.target.workspace, req.task_id)
    if previous is None or not caller.can_see(previous):
        raise TaskNotFound(metadata={"taskId": req.task_id})
    waits = previous.state is TaskState.INPUT_REQUIRED
    return Answering(previous, None if waits else resend_of(store, caller, req))


async def _encoded(relay: Relay, req: SendRequest) -> tuple[str, str]:
    """The message and metadata as stored: encoded on the event loop when the body was
    small enough to be parsed there, else in a worker thread (:data:`body.INLINE_PARSE`:
    no request runs unbounded work on the loop)."""
    if req.inline:
        return jsontext.dumps(req.message), jsontext.dumps(req.metadata)
    return await relay.call(lambda: (jsontext.dumps(req.message), jsontext.dumps(req.metadata)))


async def decide(relay: Relay, caller: Caller, req: SendRequest) -> NewTask | FollowUp | Task:
    """Authorize one send: a new task, the next turn of a task waiting for input, or — a
    resend of a message already taken, found while refusing it — the task it went to.

    Runs on the event loop: the parties' facts come from :class:`~..facts.DoorFacts`
    (read in a worker thread only when not remembered), so a busy caller's sends are
    decided without a thread or a database read; a turn's task, refusals' audit records
    and big messages go to a worker thread."""
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
        await _refuse(
            relay,
            caller,
            "other-workspace",
            f"credential of {p.workspace} used on {target.workspace}",
            detail,
        )

    context_id = req.context_id
    previous: Task | None = None
    if req.task_id is not None:
        before, resent = await relay.call(_answering, relay.store, caller, req)
        if resent is not None:  # an answer already taken, sent again
            return resent
        if before.state.terminal:
            raise UnsupportedOperation(
                f"task {before.id} is {views.A2A_STATE[before.state]}; it takes no more "
                "messages. Send a new message (same contextId to continue the conversation).",
                metadata={"taskId": before.id},
            )
        if before.state is not TaskState.INPUT_REQUIRED:
            raise UnsupportedOperation(
                f"task {before.id} is still {views.A2A_STATE[before.state]}; wait for it "
                "to finish or ask for input, or cancel it",
                metadata={"taskId": before.id},
            )
        if context_id is not None and context_id != before.context_id:
            raise InvalidParams(
                f"contextId {context_id!r} does not match task {before.id}'s context",
                violations=[("message.contextId", "must match the task's context")],
            )
        context_id = before.context_id
        if capability is None:
            capability = before.capability
        previous = before

    facts = relay.facts
    agent = await facts.agent(relay, target.workspace, target.agent)
    declared = {c.id for c in agent.capabilities} if agent else set()
    granted = (
        await facts.granted(relay, target.workspace, p.subject, target.agent)
        if agent
        else frozenset()
    )
    decision = may_invoke(
        caller=p.subject,
        receiver=target.agent,
        capability=capability,
        receiver_exists=agent is not None,
        declared=declared,
        granted=set(granted),
    )
    if not decision:
        await _refuse(relay, caller, decision.rule, decision.reason, detail)
    capability = chosen_capability(capability, granted & declared)
    if not is_sealed(req.message):  # a sealed send pays nothing here; rules: store/sealed.py
        sealed_only = await relay.call(
            relay.store.sealed_capabilities, target.workspace, p.subject, target.agent
        )
        clear = may_send_unsealed(
            caller=p.subject, receiver=target.agent, capability=capability, sealed_only=sealed_only
        )
        if not clear:
            await _refuse(relay, caller, clear.rule, clear.reason, detail)
    else:
        detail["sealed"] = True

    chain = hops.envelope_of(p.subject, target.agent, req.message, req.metadata).chain
    assert chain is not None  # an A2A message always travels on a chain (hop 1 by default)
    try:
        hops.check(chain)
    except HopLimit as exc:
        await _refuse(relay, caller, "hop-limit", exc.message, {**detail, **chain.as_dict()})

    if req.push is not None:
        allow = await facts.allow_private(relay, target.workspace)
        await vet_push(relay, req.push, "configuration.taskPushNotificationConfig.url", allow)
        detail["push"] = True
    payload, metadata = await _encoded(relay, req)
    detail = {**detail, "capability": capability, "hop": chain.hop}
    if previous is not None:  # the caller answers a task that asked for input
        detail["turn"] = previous.turn + 1
        return FollowUp(
            workspace=target.workspace,
            task_id=previous.id,
            caller=p.subject,
            message_id=req.message["messageId"],
            payload=payload,
            chain=chain.chain,
            hop=chain.hop,
            path=chain.path,
            record=Record(caller.actor, "task.continue", decision.rule, decision.reason, detail),
            push=req.push,
        )
    context_id = context_id or uuid.uuid4().hex
    route = await facts.route(relay, target.workspace, target.agent, capability)
    if route is not None and route.session:  # one bound session: its tasks never overlap
        key = session_key(target.agent, route.session)
        detail["route"] = route.id
    else:
        key = f"a2a-context:{context_id}"
    accepted = Record(caller.actor, "task.accept", decision.rule, decision.reason, detail)
    return NewTask(
        workspace=target.workspace,
        caller=p.subject,
        receiver=target.agent,
        capability=capability,
        payload=payload,
        metadata=metadata,
        context_id=context_id,
        message_id=req.message["messageId"],
        session_key=key,
        chain=chain.chain,
        hop=chain.hop,
        path=chain.path,
        accept=accepted,
        push=req.push,
    )


async def _limits_of(relay: Relay, workspace: str, agent: str) -> Limits:
    stored = relay.limits.remembered(workspace)
    if stored is None:
        stored = await relay.call(relay.limits.overrides, relay.store, workspace)
    return relay.limits.of(stored, agent)


async def within_limits(
    relay: Relay, caller: Caller, req: SendRequest
) -> NewTask | FollowUp | Task:
    """:func:`decide`, then the caller's send rate (refused: audited ``quota.refused``,
    :class:`QuotaExceeded`, nothing stored); a new task leaves with the caps the enqueue
    transaction counts (the caller's unfinished tasks at the receiver, the receiver's
    queue). A resend of a message already taken is answered without a token, even when
    the caller is over its rate."""
    decided = await decide(relay, caller, req)
    if isinstance(decided, Task):
        return decided
    workspace, sender = decided.workspace, caller.principal.subject
    mine = await _limits_of(relay, workspace, sender)
    took = relay.limits.take(workspace, sender, mine)
    if not took.decision:
        # A resend costs nothing (it queues no work): it gets its stored task back whatever
        # the caller's rate, as it is exempt from the caps. Read only when over the rate,
        # so a send within it pays no store read for this.
        resent = await relay.call(resend_of, relay.store, caller, req)
        if resent is not None:
            return resent
        detail = {
            "messageId": req.message.get("messageId"),
            "limit": RATE,
            "send_rate": mine.send_rate,
            "burst": mine.burst,
            "retry_after": took.retry_after,
        }
        subject = f"{caller.target.workspace}/{caller.target.agent}"
        await relay.call(
            relay.store.audit, workspace, caller.actor, "quota.refused", subject, False, RATE,
            took.decision.reason, detail,
        )  # fmt: skip
        raise QuotaExceeded(took.decision.reason, limit=RATE, retry_after=took.retry_after)
    if isinstance(decided, FollowUp):
        return decided
    theirs = await _limits_of(relay, workspace, decided.receiver)
    caps = Caps(mine.max_unfinished_per_receiver, theirs.max_queued)
    return dataclasses.replace(decided, caps=caps)


async def vet_push(relay: Relay, push: NewPush, name: str, allow_private: bool) -> None:
    """Refuse, naming the field and the rule, a URL the workspace may not push to: judged
    now as it will be at each delivery — the URL, then every address its host resolves
    to (:func:`..outbound.vet`, with the deliverer's resolver) — before anything is
    stored, so the caller is never told yes to a push that can never be sent."""
    resolver = relay.pusher.resolver if relay.pusher is not None else resolve
    verdict = await vet(push.url, allow_private=allow_private, resolver=resolver)
    if not verdict.allowed:
        raise InvalidParams(
            f"{name}: {verdict.reason}",
            violations=[(name, verdict.reason)],
            metadata={"rule": verdict.rule},
        )


def check_push(push: NewPush, name: str, allow_private: bool) -> None:
    """The URL alone (no lookup), for a worker-thread call that read the workspace's
    setting itself: :func:`vet_push` ran before with the setting then."""
    verdict = check_url(push.url, allow_private=allow_private)
    if not verdict.allowed:
        raise InvalidParams(
            f"{name}: {verdict.reason}",
            violations=[(name, verdict.reason)],
            metadata={"rule": verdict.rule},
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


def resend_of(store: Store, caller: Caller, req: SendRequest) -> Task | None:
    """The task a message went to when this very message (same caller, same messageId,
    same content) was taken before: a retry returns what the first send got and never
    queues work twice. A messageId reused for something else — other content, another
    taskId or contextId, another agent's URL — is refused naming the difference; nothing
    is stored. None: this messageId is new."""
    mid = req.message["messageId"]
    sent = store.sent_message(caller.target.workspace, caller.principal.subject, mid)
    if sent is None:
        return None
    task = store.get_task(caller.target.workspace, sent.task_id)
    if task is None or not caller.can_see(task):
        raise InvalidParams(
            f"messageId {mid!r} was already used for another task",
            violations=[("message.messageId", "already used for another task")],
        )
    if sent.payload != jsontext.dumps(req.message):
        before = jsontext.loads(sent.payload)
        differs = next(
            (k for k in ("taskId", "contextId") if before.get(k) != req.message.get(k)), None
        )
        what = f"another {differs}" if differs else "other content"
        raise InvalidParams(
            f"messageId {mid!r} was already used, with {what}, for task {task.id}; a retry "
            "must resend the very same message, and a new message needs a new messageId",
            violations=[("message.messageId", f"already used with {what}")],
        )
    return task


class Taken(NamedTuple):
    """What the door took: the task, and whether it was stored just now (then it has no
    events yet and its row is what the store returned — nothing to read back)."""

    task: Task
    fresh: bool


async def accept(
    relay: Relay, caller: Caller, req: SendRequest, listen: Callable[[str], None] | None = None
) -> Taken:
    """The whole door: decide (refusals audited, nothing stored), then store the task and
    its acceptance record in one transaction (group-committed with concurrent accepts) —
    or start the next turn of a task that asked for input. A messageId already taken is a
    resend (the same task back) or a reuse (refused by name).

    ``listen`` is called with the id a new task will have, before it is stored: whoever
    waits for the task's changes starts listening there, so a change committed right
    after the accept's commit wakes it (the task it gets back may be another, for a
    resend: then ``fresh`` is false)."""
    decided = await within_limits(relay, caller, req)
    if isinstance(decided, Task):
        return Taken(decided, False)
    if isinstance(decided, FollowUp):
        went, moved = await relay.call(relay.store.continue_task, decided)
        if moved and went is not None:
            relay.queued(went.workspace, went.receiver)
            return Taken(went, False)  # a turn on: its earlier turns are there to read
        return Taken(await _not_new(relay, caller, req, went), False)
    if listen is not None:
        task_id = str(uuid.uuid4())  # the form the store gives the ids it makes
        decided = dataclasses.replace(decided, id=task_id)
        listen(task_id)
    try:
        stored = await relay.batcher.enqueue(decided)
    except StoreUnavailable as lost:
        if not lost.unclear:
            raise
        stored = await relay.call(settle, relay.store, lost, decided), False
    if isinstance(stored, OverLimit):  # audited in the transaction that stored nothing
        raise QuotaExceeded(stored.reason, limit=stored.limit, retry_after=stored.retry_after)
    task, created = stored
    if created:
        relay.queued(task.workspace, task.receiver)
        return Taken(task, True)
    return Taken(await _not_new(relay, caller, req, task), False)


async def _not_new(relay: Relay, caller: Caller, req: SendRequest, task: Task | None) -> Task:
    """The store took nothing: the messageId was taken before (a resend or a reuse), or
    the task stopped waiting for input meanwhile."""
    resent = await relay.call(resend_of, relay.store, caller, req)
    if resent is not None:
        return resent
    state = views.A2A_STATE[task.state] if task is not None else "gone"
    raise UnsupportedOperation(
        f"task {req.task_id} no longer waits for input (it is {state})",
        metadata={"taskId": str(req.task_id)},
    )
