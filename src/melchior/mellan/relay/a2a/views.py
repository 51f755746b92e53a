"""How a stored task looks through A2A: Task, TaskStatus and stream events as plain JSON.

The queue's states map onto A2A's (ARCHITECTURE §5): queued → SUBMITTED, leased →
WORKING, succeeded → COMPLETED, input_required → INPUT_REQUIRED, failed → FAILED,
cancelled → CANCELED. Payloads are parsed with :mod:`jsontext` and written back with
the same values, so parts, metadata and ``data`` reach the caller as they were sent.
Agent messages the receiver reported without ids get stable derived ones, so two reads
of one task give the same JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from melchior.mellan.relay.a2a import jsontext
from melchior.mellan.relay.a2a.timefmt import a2a_ts
from melchior.mellan.relay.store.base import Task, TaskEvent, TaskState
from melchior.policy.hops import HOPS_URI

A2A_STATE = {
    TaskState.QUEUED: "TASK_STATE_SUBMITTED",
    TaskState.LEASED: "TASK_STATE_WORKING",
    TaskState.SUCCEEDED: "TASK_STATE_COMPLETED",
    TaskState.INPUT_REQUIRED: "TASK_STATE_INPUT_REQUIRED",
    TaskState.FAILED: "TASK_STATE_FAILED",
    TaskState.CANCELLED: "TASK_STATE_CANCELED",
}

QUEUE_STATES: dict[str, tuple[TaskState, ...]] = {
    "TASK_STATE_SUBMITTED": (TaskState.QUEUED,),
    "TASK_STATE_WORKING": (TaskState.LEASED,),
    "TASK_STATE_COMPLETED": (TaskState.SUCCEEDED,),
    "TASK_STATE_INPUT_REQUIRED": (TaskState.INPUT_REQUIRED,),
    "TASK_STATE_FAILED": (TaskState.FAILED,),
    "TASK_STATE_CANCELED": (TaskState.CANCELLED,),
    "TASK_STATE_REJECTED": (),
    "TASK_STATE_AUTH_REQUIRED": (),
}


def ends_stream(state: TaskState) -> bool:
    """Terminal or interrupted: where SendMessage stops blocking and streams close."""
    return state.terminal or state is TaskState.INPUT_REQUIRED


def _loads_obj(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = jsontext.loads(text)
    except Exception:
        return None
    return value if isinstance(value, dict) else None


def caller_message(task: Task) -> dict[str, Any]:
    """The caller's message as stored, with the task and context it belongs to."""
    msg = _loads_obj(task.payload) or {"role": "ROLE_USER", "parts": []}
    msg["taskId"] = task.id
    msg["contextId"] = task.context_id
    return msg


def agent_message(task: Task, raw: Any, fallback_id: str) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    msg = dict(raw)
    msg.setdefault("messageId", fallback_id)
    msg.setdefault("role", "ROLE_AGENT")
    msg.setdefault("parts", [])
    msg["taskId"] = task.id
    msg["contextId"] = task.context_id
    return msg


def _result(task: Task) -> dict[str, Any]:
    return _loads_obj(task.result) or {}


def _error_message(task: Task) -> dict[str, Any] | None:
    if not task.error:
        return None
    parsed = _loads_obj(task.error)
    text = task.error
    if parsed is not None:
        for key in ("message", "error", "reason"):
            if isinstance(parsed.get(key), str):
                text = parsed[key]
                break
    return {
        "messageId": f"{task.id}-error",
        "role": "ROLE_AGENT",
        "parts": [{"text": text}],
        "taskId": task.id,
        "contextId": task.context_id,
    }


def _artifact_update(body: dict[str, Any]) -> tuple[dict[str, Any], bool, bool | None] | None:
    """(artifact, append, lastChunk) from a receiver's artifact event body, which is either
    an Artifact or ``{"artifact": Artifact, "append"?, "lastChunk"?}``."""
    if isinstance(body.get("artifact"), dict):
        art = body["artifact"]
        append = body.get("append") is True
        last = body.get("lastChunk")
        return art, append, last if isinstance(last, bool) else None
    if "parts" in body:
        return body, False, None
    return None


def _status_message(task: Task, ev: TaskEvent, body: dict[str, Any]) -> dict[str, Any] | None:
    raw = body.get("message") if ev.kind == "status" else body
    return agent_message(task, raw, f"{task.id}-ev{ev.seq}")


def status_of(task: Task, events: Sequence[TaskEvent] = ()) -> dict[str, Any]:
    status: dict[str, Any] = {"state": A2A_STATE[task.state], "timestamp": a2a_ts(task.updated_at)}
    message: dict[str, Any] | None = None
    if task.state in (TaskState.SUCCEEDED, TaskState.INPUT_REQUIRED):
        message = agent_message(task, _result(task).get("message"), f"{task.id}-result")
    elif task.state is TaskState.FAILED:
        message = _error_message(task)
    elif task.state is TaskState.LEASED:
        for ev in reversed(events):
            if ev.kind in ("status", "message"):
                body = _loads_obj(ev.body) or {}
                message = _status_message(task, ev, body)
                break
    if message is not None:
        status["message"] = message
    return status


def artifacts_of(task: Task, events: Sequence[TaskEvent]) -> list[dict[str, Any]]:
    arts: dict[str, dict[str, Any]] = {}
    for ev in events:
        if ev.kind != "artifact":
            continue
        upd = _artifact_update(_loads_obj(ev.body) or {})
        if upd is None:
            continue
        art, append, _ = upd
        aid = str(art.get("artifactId") or f"{task.id}-ev{ev.seq}")
        if append and aid in arts:
            merged = dict(arts[aid])
            merged["parts"] = [*merged.get("parts", []), *art.get("parts", [])]
            arts[aid] = merged
        else:
            arts[aid] = {**art, "artifactId": aid}
    result_arts = _result(task).get("artifacts")
    if isinstance(result_arts, list):
        for i, art in enumerate(result_arts):
            if isinstance(art, dict):
                aid = str(art.get("artifactId") or f"{task.id}-a{i}")
                arts[aid] = {**art, "artifactId": aid}
    return list(arts.values())


def history_of(task: Task, events: Sequence[TaskEvent]) -> list[dict[str, Any]]:
    history = [caller_message(task)]
    for ev in events:
        if ev.kind in ("status", "message"):
            msg = _status_message(task, ev, _loads_obj(ev.body) or {})
            if msg is not None:
                history.append(msg)
    if task.state in (TaskState.SUCCEEDED, TaskState.INPUT_REQUIRED):
        final = agent_message(task, _result(task).get("message"), f"{task.id}-result")
        if final is not None:
            history.append(final)
    elif task.state is TaskState.FAILED:
        err = _error_message(task)
        if err is not None:
            history.append(err)
    return history


def task_metadata(task: Task) -> dict[str, Any]:
    return {
        "capability": task.capability,
        HOPS_URI: {"chain": task.chain, "hop": task.hop, "path": list(task.path)},
    }


def task_view(
    task: Task,
    events: Sequence[TaskEvent] = (),
    *,
    history_length: int | None = None,
    include_artifacts: bool = True,
) -> dict[str, Any]:
    """A2A ``Task``. ``history_length`` None = all, 0 = omitted, N = the last N messages."""
    out: dict[str, Any] = {
        "id": task.id,
        "contextId": task.context_id,
        "status": status_of(task, events),
    }
    if include_artifacts:
        arts = artifacts_of(task, events)
        if arts:
            out["artifacts"] = arts
    if history_length != 0:
        history = history_of(task, events)
        if history_length is not None:
            history = history[-history_length:]
        out["history"] = history
    out["metadata"] = task_metadata(task)
    return out


def event_updates(task: Task, events: Sequence[TaskEvent]) -> list[dict[str, Any]]:
    """Stored progress events as ``StreamResponse`` objects, in order."""
    out: list[dict[str, Any]] = []
    for ev in events:
        body = _loads_obj(ev.body) or {}
        if ev.kind == "artifact":
            upd = _artifact_update(body)
            if upd is None:
                continue
            art, append, last = upd
            aid = str(art.get("artifactId") or f"{task.id}-ev{ev.seq}")
            item: dict[str, Any] = {
                "taskId": task.id,
                "contextId": task.context_id,
                "artifact": {**art, "artifactId": aid},
            }
            if append:
                item["append"] = True
            if last is not None:
                item["lastChunk"] = last
            out.append({"artifactUpdate": item})
        elif ev.kind in ("status", "message"):
            status: dict[str, Any] = {"state": "TASK_STATE_WORKING", "timestamp": a2a_ts(ev.at)}
            msg = _status_message(task, ev, body)
            if msg is not None:
                status["message"] = msg
            out.append(
                {
                    "statusUpdate": {
                        "taskId": task.id,
                        "contextId": task.context_id,
                        "status": status,
                    }
                }
            )
    return out


def status_update(task: Task, events: Sequence[TaskEvent] = ()) -> dict[str, Any]:
    return {
        "statusUpdate": {
            "taskId": task.id,
            "contextId": task.context_id,
            "status": status_of(task, events),
        }
    }
