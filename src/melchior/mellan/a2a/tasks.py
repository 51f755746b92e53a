"""The A2A operations on tasks, once, for both bindings.

Sending follows the seed's task flow: the caller is authenticated (``access``), the
directional grant is checked and a refusal is audited and answered before anything is
stored, the hop budget is checked, the task is persisted (``enqueue``, which also
dedupes a repeated ``messageId``), and its state is exposed. The receiver claims it
whenever it is online; until then it stays queued. Blocking sends and streams watch the
task through stored state and stored events, so any replica can serve them and a
reconnecting client loses nothing.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from melchior.mellan.a2a import batch, hops, jsontext, views
from melchior.mellan.a2a.access import Caller
from melchior.mellan.a2a.errors import (
    Forbidden,
    HopLimit,
    InvalidParams,
    TaskNotCancelable,
    TaskNotFound,
    UnsupportedOperation,
)
from melchior.mellan.a2a.requests import ListRequest, SendRequest
from melchior.mellan.a2a.timefmt import parse_ts
from melchior.mellan.a2a.watch import Waker
from melchior.mellan.notify import task_topic
from melchior.mellan.relay import Relay
from melchior.mellan.store.base import (
    NewTask,
    Outcome,
    Store,
    StoreError,
    Task,
    TaskEvent,
    TaskState,
)
from melchior.policy.grants import NOT_GRANTED, chosen_capability, may_invoke

MAX_BLOCK_SECONDS = 600.0
"""A blocking SendMessage returns the task as it is after this long, so a destination
that stays offline cannot hold a connection forever; the caller then polls or
subscribes. Documented in docs/a2a.md."""

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


def decide(store: Store, caller: Caller, req: SendRequest) -> Accepted:
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

    chain = hops.chain_of(p.subject, req.message.get("metadata"), req.metadata)
    try:
        hops.check(chain)
    except HopLimit as exc:
        _refuse(store, caller, "hop-limit", exc.message, {**detail, **chain.as_dict()})

    context_id = context_id or uuid.uuid4().hex
    new = NewTask(
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
    )
    audit = (decision.rule, decision.reason, {**detail, "capability": capability, "hop": chain.hop})
    return Accepted(new, *audit)


@dataclass(frozen=True)
class Accepted:
    """A send the policy allowed: the task to store and the decision to record."""

    task: NewTask
    rule: str
    reason: str
    detail: dict[str, Any]


def record(store: Store, caller: Caller, accepted: Accepted, task: Task, created: bool) -> Task:
    """After the (batched) enqueue: refuse a reused messageId, audit a new acceptance."""
    if not created and (task.receiver != caller.target.agent or not caller.can_see(task)):
        raise InvalidParams(
            f"messageId {accepted.task.message_id!r} was already used for another task",
            violations=[("message.messageId", "already used")],
        )
    if created:
        store.audit(
            task.workspace, caller.actor, "task.accept", task.id, True, accepted.rule,
            accepted.reason, accepted.detail,
        )  # fmt: skip
    return task


async def accept(relay: Relay, caller: Caller, req: SendRequest) -> Task:
    """The whole door: decide (refusals audited, nothing stored), store (group-committed
    with concurrent accepts), record the acceptance."""
    accepted = await relay.call(decide, relay.store, caller, req)
    task, created = await batch.batcher(relay).enqueue(accepted.task)
    return await relay.call(record, relay.store, caller, accepted, task, created)


def _read(
    store: Store, workspace: str, task_id: str, after: int
) -> tuple[Task | None, list[TaskEvent]]:
    """The task row first, then its events: every event written before the row's state
    is then included, so a terminal row never hides an event that preceded it."""
    task = store.get_task(workspace, task_id)
    if task is None:
        return None, []
    return task, store.events_after(task_id, after)


async def get_visible(relay: Relay, caller: Caller, task_id: str) -> tuple[Task, list[TaskEvent]]:
    task, events = await relay.call(_read, relay.store, caller.target.workspace, task_id, 0)
    return caller.visible(task, task_id), events


async def send_blocking(
    relay: Relay,
    caller: Caller,
    req: SendRequest,
    disconnected: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    task = await accept(relay, caller, req)
    if req.return_immediately:
        return views.task_view(task, history_length=req.history_length)
    deadline = time.monotonic() + MAX_BLOCK_SECONDS
    waker = Waker(relay.notifier, task_topic(task.id), relay.poll_interval)
    try:
        while True:
            await waker.arm()
            current, events = await relay.call(_read, relay.store, task.workspace, task.id, 0)
            if current is None:  # vanished (retention); report what was accepted
                return views.task_view(task, history_length=req.history_length)
            if views.ends_stream(current.state) or time.monotonic() >= deadline:
                return views.task_view(current, events, history_length=req.history_length)
            if disconnected is not None and await disconnected():
                return views.task_view(current, events, history_length=req.history_length)
            await waker.wait()
    finally:
        waker.close()


async def follow(
    relay: Relay, task: Task, *, history_length: int | None = None
) -> AsyncIterator[dict[str, Any]]:
    """``StreamResponse`` objects for one task: the Task snapshot first, then stored events
    and state changes as they happen, ending after a terminal or interrupted state."""
    waker = Waker(relay.notifier, task_topic(task.id), relay.poll_interval)
    try:
        await waker.arm()
        current, events = await relay.call(_read, relay.store, task.workspace, task.id, 0)
        if current is None:
            return
        yield {"task": views.task_view(current, events, history_length=history_length)}
        last_seq = max((e.seq for e in events), default=0)
        seen_artifacts = {a["artifactId"] for a in views.artifacts_of(current, events)}
        last_state = current.state
        while not views.ends_stream(last_state):
            await waker.wait()
            await waker.arm()
            current, fresh = await relay.call(_read, relay.store, task.workspace, task.id, last_seq)
            if current is None:
                return
            for update in views.event_updates(current, fresh):
                if "artifactUpdate" in update:
                    seen_artifacts.add(update["artifactUpdate"]["artifact"]["artifactId"])
                yield update
            if fresh:
                last_seq = fresh[-1].seq
            if current.state is not last_state:
                if current.state in (TaskState.SUCCEEDED, TaskState.INPUT_REQUIRED):
                    for art in views.artifacts_of(current, ()):
                        if art["artifactId"] not in seen_artifacts:
                            seen_artifacts.add(art["artifactId"])
                            yield {
                                "artifactUpdate": {
                                    "taskId": current.id,
                                    "contextId": current.context_id,
                                    "artifact": art,
                                    "lastChunk": True,
                                }
                            }
                yield views.status_update(current, fresh)
                last_state = current.state
    finally:
        waker.close()


async def send_streaming(
    relay: Relay, caller: Caller, req: SendRequest
) -> AsyncIterator[dict[str, Any]]:
    """Accept first (errors surface before the stream opens), then follow the task."""
    task = await accept(relay, caller, req)
    return follow(relay, task, history_length=req.history_length)


async def subscribe(relay: Relay, caller: Caller, task_id: str) -> AsyncIterator[dict[str, Any]]:
    task, _ = await get_visible(relay, caller, task_id)
    if task.state.terminal:
        raise UnsupportedOperation(
            f"task {task.id} is {views.A2A_STATE[task.state]}; there is nothing left to "
            "subscribe to. Use GetTask.",
            metadata={"taskId": task.id},
        )
    return follow(relay, task)


async def get(
    relay: Relay, caller: Caller, task_id: str, history_length: int | None
) -> dict[str, Any]:
    task, events = await get_visible(relay, caller, task_id)
    return views.task_view(task, events, history_length=history_length)


def _cancel(store: Store, caller: Caller, task_id: str) -> tuple[Task, list[TaskEvent]]:
    task = caller.visible(store.get_task(caller.target.workspace, task_id), task_id)
    after, outcome = store.cancel(task.workspace, task.id)
    if outcome is Outcome.NOT_FOUND or after is None:
        raise TaskNotFound(metadata={"taskId": task_id})
    if outcome is Outcome.LEASE_LOST:
        raise TaskNotCancelable(
            f"task {task_id} is already {views.A2A_STATE[after.state]}",
            metadata={"taskId": task_id, "state": views.A2A_STATE[after.state]},
        )
    store.audit(
        task.workspace,
        caller.actor,
        "task.cancel",
        task.id,
        True,
        "caller",
        f"cancelled by {caller.actor}",
    )
    return after, store.events_after(task.id, 0)


async def cancel(relay: Relay, caller: Caller, task_id: str) -> dict[str, Any]:
    task, events = await relay.call(_cancel, relay.store, caller, task_id)
    return views.task_view(task, events)


def _page(store: Store, caller: Caller, req: ListRequest) -> tuple[list[Task], str, int]:
    target = caller.target
    who = None if caller.is_owner else caller.principal.subject
    states: Sequence[TaskState] | None = None
    if req.status is not None:
        states = views.QUEUE_STATES[req.status]
        if not states:
            return [], "", 0
    if not caller.same_workspace:
        return [], "", 0
    if req.page_token is not None:
        anchor = store.get_task(target.workspace, req.page_token)
        if anchor is None or not caller.can_see(anchor):
            raise InvalidParams(
                "pageToken is not valid here", violations=[("pageToken", "unknown")]
            )
    cutoff = parse_ts(req.status_timestamp_after) if req.status_timestamp_after else None

    def fetch(after: str | None, limit: int) -> list[Task]:
        rows = store.list_tasks(
            target.workspace,
            caller=who,
            receiver=target.agent,
            context_id=req.context_id,
            states=states,
            after=after,
            limit=limit,
        )
        if cutoff is not None:
            rows = [t for t in rows if parse_ts(t.updated_at) > cutoff]
        return rows

    rows = fetch(req.page_token, req.page_size + 1)
    page, more = rows[: req.page_size], len(rows) > req.page_size
    total, cursor = 0, None
    while True:  # totalSize: count the caller's matching tasks, in pages of the store's size
        batch = store.list_tasks(
            target.workspace,
            caller=who,
            receiver=target.agent,
            context_id=req.context_id,
            states=states,
            after=cursor,
            limit=500,
        )
        if cutoff is not None:
            total += sum(1 for t in batch if parse_ts(t.updated_at) > cutoff)
        else:
            total += len(batch)
        if len(batch) < 500:
            break
        cursor = batch[-1].id
    return page, (page[-1].id if more and page else ""), total


async def list_tasks(relay: Relay, caller: Caller, req: ListRequest) -> dict[str, Any]:
    page, token, total = await relay.call(_page, relay.store, caller, req)
    hist = 0 if req.history_length is None else req.history_length
    tasks = []
    for task in page:
        events: list[TaskEvent] = []
        if hist or req.include_artifacts:
            events = await relay.call(relay.store.events_after, task.id, 0)
        tasks.append(
            views.task_view(
                task, events, history_length=hist, include_artifacts=req.include_artifacts
            )
        )
    return {"tasks": tasks, "nextPageToken": token, "pageSize": req.page_size, "totalSize": total}
