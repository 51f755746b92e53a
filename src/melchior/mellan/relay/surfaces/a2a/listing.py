"""ListTasks: the caller's own tasks to one agent, newest first, in pages.

An owner sees every task addressed to the agent. A page token is a task id the caller
can see; any other token is refused the same way whether it names someone else's task
or nothing, so tokens cannot be used to probe for tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.store.base import Store, Task, TaskEvent, TaskState, TaskTurn
from melchior.mellan.relay.surfaces.a2a import views
from melchior.mellan.relay.surfaces.a2a.access import Caller
from melchior.mellan.relay.surfaces.a2a.errors import InvalidParams
from melchior.mellan.relay.surfaces.a2a.requests import ListRequest


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
    filters: dict[str, Any] = {
        "caller": who,
        "receiver": target.agent,
        "context_id": req.context_id,
        "states": states,
        "updated_after": req.status_timestamp_after,
    }
    rows = store.list_tasks(
        target.workspace, after=req.page_token, limit=req.page_size + 1, **filters
    )
    page, more = rows[: req.page_size], len(rows) > req.page_size
    # totalSize: counted by the database, no row read (a caller with a long history, each
    # task with a big result, used to have every one of them read for this number)
    total = store.count_tasks(target.workspace, **filters)
    return page, (page[-1].id if more and page else ""), total


def _views(store: Store, page: list[Task], req: ListRequest) -> list[dict[str, Any]]:
    """The page's task views, built where the page was read: on a worker thread, in the
    same hop. A page can hold many big results (each up to the result limit), so their
    events, turns and parsed JSON are never handled on the event loop."""
    hist = 0 if req.history_length is None else req.history_length
    out = []
    for task in page:
        events: list[TaskEvent] = []
        turns: list[TaskTurn] = []
        if hist or req.include_artifacts:
            events = store.events_after(task.id, 0)
            if task.turn > 1:
                turns = store.turns(task.id)
        out.append(
            views.task_view(
                task,
                events,
                history_length=hist,
                include_artifacts=req.include_artifacts,
                turns=turns,
            )
        )
    return out


def _list(store: Store, caller: Caller, req: ListRequest) -> dict[str, Any]:
    page, token, total = _page(store, caller, req)
    tasks = _views(store, page, req)
    return {"tasks": tasks, "nextPageToken": token, "pageSize": req.page_size, "totalSize": total}


async def list_tasks(relay: Relay, caller: Caller, req: ListRequest) -> dict[str, Any]:
    """One worker-thread hop for the whole answer: the page, its tasks' events and views
    (the encoding is another, :data:`~.ops.CARRY_TASKS`)."""
    return await relay.call(_list, relay.store, caller, req)
