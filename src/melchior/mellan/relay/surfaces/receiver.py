"""The receiver-facing API: how the service beside a destination agent takes and reports work.

Authenticated by an *agent* credential (from ``mellan join``) and limited to tasks whose
receiver is that agent; a task of another agent answers exactly like an unknown one.
Every write after a claim is fenced by the lease ``epoch`` the claim returned, so a
receiver that lost its lease (expired and reclaimed, or cancelled) cannot renew, report
or complete someone else's attempt; it gets ``409 {"outcome": "lease-lost"}`` with the
reason, and the refusal is audited.

Audit records of claims, completions, fails, cancel-acks and refusals are written by the
store in the same transaction as the queue change (``actor=``): a claim batch of ten is
one commit, not eleven, and a database lost mid-request leaves neither a claim without
its record nor a record without its claim.

Routes: each lease carries the route the owner approved for its task's capability at
claim time (:mod:`melchior.mellan.relay.surfaces.route_changes`), read in the claim's transaction,
or
``null`` when there is none; a receiver then fails the task non-retryably, saying no
route is approved (it never guesses how to run work). A receiver still checks a route
against its own local allow-list of adapters and directories before running it.

Presence: the claim is the receiver's heartbeat (renewals count too), stored at most
every few seconds per agent (:mod:`melchior.mellan.relay.caches.presence`), with what the
optional ``receiver`` object says; ``GET /api/agents`` shows it online or not. A receiver
whose slots are all busy and so does not claim still renews its leases (every TTL/3),
which keeps it online.

Contract (``melchior.mellan.client.receiver`` is the typed client for it)::

    POST /api/receiver/claim            {"limit":1,"wait":25,"lease_seconds":30,"worker":"…"?,
                                         "receiver":{"name","version","adapters":[…],
                                                     "running":N,"concurrency":N}?}
         → 200 {"leases":[{"task":{…,"payload":<stored request, verbatim>},
                           "epoch":N,"expires_at":"…",
                           "route":{"id","capability","adapter","session","cwd",
                                    "profile","options"} | null}],
                "waited":S}   (with leases: seconds the claim was held before they were taken)
    POST /api/receiver/tasks/{id}/renew     {"epoch":N,"lease_seconds":30}
    POST /api/receiver/tasks/{id}/progress  {"epoch":N,"kind":"status"|"artifact"|"message",
                                             "body":{…}}
    POST /api/receiver/tasks/{id}/complete  {"epoch":N,"result":{"message"?,"artifacts"?},
                                             "input_required":false}
    POST /api/receiver/tasks/{id}/fail      {"epoch":N,"error":"…","retryable":true,
                                             "retry_after":S?}
    POST /api/receiver/tasks/{id}/cancel-ack {"epoch":N}   (after renew said "cancelled")
    POST /api/receiver/renew     {"leases":[{"task_id","epoch"}…≤100],"lease_seconds":30}
    POST /api/receiver/complete  {"completions":[{"task_id","epoch","result"}…≤100]}
         → 200 {"results":[{"task_id","outcome":"ok"|"duplicate"|"lease-lost"|"not-found",
                            "reason"?,"sentence"?}]}   (one transaction, input order)
         → 200 {"outcome":"ok"|"duplicate"}
         | 409 {"outcome":"lease-lost","reason":"cancelled"|"stale-epoch"|"expired"|"finished",
                "error":{"code":"lease-lost","reason":"<sentence>"}}
         | 404 {"outcome":"not-found","error":{…}}
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from melchior.mellan.rawjson import Raw, encode
from melchior.mellan.relay.auth import parties_of, viewer_of
from melchior.mellan.relay.caches.presence import receiver_info, seen
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.notify import receiver_topic, task_topic
from melchior.mellan.relay.store.base import (
    Lease,
    Outcome,
    Principal,
    Store,
    Task,
    TaskTurn,
    Verdict,
)
from melchior.mellan.relay.surfaces.body import INLINE_PARSE, declared_length
from melchior.mellan.relay.surfaces.http import (
    JSON,
    ApiError,
    actor,
    authenticate,
    error_response,
    field_bool,
    field_int,
    field_number,
    field_str,
    raw_or_null,
    read_object,
    require_agent,
    task_view,
)
from melchior.mellan.relay.surfaces.route_changes import lease_route
from melchior.policy.presence import MAX_WAIT as ONLINE_MAX_WAIT
from melchior.policy.visibility import may_see_task

MAX_CLAIM = 100
MAX_BATCH = 100
"""Items in one batched renew or complete, at most."""
MAX_WAIT = int(ONLINE_MAX_WAIT)  # the online window is reckoned from the same bound
EVENT_KINDS = ("status", "artifact", "message")
BACKOFF_BASE = 1.0
BACKOFF_CAP = 300.0
MAX_BODY_TEXT = 64 * 1024
"""Longest failure reason accepted (characters); the first 4000 are kept."""


def _relay(request: Request) -> Relay:
    relay: Relay = request.app.state.relay
    return relay


async def _agent(request: Request) -> tuple[Relay, Principal]:
    relay = _relay(request)
    principal = await authenticate(request, relay)
    require_agent(principal)
    return relay, principal


def lease_view(lease: Lease, turns: list[TaskTurn] | None = None) -> dict[str, Any]:
    """A lease as the receiver gets it. For a task on its second turn or later, the earlier
    turns come along (``history``: each turn's caller message and what was recorded), so a
    fresh run can see the conversation it continues without a second request."""
    view: dict[str, Any] = {
        "task": task_view(lease.task),
        "epoch": lease.epoch,
        "expires_at": lease.expires_at,
        "route": lease_route(lease.route),
    }
    if turns:
        view["history"] = [
            {
                "turn": t.turn,
                "message": Raw(t.payload),
                "state": t.state.value,
                "result": raw_or_null(t.result),
                "error": t.error,
            }
            for t in turns
        ]
    return view


async def claim(request: Request) -> Response:
    """Lease runnable tasks, waiting up to ``wait`` seconds for one to appear.

    The wait is a loop of store reads woken early by the notifier: a wake-up only saves
    latency, the periodic read is what guarantees queued work is found. Each read's
    waiter is armed *before* the read: a send that commits while the read is in its
    worker thread publishes to a waiter already listening, instead of to nobody — which
    left the task for the next periodic read, a whole ``poll_interval`` (1 s) later.
    """
    loop = asyncio.get_running_loop()
    began = loop.time()
    relay, me = await _agent(request)
    body = await read_object(request, relay)
    limit = field_int(body, "limit", 1, 1, MAX_CLAIM)
    wait = field_number(body, "wait", 0.0, 0.0, MAX_WAIT)
    lease_seconds = field_number(body, "lease_seconds", 30.0, 1.0, 3600.0)
    worker = field_str(body, "worker", required=False)[:100]
    await seen(relay, me, receiver_info(body.get("receiver"), wait))
    owner = f"{me.subject}@{me.credential_id}" + (f"/{worker}" if worker else "")
    topic = receiver_topic(me.workspace, me.subject)
    deadline = loop.time() + wait
    via = "immediate"  # how the read that finds work was prompted (metrics)
    while True:
        # Checked before every read that may lease, not only before waiting: a receiver
        # that died while its long-poll waited (killed, cable pulled) would otherwise be
        # handed the next task it is woken for — a lease nobody holds, which runs out and
        # is counted as one more attempt (the task's real run would see attempt + 1).
        if await request.is_disconnected():
            return JSON({"leases": []})  # nobody to hand a lease to; claim nothing
        asked = loop.time()
        remaining = deadline - asked
        waiter = (
            relay.notifier.listen(topic, min(remaining, relay.poll_interval))
            if remaining > 0
            else None
        )
        try:
            leases = await relay.call(
                relay.store.claim,
                me.workspace,
                me.subject,
                owner,
                limit=limit,
                lease_seconds=lease_seconds,
                actor=actor(me),
            )
            remaining = deadline - loop.time()
            if leases or remaining <= 0 or relay.closing or waiter is None:
                break
            woken = await waiter
        finally:
            if waiter is not None:
                waiter.cancel()
        via = "notify" if woken else "poll"
        relay.metrics.wakeups.inc(cause=via)
    if leases:
        relay.metrics.pickups.inc(len(leases), via=via)
    views = []
    for lease in leases:
        relay.held.put((me.workspace, me.subject, lease.task.id), True)
        turns = await relay.call(relay.store.turns, lease.task.id) if lease.task.turn > 1 else None
        views.append(lease_view(lease, turns))
    # How long the request waited here before the claim that took these leases began (a
    # lower bound, in milliseconds): the receiver counts a lease from when it sent the
    # claim plus this, so a long-poll answered late is not mistaken for a stale lease.
    if not leases:
        return JSON({"leases": []})
    waited = math.floor(max(0.0, asked - began) * 1000) / 1000
    return JSON({"leases": views, "waited": waited})


def _mine(store: Store, me: Principal, task_id: str) -> Task:
    """The task, if this agent is its receiver (a worker-thread call); else a 404 that
    does not tell whether the task exists."""
    task = store.get_task(me.workspace, task_id)
    if task is None or not may_see_task(viewer_of(me), parties_of(task), party="receiver"):
        raise ApiError(
            404,
            "not-found",
            f"no task {task_id!r} for agent {me.subject!r}",
            {"outcome": Outcome.NOT_FOUND.value},
        )
    return task


async def _own_task(relay: Relay, me: Principal, task_id: str) -> Task:
    return await relay.call(_mine, relay.store, me, task_id)


async def _as_receiver(
    relay: Relay, me: Principal, task_id: str, write: Callable[[], Verdict]
) -> Verdict:
    """Check that the task is this agent's, then make the fenced ``write``, in one
    worker-thread call. Whose task it is never changes, so once a claim or a check has
    shown it (:attr:`Relay.held`) the check is not read again: a receiver's reports —
    a stream's events — each pay one hop from the event loop and one transaction.
    ``write`` also encodes what it stores there: a body of any allowed size is never
    re-encoded on the loop."""
    key = (me.workspace, me.subject, task_id)
    known = relay.held.get(key) is not None

    def go() -> Verdict:
        if not known:
            _mine(relay.store, me, task_id)
        return write()

    verdict = await relay.call(go)
    if not known:
        relay.held.put(key, True)
    return verdict


def _fenced(relay: Relay, me: Principal, task_id: str, verdict: Verdict) -> Response:
    """Answer a fenced write as the store decided and audited it (with its reason). The
    store has published the task's change after its commit: a second wake-up here would
    only make every stream following the task read it twice."""
    if verdict.outcome is Outcome.LEASE_LOST:
        return error_response(
            409,
            "lease-lost",
            verdict.sentence,
            {"outcome": verdict.outcome.value, "reason": verdict.reason},
        )
    if verdict.outcome is Outcome.NOT_FOUND:
        return error_response(
            404,
            "not-found",
            f"no task {task_id!r} for agent {me.subject!r}",
            {"outcome": verdict.outcome.value},
        )
    return JSON({"outcome": verdict.outcome.value})


async def renew(request: Request) -> Response:
    relay, me = await _agent(request)
    task_id = request.path_params["task_id"]
    body = await read_object(request, relay)
    epoch = field_int(body, "epoch", None, 0, 2**62)
    lease_seconds = field_number(body, "lease_seconds", 30.0, 1.0, 3600.0)
    await seen(relay, me)
    outcome = await _as_receiver(
        relay,
        me,
        task_id,
        lambda: relay.store.renew(task_id, epoch, lease_seconds=lease_seconds, actor=actor(me)),
    )
    return _fenced(relay, me, task_id, outcome)


async def progress(request: Request) -> Response:
    relay, me = await _agent(request)
    task_id = request.path_params["task_id"]
    body = await read_object(request, relay)
    epoch = field_int(body, "epoch", None, 0, 2**62)
    kind = field_str(body, "kind")
    if kind not in EVENT_KINDS:
        raise ApiError(400, "bad-request", f"'kind' must be one of {', '.join(EVENT_KINDS)}")
    event = body.get("body")
    if not isinstance(event, dict):
        raise ApiError(400, "bad-request", "'body' must be a JSON object")
    outcome = await _as_receiver(
        relay,
        me,
        task_id,
        lambda: relay.store.progress(task_id, epoch, kind, encode(event), actor=actor(me)),
    )
    return _fenced(relay, me, task_id, outcome)


def _check_result(result: Any) -> dict[str, Any]:
    if not isinstance(result, dict):
        raise ApiError(
            400, "bad-request", "'result' must be an object {message?: Message, artifacts?: [..]}"
        )
    message = result.get("message")
    if message is not None and not isinstance(message, dict):
        raise ApiError(400, "bad-request", "'result.message' must be an A2A Message object")
    artifacts = result.get("artifacts")
    if artifacts is not None and (
        not isinstance(artifacts, list) or not all(isinstance(a, dict) for a in artifacts)
    ):
        raise ApiError(400, "bad-request", "'result.artifacts' must be a list of A2A Artifacts")
    return result


def _bounded(relay: Relay, text: str) -> str:
    """The encoded result, refused when over the relay's result limit (413, rule
    ``max-result``): the receiver reports the task failed with this reason."""
    size = len(text.encode("utf-8")) if not text.isascii() else len(text)
    if size > relay.max_result:
        raise ApiError(
            413, "result-too-large",
            f"the result is {size} bytes of JSON; this relay accepts results of at most "
            f"{relay.max_result} bytes (setting max_result): return large output by "
            "reference (a url part, or a file the caller can fetch)",
            {"limit": relay.max_result, "size": size}, rule="max-result",
        )  # fmt: skip
    return text


async def _encoded_result(relay: Relay, request: Request, raw: Any) -> str:
    """A complete's result checked, encoded and bounded — on a worker thread when the body
    was too big to parse on the event loop (:data:`..body.INLINE_PARSE`), so a result of
    many MiB never stalls the loop."""
    declared = declared_length(request)
    if declared is not None and declared <= INLINE_PARSE:
        return _bounded(relay, encode(_check_result(raw)))
    return await relay.call(lambda: _bounded(relay, encode(_check_result(raw))))


async def complete(request: Request) -> Response:
    relay, me = await _agent(request)
    task_id = request.path_params["task_id"]
    body = await read_object(request, relay)
    epoch = field_int(body, "epoch", None, 0, 2**62)
    result = await _encoded_result(relay, request, body.get("result", {}))
    input_required = field_bool(body, "input_required", False)
    outcome = await _as_receiver(
        relay,
        me,
        task_id,
        lambda: relay.store.complete(
            task_id, epoch, result, input_required=input_required, actor=actor(me)
        ),
    )
    return _fenced(relay, me, task_id, outcome)


# -- batches: one request, one transaction, for a receiver running many tasks -------------------


def _items(body: dict[str, Any], name: str) -> list[dict[str, Any]]:
    items = body.get(name)
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        raise ApiError(400, "bad-request", f"{name!r} must be a list of 1 to {MAX_BATCH} objects")
    if not all(isinstance(item, dict) for item in items):
        raise ApiError(400, "bad-request", f"every item of {name!r} must be an object")
    return items


def _owned(relay: Relay, me: Principal, task_ids: list[str]) -> set[str]:
    """Which of ``task_ids`` are this agent's to report on (one worker hop for all)."""
    mine = set()
    for task_id in dict.fromkeys(task_ids):
        task = relay.store.get_task(me.workspace, task_id)
        if task is not None and may_see_task(viewer_of(me), parties_of(task), party="receiver"):
            mine.add(task_id)
    return mine


def _item_view(me: Principal, task_id: str, verdict: Verdict | None) -> dict[str, Any]:
    if verdict is None or verdict.outcome is Outcome.NOT_FOUND:
        return {"task_id": task_id, "outcome": Outcome.NOT_FOUND.value,
                "reason": f"no task {task_id!r} for agent {me.subject!r}"}  # fmt: skip
    view: dict[str, Any] = {"task_id": task_id, "outcome": verdict.outcome.value}
    if verdict.outcome is Outcome.LEASE_LOST:
        view["reason"] = verdict.reason
        view["sentence"] = verdict.sentence
    return view


async def _batch(
    relay: Relay, me: Principal, task_ids: list[str], write: Callable[[list[int]], list[Verdict]]
) -> Response:
    """Check ownership, run ``write(owned_indexes)`` in one transaction, answer per item."""

    def go() -> list[Verdict | None]:
        mine = _owned(relay, me, task_ids)
        chosen = [i for i, task_id in enumerate(task_ids) if task_id in mine]
        verdicts = write(chosen) if chosen else []
        out: list[Verdict | None] = [None] * len(task_ids)
        for i, verdict in zip(chosen, verdicts, strict=True):
            out[i] = verdict
        return out

    verdicts = await relay.call(go)
    for task_id, verdict in zip(task_ids, verdicts, strict=True):
        if verdict is not None and verdict.outcome in (Outcome.OK, Outcome.DUPLICATE):
            relay.notifier.publish(task_topic(task_id))
    return JSON(
        {"results": [_item_view(me, t, v) for t, v in zip(task_ids, verdicts, strict=True)]}
    )


async def renew_many(request: Request) -> Response:
    """Renew several leases in one request and one transaction."""
    relay, me = await _agent(request)
    body = await read_object(request, relay)
    items = _items(body, "leases")
    lease_seconds = field_number(body, "lease_seconds", 30.0, 1.0, 3600.0)
    await seen(relay, me)  # renewals are heartbeats, batched or not
    pairs = [
        (field_str(item, "task_id", max_len=256), field_int(item, "epoch", None, 0, 2**62))
        for item in items
    ]
    return await _batch(
        relay, me, [t for t, _ in pairs],
        lambda chosen: relay.store.renew_many(
            [pairs[i] for i in chosen], lease_seconds=lease_seconds, actor=actor(me)
        ),
    )  # fmt: skip


async def complete_many(request: Request) -> Response:
    """Record several successes in one request and one transaction (a turn that asks for
    input uses the single ``complete``)."""
    relay, me = await _agent(request)
    body = await read_object(request, relay)
    items = _items(body, "completions")

    def encoded() -> list[tuple[str, int, str]]:
        return [
            (
                field_str(item, "task_id", max_len=256),
                field_int(item, "epoch", None, 0, 2**62),
                _bounded(relay, encode(_check_result(item.get("result", {})))),
            )
            for item in items
        ]

    declared = declared_length(request)
    small = declared is not None and declared <= INLINE_PARSE
    triples = encoded() if small else await relay.call(encoded)  # big: off the event loop
    return await _batch(
        relay, me, [t for t, _, _ in triples],
        lambda chosen: relay.store.complete_many(
            [triples[i] for i in chosen], actor=actor(me)
        ),
    )  # fmt: skip


def backoff(attempt: int) -> float:
    """Exponential backoff with equal jitter: base 1 s, doubling, capped at 5 minutes."""
    ceiling: float = min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** max(0, attempt - 1))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


async def fail(request: Request) -> Response:
    relay, me = await _agent(request)
    task_id = request.path_params["task_id"]
    body = await read_object(request, relay)
    epoch = field_int(body, "epoch", None, 0, 2**62)
    error = (
        field_str(body, "error", max_len=MAX_BODY_TEXT)[:4000]
        or "the receiver reported a failure without a reason"
    )
    retryable = field_bool(body, "retryable", True)
    task = await _own_task(relay, me, task_id)
    retry_after = body.get("retry_after")
    delay = (
        field_number(body, "retry_after", 0.0, 0.0, 86400.0)
        if retry_after is not None
        else backoff(task.attempt)
    )
    outcome = await relay.call(
        relay.store.fail,
        task_id,
        epoch,
        error,
        retryable=retryable,
        backoff_seconds=delay,
        actor=actor(me),
    )
    response = _fenced(relay, me, task_id, outcome)
    if outcome.outcome is Outcome.OK and retryable:
        relay.notifier.publish(receiver_topic(me.workspace, me.subject))
    return response


async def cancel_ack(request: Request) -> Response:
    """The receiver has stopped a cancelled task's work: free its session slot now rather
    than after the cancel grace period."""
    relay, me = await _agent(request)
    task_id = request.path_params["task_id"]
    body = await read_object(request, relay)
    epoch = field_int(body, "epoch", None, 0, 2**62)
    outcome = await _as_receiver(
        relay, me, task_id, lambda: relay.store.ack_cancel(task_id, epoch, actor=actor(me))
    )
    return _fenced(relay, me, task_id, outcome)


def routes() -> list[BaseRoute]:
    return [
        Route("/receiver/claim", claim, methods=["POST"]),
        Route("/receiver/renew", renew_many, methods=["POST"]),
        Route("/receiver/complete", complete_many, methods=["POST"]),
        Route("/receiver/tasks/{task_id}/renew", renew, methods=["POST"]),
        Route("/receiver/tasks/{task_id}/progress", progress, methods=["POST"]),
        Route("/receiver/tasks/{task_id}/complete", complete, methods=["POST"]),
        Route("/receiver/tasks/{task_id}/fail", fail, methods=["POST"]),
        Route("/receiver/tasks/{task_id}/cancel-ack", cancel_ack, methods=["POST"]),
    ]
