"""A2A push-notification configs: create, get, list and delete a task's webhooks.

A config belongs to a task and is seen only by whoever may see the task (its caller, the
workspace's owners); anyone else gets ``TaskNotFound``, as for an unknown task. The URL
is judged by :func:`melchior.policy.outbound.check_url` with the workspace's setting when
it is given, and again, after DNS, each time a delivery goes
(:mod:`melchior.mellan.relay.workers.push`).

What a config shows back: everything but the authentication credentials, which are
write-only (a config read by an owner, or leaked in a log, does not give the endpoint's
password away); the scheme is shown so a caller can see what it set.
"""

from __future__ import annotations

from typing import Any

from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.store.base import (
    Conflict,
    NewPush,
    NotFoundError,
    PushConfig,
    Record,
    Store,
    Task,
)
from melchior.mellan.relay.surfaces.a2a import requests
from melchior.mellan.relay.surfaces.a2a.access import Caller
from melchior.mellan.relay.surfaces.a2a.admission import check_push, vet_push
from melchior.mellan.relay.surfaces.a2a.errors import InvalidParams, TaskNotFound


def config_view(config: PushConfig) -> dict[str, Any]:
    """A2A ``TaskPushNotificationConfig`` (credentials withheld)."""
    out: dict[str, Any] = {"id": config.id, "taskId": config.task_id, "url": config.url}
    if config.token is not None:
        out["token"] = config.token
    if config.auth_scheme is not None:
        out["authentication"] = {"scheme": config.auth_scheme}
    return out


def _record(caller: Caller, action: str, why: str, config_id: str) -> Record:
    return Record(caller.actor, action, "caller", why, {"config": config_id})


def _visible(store: Store, caller: Caller, task_id: str) -> Task:
    """The task, or TaskNotFound unless the caller may see it: the task row alone, not
    the events a view would read (a push config needs none of them)."""
    return caller.visible(store.get_task(caller.target.workspace, task_id), task_id)


def _create(store: Store, caller: Caller, task_id: str, push: NewPush) -> PushConfig:
    task = _visible(store, caller, task_id)
    check_push(push, "url", store.push_allow_private(task.workspace))
    record = _record(caller, "push.config", "a push config on a task it may see", push.id or "")
    try:
        return store.add_push_config(task.workspace, task.id, task.caller, push, record=record)
    except NotFoundError:
        raise TaskNotFound(metadata={"taskId": task_id}) from None
    except Conflict as exc:
        raise InvalidParams(str(exc), metadata={"taskId": task_id}) from None


async def create(relay: Relay, caller: Caller, params: Any) -> dict[str, Any]:
    task_id, push = requests.parse_push_create(params)
    task = await relay.call(_visible, relay.store, caller, task_id)  # an unknown task first
    allow = await relay.call(relay.store.push_allow_private, task.workspace)
    await vet_push(relay, push, "url", allow)  # resolved and judged as at delivery
    return config_view(await relay.call(_create, relay.store, caller, task_id, push))


def _not_found(ref: requests.PushRef) -> TaskNotFound:
    return TaskNotFound(
        f"task {ref.task_id} has no push notification config {ref.id!r}",
        metadata={"taskId": ref.task_id, "configId": ref.id},
    )


async def get(relay: Relay, caller: Caller, params: Any) -> dict[str, Any]:
    ref = requests.parse_push_ref(params)
    task = await relay.call(_visible, relay.store, caller, ref.task_id)
    config = await relay.call(relay.store.get_push_config, task.workspace, task.id, ref.id)
    if config is None:
        raise _not_found(ref)
    return config_view(config)


async def list_configs(relay: Relay, caller: Caller, params: Any) -> dict[str, Any]:
    task_id, size, token = requests.parse_push_list(params)
    task = await relay.call(_visible, relay.store, caller, task_id)
    configs = await relay.call(relay.store.list_push_configs, task.workspace, task.id)
    start = 0
    if token is not None:
        ids = [c.id for c in configs]
        if token not in ids:
            raise InvalidParams(
                f"pageToken {token!r} is not a page of this list",
                violations=[("pageToken", "unknown")],
            )
        start = ids.index(token) + 1
    page = configs[start : start + size]
    more = start + size < len(configs)
    return {
        "configs": [config_view(c) for c in page],
        "nextPageToken": page[-1].id if more and page else "",
    }


async def delete(relay: Relay, caller: Caller, params: Any) -> dict[str, Any]:
    """Idempotent, as A2A asks: deleting a config that is not there (any more) is not an
    error, as long as the task itself may be seen."""
    ref = requests.parse_push_ref(params)
    task = await relay.call(_visible, relay.store, caller, ref.task_id)
    record = _record(caller, "push.config_delete", "its own task's push config", ref.id)
    await relay.call(relay.store.delete_push_config, task.workspace, task.id, ref.id, record=record)
    return {}
