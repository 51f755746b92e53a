"""How a stored task looks through A2A: Task, TaskStatus and stream events as plain JSON.

The queue's states map onto A2A's (ARCHITECTURE §5): queued → SUBMITTED, leased →
WORKING, succeeded → COMPLETED, input_required → INPUT_REQUIRED, failed → FAILED,
cancelled → CANCELED. Payloads are parsed exactly (:mod:`melchior.mellan.rawjson`) and
written back with the same values, so parts, metadata and ``data`` reach the caller as
they were sent; a long stored string (a big answer) is not parsed at all but spliced as
its stored JSON text. A view holds each message once (:func:`task_view`).
Agent messages the receiver reported without ids get stable derived ones, so two reads
of one task give the same JSON.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

from melchior.mellan.rawjson import RAW_OVER, Raw, decode_stored
from melchior.mellan.relay.store.base import Task, TaskEvent, TaskState, TaskTurn
from melchior.mellan.relay.surfaces.a2a import jsontext
from melchior.mellan.relay.surfaces.a2a.timefmt import a2a_ts
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


def _loads_obj(text: str | None, *, keep: bool = False) -> dict[str, Any] | None:
    """A stored JSON object (payload, result, event body) with its long strings kept as
    their JSON text (:func:`~melchior.mellan.rawjson.decode_stored`): a view only adds
    ids around the answer, so a 15 MiB text is spliced into the response, never parsed
    and re-encoded. With ``keep`` (a recorded result) a big one is looked up in, and
    added to, :data:`_kept`."""
    if not text:
        return None
    memo: dict[int, tuple[str, Any]] | None = getattr(_memo, "parsed", None)
    if memo is not None and id(text) in memo and memo[id(text)][0] is text:
        return memo[id(text)][1]  # type: ignore[no-any-return]
    big = len(text) > RAW_OVER
    kept = _kept.get(text) if keep and big else None
    value: dict[str, Any] | None
    if kept is not None:
        value = dict(kept)  # the top level is the view's to change; below is shared
    else:
        try:
            parsed = decode_stored(text)
        except Exception:
            parsed = None
        value = parsed if isinstance(parsed, dict) else None
        if keep and big and value is not None:
            _kept.put(text, value)
            value = dict(value)
    if memo is not None and big:
        memo[id(text)] = (text, value)
    return value


class Kept:
    """Finished results parsed once per process, by the identity of their text: the store
    hands out one ``str`` object per finished big result (its own cache,
    :mod:`melchior.mellan.relay.store.bigtext`), so a view of it finds the parsed value
    here, its long strings already :class:`~melchior.mellan.rawjson.Raw` with their UTF-8
    bytes made once (:func:`~melchior.mellan.relay.surfaces.a2a.jsontext.dumpb_chunks`). Then
    three clients polling a 15 MiB answer cost a copy to each socket, not a decode and an
    encode each. Bounded by the characters of the texts kept (each entry also holds its
    Raw text and that text's bytes: about three times its size in all); the least
    recently used go first. The text is held, so its ``id`` cannot be reused while kept."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._items: OrderedDict[int, tuple[str, dict[str, Any]]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, text: str) -> dict[str, Any] | None:
        with self._lock:
            item = self._items.get(id(text))
            if item is None or item[0] is not text:
                return None
            self._items.move_to_end(id(text))
            return item[1]

    def put(self, text: str, value: dict[str, Any]) -> None:
        if len(text) > self.budget:
            return
        with self._lock:
            if id(text) in self._items:
                return
            self._items[id(text)] = (text, value)
            self._chars += len(text)
            while self._chars > self.budget:
                _, (old, _) = self._items.popitem(last=False)
                self._chars -= len(old)


KEPT_CHARS = 64 << 20
"""Characters of finished results whose parsed views a relay process keeps."""

_kept = Kept(KEPT_CHARS)

_memo = threading.local()
"""While :func:`task_view` builds a view (on this thread): each big stored text parsed
once, not once for the status, the artifacts and the history. The parsed objects are
only read by the view functions (they copy before they change), so sharing is safe."""


def _loads_plain(text: str) -> dict[str, Any] | None:
    """A stored object parsed whole, for the few fields a view reads as strings (an
    error's reason)."""
    try:
        value = jsontext.loads(text)
    except Exception:
        return None
    return value if isinstance(value, dict) else None


def _aid(art: dict[str, Any], fallback: str) -> Any:
    """An artifact's id as given (a string, or the spliced text of a very long one), else
    the derived ``fallback``."""
    aid = art.get("artifactId")
    if isinstance(aid, Raw):
        return aid
    return str(aid or fallback)


class _Turn(NamedTuple):
    """One turn as the views read it: a finished one (:class:`TaskTurn`) or the live one."""

    number: int
    payload: str
    state: TaskState
    result: str | None
    error: str | None


def _turns(task: Task, turns: Sequence[TaskTurn]) -> list[_Turn]:
    past = [_Turn(t.turn, t.payload, t.state, t.result, t.error) for t in turns]
    return [*past, _Turn(task.turn, task.payload, task.state, task.result, task.error)]


def _suffix(turn: int) -> str:
    """Derived ids of turn 1 keep their first form; later turns' are told apart."""
    return "" if turn == 1 else f"-t{turn}"


def caller_message(task: Task, payload: str | None = None) -> dict[str, Any]:
    """The caller's message of a turn as stored, with the task and context it belongs to."""
    msg = _loads_obj(task.payload if payload is None else payload) or {
        "role": "ROLE_USER",
        "parts": [],
    }
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
    return _loads_obj(task.result, keep=True) or {}


def _error_message(task: Task, error: str | None = None, turn: int = 1) -> dict[str, Any] | None:
    text = task.error if error is None and turn == task.turn else error
    if not text:
        return None
    parsed = _loads_plain(text)
    if parsed is not None:
        for key in ("message", "error", "reason"):
            if isinstance(parsed.get(key), str):
                text = parsed[key]
                break
    return {
        "messageId": f"{task.id}{_suffix(turn)}-error",
        "role": "ROLE_AGENT",
        "parts": [{"text": text}],
        "taskId": task.id,
        "contextId": task.context_id,
    }


def _final(task: Task, turn: _Turn) -> dict[str, Any] | None:
    """What a turn ended with: the agent's answer (or question), or the failure."""
    if turn.state in (TaskState.SUCCEEDED, TaskState.INPUT_REQUIRED):
        raw = (_loads_obj(turn.result, keep=True) or {}).get("message")
        return agent_message(task, raw, f"{task.id}{_suffix(turn.number)}-result")
    if turn.state is TaskState.FAILED:
        return _error_message(task, turn.error, turn.number)
    return None


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
    if task.state in (TaskState.SUCCEEDED, TaskState.INPUT_REQUIRED, TaskState.FAILED):
        message = _final(task, _turns(task, ())[-1])
    elif task.state is TaskState.LEASED:
        for ev in reversed(events):
            if ev.kind in ("status", "message") and ev.turn == task.turn:
                body = _loads_obj(ev.body) or {}
                message = _status_message(task, ev, body)
                break
    if message is not None:
        status["message"] = message
    return status


def result_artifacts(task: Task, turn: int, result: str | None) -> list[dict[str, Any]]:
    """The artifacts a turn's recorded result carries, each with a stable id."""
    arts = (_loads_obj(result, keep=True) or {}).get("artifacts")
    out: list[dict[str, Any]] = []
    if isinstance(arts, list):
        for i, art in enumerate(arts):
            if isinstance(art, dict):
                aid = _aid(art, f"{task.id}{_suffix(turn)}-a{i}")
                out.append({**art, "artifactId": aid})
    return out


def artifacts_of(
    task: Task, events: Sequence[TaskEvent], turns: Sequence[TaskTurn] = ()
) -> list[dict[str, Any]]:
    """Every artifact of every turn: those streamed as events (chunks appended), then those
    each turn's result carries."""
    arts: dict[str, dict[str, Any]] = {}
    for ev in events:
        if ev.kind != "artifact":
            continue
        upd = _artifact_update(_loads_obj(ev.body) or {})
        if upd is None:
            continue
        art, append, _ = upd
        aid = _aid(art, f"{task.id}-ev{ev.seq}")
        if append and aid in arts:
            merged = dict(arts[aid])
            merged["parts"] = [*merged.get("parts", []), *art.get("parts", [])]
            arts[aid] = merged
        else:
            arts[aid] = {**art, "artifactId": aid}
    for turn in _turns(task, turns):
        for art in result_artifacts(task, turn.number, turn.result):
            arts[art["artifactId"]] = art
    return list(arts.values())


def history_of(
    task: Task, events: Sequence[TaskEvent], turns: Sequence[TaskTurn] = ()
) -> list[dict[str, Any]]:
    """Every turn in order: the caller's message, what the agent said while working, and
    what the turn ended with."""
    history: list[dict[str, Any]] = []
    for turn in _turns(task, turns):
        history.append(caller_message(task, turn.payload))
        for ev in events:
            if ev.turn == turn.number and ev.kind in ("status", "message"):
                msg = _status_message(task, ev, _loads_obj(ev.body) or {})
                if msg is not None:
                    history.append(msg)
        final = _final(task, turn)
        if final is not None:
            history.append(final)
    return history


def direct_reply(task: Task) -> dict[str, Any] | None:
    """The agent's message when it answered with a message and no task of its own (its
    result says ``"asMessage": true``): what a blocking send returns instead of a Task.
    It names the conversation (``contextId``), not the relay's record of the exchange."""
    if task.state is not TaskState.SUCCEEDED:
        return None
    result = _result(task)
    if result.get("asMessage") is not True:
        return None
    msg = agent_message(task, result.get("message"), f"{task.id}-result")
    if msg is None:
        return None
    msg.pop("taskId", None)
    return msg


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
    turns: Sequence[TaskTurn] = (),
) -> dict[str, Any]:
    """A2A ``Task``. ``history_length`` None = all, 0 = omitted, N = the last N messages.

    Each message is in the view once. The message the status carries (the turn's answer,
    question or failure; while working, the agent's latest word) is ``status.message`` and
    not also the last of ``history``: as in the a2a-sdk's own server, which moves a status
    message into the history only once a newer status or the caller's next message
    supersedes it. So ``history`` is what came before the current status, and a 15 MiB
    answer is sent once, not twice. ``history_length`` counts that history."""
    _memo.parsed = {}
    try:
        return _task_view(task, events, history_length, include_artifacts, turns)
    finally:
        del _memo.parsed  # holds the texts: kept no longer than the view's building


def _task_view(
    task: Task,
    events: Sequence[TaskEvent],
    history_length: int | None,
    include_artifacts: bool,
    turns: Sequence[TaskTurn],
) -> dict[str, Any]:
    status = status_of(task, events)
    out: dict[str, Any] = {"id": task.id, "contextId": task.context_id, "status": status}
    if include_artifacts:
        arts = artifacts_of(task, events, turns)
        if arts:
            out["artifacts"] = arts
    if history_length != 0:
        history = history_of(task, events, turns)
        if "message" in status and history:
            # The status message is always the last one told: the current turn's final, or
            # (working) the message of its last status event, which history_of put last.
            history.pop()
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
            aid = _aid(art, f"{task.id}-ev{ev.seq}")
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


def state_updates(
    task: Task, events: Sequence[TaskEvent], seen_artifacts: set[str]
) -> list[dict[str, Any]]:
    """What a reader hears when the task's state (or turn) changes: the artifacts the turn's
    recorded result carries that it has not heard of yet (``seen_artifacts`` grows), then
    the status. Streams and push notifications both say a change this way."""
    out: list[dict[str, Any]] = []
    if task.state in (TaskState.SUCCEEDED, TaskState.INPUT_REQUIRED):
        for art in result_artifacts(task, task.turn, task.result):
            if art["artifactId"] not in seen_artifacts:
                seen_artifacts.add(art["artifactId"])
                update = {"taskId": task.id, "contextId": task.context_id, "artifact": art}
                out.append({"artifactUpdate": {**update, "lastChunk": True}})
    out.append(status_update(task, events))
    return out


def streamed_artifact_ids(task: Task, events: Sequence[TaskEvent]) -> set[str]:
    """Ids of the artifacts stored events carried (as :func:`event_updates` names them)."""
    ids: set[str] = set()
    for ev in events:
        if ev.kind == "artifact":
            upd = _artifact_update(_loads_obj(ev.body) or {})
            if upd is not None:
                ids.add(_aid(upd[0], f"{task.id}-ev{ev.seq}"))
    return ids


def working_update(task: Task, first: TaskEvent) -> dict[str, Any]:
    """The status a turn's claim gave the task (working), said ahead of ``first``, the
    turn's first event, by a stream that did not see the claim on its own; stamped with
    that event's time, the nearest the reader knows."""
    status = {"state": A2A_STATE[TaskState.LEASED], "timestamp": a2a_ts(first.at)}
    return {"statusUpdate": {"taskId": task.id, "contextId": task.context_id, "status": status}}


def status_update(task: Task, events: Sequence[TaskEvent] = ()) -> dict[str, Any]:
    return {
        "statusUpdate": {
            "taskId": task.id,
            "contextId": task.context_id,
            "status": status_of(task, events),
        }
    }
