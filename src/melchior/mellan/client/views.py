"""Typed views of what the relay's A2A entry answers: a task, a stream event, a page.

A view is a small frozen value over the A2A JSON (docs/a2a.md), checked where it is
built: the fields a caller acts on (ids, state) must be strings, or the answer is
refused as :class:`~melchior.mellan.client.errors.RelayError` (``bad-answer``) rather
than handed on to fail later somewhere else. The whole JSON stays in ``raw``, decoded
exactly (:mod:`melchior.mellan.rawjson`: numbers keep their spelling), for anything a
view does not name.

:func:`describe` is the one line a person reads for an event (``mellan send`` prints it,
the MCP bridge shows it to the model); :func:`receipt_of` says what became of a send as
the project's :class:`~melchior.envelope.Receipt`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from melchior.envelope import ANSWERED, DELIVERED, QUEUED, Receipt, receipt
from melchior.mellan.client.errors import BAD_ANSWER, RelayError
from melchior.mellan.sealed_tasks import SealedSend
from melchior.mellan.sealing import MEDIA_TYPE

COMPLETED = "TASK_STATE_COMPLETED"
INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"
AUTH_REQUIRED = "TASK_STATE_AUTH_REQUIRED"
SUBMITTED = "TASK_STATE_SUBMITTED"
WORKING = "TASK_STATE_WORKING"
DONE_BAD = ("TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED")
"""States in which a task ran (or not) and will not answer."""
ENDS = (COMPLETED, INPUT_REQUIRED, AUTH_REQUIRED, *DONE_BAD)
"""States a waiting caller stops at: finished, or waiting for the caller."""


def _bad(what: str) -> RelayError:
    return RelayError(f"the relay's answer is not usable: {what}", code=BAD_ANSWER, said=False)


def text_of(message: Any) -> str:
    """A message's or an artifact's parts as one line of text (data as JSON, files named)."""
    if not isinstance(message, Mapping):
        return ""
    out = []
    parts = message.get("parts")
    for part in parts if isinstance(parts, list) else []:
        if not isinstance(part, Mapping):
            continue
        if "text" in part:
            out.append(str(part["text"]))
        elif part.get("mediaType") == MEDIA_TYPE:  # ciphertext says nothing to a person
            out.append("<sealed>")
        elif "data" in part:
            out.append(json.dumps(part["data"], ensure_ascii=False, default=str))
        elif "url" in part:
            out.append(str(part["url"]))
        elif "raw" in part:
            out.append(f"<{part.get('filename') or 'file'}: {len(str(part['raw']))} base64 chars>")
    return " ".join(out)


def short(state: str) -> str:
    """``TASK_STATE_INPUT_REQUIRED`` → ``input-required``."""
    return state.removeprefix("TASK_STATE_").lower().replace("_", "-")


def _string(value: Any, what: str, *, optional: bool = False) -> str:
    if value is None and optional:
        return ""
    if not isinstance(value, str):
        raise _bad(f"{what} is not a string")
    return value


@dataclass(frozen=True)
class TaskView:
    """One A2A task: ``id``, ``context_id``, ``state`` (``TASK_STATE_…``), ``answer`` (the
    text of its status message), its ``artifacts`` and the whole ``raw`` JSON."""

    id: str
    context_id: str
    state: str
    answer: str
    artifacts: tuple[Mapping[str, Any], ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    text: str = field(default="", repr=False, compare=False)
    """The exact JSON text of the answer it was read from (``SendMessage``'s whole
    ``{"task": …}``, ``GetTask``'s and ``CancelTask``'s task), for a caller that prints
    what the relay said; empty for a task inside a list or an event."""
    seal: SealedSend | None = field(default=None, repr=False, compare=False)
    """A sealed send's keys and binding (``send(..., seal=True)``): ``wait`` opens the
    result with them; ``None`` for a task sent in clear."""

    @classmethod
    def of(cls, data: Any, text: str = "") -> TaskView:
        """The view of a task object; refused (``bad-answer``) when it is not one."""
        if not isinstance(data, Mapping):
            raise _bad("a task is not a JSON object")
        status = data.get("status")
        if not isinstance(status, Mapping):
            raise _bad("the task has no status")
        arts = data.get("artifacts")
        if arts is not None and not isinstance(arts, list):
            raise _bad("the task's artifacts are not a list")
        return cls(
            _string(data.get("id"), "the task id"),
            _string(data.get("contextId"), "the task's contextId", optional=True),
            _string(status.get("state"), "the task's state"),
            text_of(status.get("message")),
            tuple(a for a in arts or [] if isinstance(a, Mapping)),
            data,
            text,
        )

    @property
    def done(self) -> bool:
        """Finished or waiting for the caller: nothing more will happen by itself."""
        return self.state in ENDS

    @property
    def failed(self) -> bool:
        return self.state in DONE_BAD

    @property
    def receipt(self) -> Receipt:
        return receipt_of(self.raw)

    def artifact_text(self) -> str:
        """Every artifact's text, one per line."""
        return "\n".join(text_of(a) for a in self.artifacts)


def receipt_of(task: Mapping[str, Any]) -> Receipt:
    """What became of a send, from the task the relay answered with: ``answered``
    (completed or asking back), ``delivered`` (it ran and failed, or was cancelled or
    rejected), else ``queued`` (accepted, not finished)."""
    status = task.get("status")
    state = str(status.get("state", "")) if isinstance(status, Mapping) else ""
    tid = str(task.get("id")) if task.get("id") is not None else None
    if state in (COMPLETED, INPUT_REQUIRED):
        return receipt(ANSWERED, tid, task=tid, state=state)
    if state in DONE_BAD:
        return receipt(DELIVERED, tid, task=tid, state=state)
    return receipt(QUEUED, tid, task=tid, state=state)


@dataclass(frozen=True)
class TaskEvent:
    """One event of a stream: ``kind`` (``task``, ``statusUpdate``, ``artifactUpdate``,
    or ``message``), its decoded ``raw`` JSON and its exact ``text``; ``state``
    and ``said`` when it carries a status (else empty)."""

    kind: str
    raw: Mapping[str, Any]
    text: str
    state: str = ""
    said: str = ""

    @classmethod
    def of(cls, data: Any, text: str) -> TaskEvent:
        """The event of a stream's ``data``; an error event is not one (the client raises
        it as the relay's refusal), nor is anything else that is not a stream event."""
        if not isinstance(data, Mapping):
            raise _bad("a stream event is not a JSON object")
        for kind in ("task", "statusUpdate", "artifactUpdate", "message"):
            if kind in data:
                break
        else:
            raise _bad("a stream event has none of task, statusUpdate, artifactUpdate, message")
        body = data[kind]
        if not isinstance(body, Mapping):
            raise _bad(f"a stream event's {kind} is not a JSON object")
        if kind == "task":
            task = TaskView.of(body)
            return cls(kind, data, text, task.state, task.answer)
        if kind == "statusUpdate":
            status = body.get("status")
            if not isinstance(status, Mapping):
                raise _bad("a statusUpdate has no status")
            state = _string(status.get("state"), "a statusUpdate's state")
            return cls(kind, data, text, state, text_of(status.get("message")))
        return cls(kind, data, text)

    @property
    def task(self) -> TaskView | None:
        """The task, when this event is the whole task (the first of every stream)."""
        return TaskView.of(self.raw["task"]) if self.kind == "task" else None

    def describe(self) -> str:
        return describe(self.raw)


def describe(event: Mapping[str, Any]) -> str:
    """One line for a person: ``task ID STATE: said``, ``STATE: said``, ``artifact NAME: text``."""

    def status(of: Any) -> Mapping[str, Any]:
        found = of.get("status") if isinstance(of, Mapping) else None
        return found if isinstance(found, Mapping) else {}

    if "task" in event:
        t = event["task"]
        st = status(t)
        line = f"task {t.get('id') if isinstance(t, Mapping) else ''} {short(str(st.get('state')))}"
        said = text_of(st.get("message"))
        return line + (f": {said}" if said else "")
    if "statusUpdate" in event:
        st = status(event["statusUpdate"])
        said = text_of(st.get("message"))
        return short(str(st.get("state"))) + (f": {said}" if said else "")
    if "artifactUpdate" in event:
        update = event["artifactUpdate"]
        art = update.get("artifact") if isinstance(update, Mapping) else None
        art = art if isinstance(art, Mapping) else {}
        name = art.get("name") or art.get("artifactId")
        return f"artifact {name}: {text_of(art)}"
    return json.dumps(event, ensure_ascii=False, default=str)


@dataclass(frozen=True)
class TaskPage:
    """One page of ``ListTasks``: the tasks, newest first, and the token of the next page
    (empty: the last page)."""

    tasks: tuple[TaskView, ...]
    next_page_token: str
    total: int
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, data: Any) -> TaskPage:
        if not isinstance(data, Mapping) or not isinstance(data.get("tasks", []), list):
            raise _bad("a task list is not an object with a list of tasks")
        total = data.get("totalSize", 0)
        return cls(
            tuple(TaskView.of(t) for t in data.get("tasks", [])),
            _string(data.get("nextPageToken"), "nextPageToken", optional=True),
            total if isinstance(total, int) and not isinstance(total, bool) else 0,
            data,
        )


@dataclass(frozen=True)
class Identity:
    """Whom a credential acts as (``GET /api/whoami``): ``kind`` (``agent``, ``owner``),
    ``subject``, ``workspace`` and the credential's id."""

    kind: str
    subject: str
    workspace: str
    credential_id: str
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, data: Any) -> Identity:
        if not isinstance(data, Mapping):
            raise _bad("whoami did not answer a JSON object")
        return cls(
            _string(data.get("kind"), "whoami's kind"),
            _string(data.get("subject"), "whoami's subject"),
            _string(data.get("workspace"), "whoami's workspace"),
            _string(data.get("credential_id"), "whoami's credential_id", optional=True),
            data,
        )
