"""What an adapter reads for one turn of a claimed task: the envelope, the prompt, the env.

A task is a sequence of turns (docs/mellan-queue.md): when an agent asked back
(``input_required``) and the caller answered, the answer comes back as the next turn of
the same task, with the earlier turns in the lease's ``history``. A bound session (a
Claude Code session, a Codex thread, an A2A task) remembers the conversation, so it gets
the follow-up text alone; a fresh run remembers nothing, so its prompt carries the
earlier turns too.

The caller's words are data, not orders. For adapters that hand the prompt to a model
(``claude-code``, ``codex``, ``pi``, ``provider``) every piece of peer text — the caller's
messages, and earlier answers as the relay recorded them — is fenced with
:meth:`melchior.envelope.Message.fenced` (a random marker the text cannot forge, and who
wrote it). A ``command`` is a program, not a model: it gets the caller's text as it is,
and the conversation as JSON in ``MELLAN_TASK_HISTORY``. The ``a2a`` adapter forwards
the message's parts verbatim and does not use the prompt for structure.

Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from melchior.a2a_message import from_a2a, text_of
from melchior.envelope import Message

MODEL_ADAPTERS = frozenset({"claude-code", "codex", "pi", "provider"})
"""Adapters whose prompt a model reads: peer text is fenced for them."""

HISTORY_ENV_LIMIT = 64 * 1024
"""``MELLAN_TASK_HISTORY`` is set only up to this many bytes (Linux refuses an
environment string over 128 KiB)."""


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _parts_text(message: Any) -> str:
    parts = _obj(message).get("parts")
    return text_of(parts) if isinstance(parts, list) else ""


def envelope(task: Mapping[str, Any], payload: Any) -> Message:
    """The envelope of the task's current turn (the caller's message)."""
    caller = str(task.get("caller") or "unknown")
    receiver = str(task.get("receiver") or "unknown")
    metadata = _obj(task.get("metadata"))
    try:
        msg = from_a2a(_obj(payload), sender=caller, recipient=receiver, metadata=metadata)
    except ValueError:
        # the relay checked the hop chain at the door; a bad one here changes nothing we run
        msg = from_a2a({**_obj(payload), "metadata": {}}, sender=caller, recipient=receiver)
    context = task.get("context_id")
    return msg._replace(
        about=str(task.get("id")),
        context=str(context) if isinstance(context, str) and context else msg.context,
        sort="task" if int(task.get("turn") or 1) == 1 else "answer",
    )


def earlier(history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The earlier turns as plain values: the caller's text, the answer, how it ended."""
    out = []
    for item in history:
        result = _obj(item.get("result"))
        out.append(
            {
                "turn": item.get("turn"),
                "text": _parts_text(item.get("message")),
                "state": item.get("state"),
                "answer": _parts_text(result.get("message")),
                "error": item.get("error"),
            }
        )
    return out


def model_prompt(
    message: Message, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]], fresh: bool
) -> str:
    """The prompt for a model: a plain header, then every piece of peer text fenced."""
    caller, receiver = message.sender, message.recipient
    turn = int(task.get("turn") or 1)
    lines = [
        f"A task for {receiver} from {caller}, through the mellan relay "
        f"(capability {task.get('capability')}, task {task.get('id')}, turn {turn})."
    ]
    if fresh and history:
        lines.append("Earlier turns of this task, as the relay recorded them:")
        for past in earlier(history):
            asked = Message(caller, receiver, past["text"], sort="task").fenced()
            lines += [f"Turn {past['turn']}: {caller} wrote:", asked.text]
            said = past["answer"] or past["error"] or ""
            if said:
                answer = Message(receiver, caller, said, sort="answer").fenced(
                    f"{receiver}(earlier-answer)"
                )
                lines += [f"Turn {past['turn']}: the answer ({past['state']}):", answer.text]
        lines.append(f"Now {caller} writes:")
    elif turn > 1:
        lines.append(f"{caller} answers the question you asked:")
    lines.append(message.fenced().text)
    return "\n".join(lines)


def build(
    adapter: str,
    task: Mapping[str, Any],
    payload: Any,
    history: Sequence[Mapping[str, Any]],
    *,
    fresh: bool,
) -> tuple[Message, str, dict[str, str]]:
    """(envelope, prompt, environment) for one turn of ``task`` run by ``adapter``."""
    message = envelope(task, payload)
    env = {
        "MELLAN_TASK_ID": str(task.get("id")),
        "MELLAN_TASK_TURN": str(task.get("turn") or 1),
        "MELLAN_TASK_ATTEMPT": str(task.get("attempt") or 1),
        "MELLAN_CALLER": message.sender,
        "MELLAN_CAPABILITY": str(task.get("capability") or ""),
    }
    if message.context:
        env["MELLAN_CONTEXT_ID"] = message.context
    env = {k: v.replace("\0", "") for k, v in env.items()}
    if adapter in MODEL_ADAPTERS:
        return message, model_prompt(message, task, history, fresh), env
    if history:
        text = json.dumps(earlier(history), ensure_ascii=False)
        if len(text.encode("utf-8", "surrogatepass")) <= HISTORY_ENV_LIMIT and "\0" not in text:
            env["MELLAN_TASK_HISTORY"] = text
    return message, message.text, env
