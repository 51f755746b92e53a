"""Live parts of pages, as server-sent events: the task list, one task's timeline, the
audit log as it grows.

Each stream sends server-rendered HTML for a part of its page (``event: html``, data
``{"target", "mode", "html"}``), which ``dashboard.js`` puts in place. Like the A2A
streams, it waits on a wake-up topic (:mod:`melchior.mellan.relay.notify`) armed
*before* each store read, and reads the store at least every ``poll_interval`` anyway:
the store is the truth, a wake-up only makes it sooner. A part is sent again only when
its HTML changed. The audit stream carries the last record's ``seq`` as the event id,
so a browser that reconnects (``Last-Event-ID``) misses nothing and repeats nothing.

A stream does not keep its session alive (only pages and actions do), and it re-checks
the session every :data:`SESSION_RECHECK` seconds: signed out, idle, expired or revoked,
it says ``event: signedout`` and ends.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from melchior.mellan.relay.notify import audit_topic, task_topic
from melchior.mellan.relay.store.base import AuditFilter
from melchior.mellan.relay.surfaces.dashboard import pages, sessions
from melchior.mellan.relay.surfaces.dashboard.guard import relay_of, settings_of
from melchior.mellan.relay.surfaces.dashboard.sessions import Owner, Refused
from melchior.mellan.relay.watch import Follower, Waker

KEEPALIVE = 15.0
SESSION_RECHECK = 10.0
MAX_ROWS = 100
"""Audit records sent in one event at most (the rest follow at once, in order)."""


@dataclass(frozen=True)
class Part:
    """A part of a page: put ``html`` into the element with id ``target`` (``replace``
    its content, or ``prepend`` to it)."""

    target: str
    html: str
    mode: str = "replace"
    id: str | None = None


def frame(part: Part) -> bytes:
    head = f"id: {part.id}\n" if part.id is not None else ""
    data = json.dumps({"target": part.target, "mode": part.mode, "html": part.html})
    return f"{head}event: html\ndata: {data}\n\n".encode()


class Source(Protocol):
    """What a live part waits on: a :class:`Waker` on a topic (the part reads the store
    itself), or a :class:`~melchior.mellan.relay.watch.Follower` of a shared reader
    (the part renders what that reader read)."""

    async def arm(self) -> None: ...

    async def wait(self) -> object: ...

    def close(self) -> None: ...


def stream(
    request: Request,
    topic: str,
    parts: Callable[[], Awaitable[list[Part]]],
    source: Callable[[], Source] | None = None,
) -> StreamingResponse:
    relay = relay_of(request)
    settings = settings_of(request)

    async def frames() -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        waker = source() if source else Waker(relay.notifier, topic, relay.poll_interval)
        shown: dict[str, str] = {}
        checked = sent = loop.time()
        try:
            yield b"retry: 2000\n\n"
            while not relay.closing:
                await waker.arm()
                for part in await parts():
                    if part.mode == "replace" and shown.get(part.target) == part.html:
                        continue
                    shown[part.target] = part.html
                    sent = loop.time()
                    yield frame(part)
                if loop.time() - sent >= KEEPALIVE:
                    sent = loop.time()
                    yield b": keepalive\n\n"
                await waker.wait()
                if loop.time() - checked >= SESSION_RECHECK:
                    checked = loop.time()
                    try:
                        await sessions.current(request, relay, settings, touch=False)
                    except Refused as exc:
                        said = {"rule": exc.decision.rule, "reason": exc.decision.reason}
                        yield f"event: signedout\ndata: {json.dumps(said)}\n\n".encode()
                        return
        finally:
            waker.close()

    return StreamingResponse(
        frames(),
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


async def tasks_live(request: Request, owner: Owner) -> Response:
    filt = pages.TaskFilter(request)
    store = relay_of(request).store

    async def parts() -> list[Part]:
        tasks = await relay_of(request).call(filt.list, store, owner.workspace)
        return [Part("task-rows", pages.task_rows(request, owner, tasks))]

    return stream(request, audit_topic(owner.workspace), parts)


async def task_live(request: Request, owner: Owner) -> Response:
    """A task's live parts, from the task's one shared reader on this replica (keyed by
    workspace and task, so every owner's view of it shares it): a view re-renders what
    that reader read, for its own owner, and costs no store read of its own."""
    task_id = request.path_params["task_id"]
    relay = relay_of(request)
    workspace = owner.workspace
    follower: Follower[pages.TaskRead] | None = None
    drawn = False

    async def look(prev: pages.TaskRead | None) -> AsyncIterator[pages.TaskRead]:
        relay.metrics.stream_reads.inc(kind="ui")
        read = await pages.read_task(relay, workspace, task_id)
        if read != prev:
            yield read

    def source() -> Follower[pages.TaskRead]:
        nonlocal follower
        key = ("ui", workspace, task_id)
        follower = relay.watches.follow(key, task_topic(task_id), look, lambda _: False)
        return follower

    async def parts() -> list[Part]:
        nonlocal drawn
        assert follower is not None
        if drawn and not follower.fresh():  # a poll interval with nothing new: no render
            return []
        drawn = True
        rendered = pages.render_task_parts(request, owner, follower.latest())
        return [Part(target, html) for target, html in (rendered or {}).items()]

    return stream(request, task_topic(task_id), parts, source)


def _after(request: Request) -> int:
    raw = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    return int(raw) if raw.isdigit() and len(raw) < 19 else 0


async def audit_live(request: Request, owner: Owner) -> Response:
    match: AuditFilter = pages.AuditQuery(request).match
    store = relay_of(request).store
    after = _after(request)

    async def parts() -> list[Part]:
        nonlocal after
        out: list[Part] = []
        while True:
            records = await relay_of(request).call(
                store.audit_matching, owner.workspace, match, after=after, limit=MAX_ROWS,
                newest_first=False,
            )  # fmt: skip
            if not records:
                return out
            after = records[-1].seq
            html = pages.audit_rows(request, list(reversed(records)))
            out.append(Part("audit-rows", html, "prepend", str(after)))
            if len(records) < MAX_ROWS:
                return out

    return stream(request, audit_topic(owner.workspace), parts)
