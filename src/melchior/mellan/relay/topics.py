"""The names of the topics a relay's wake-ups are published on.

Below both the store (which publishes after COMMIT what it wrote: a task changed, a
receiver has work, the audit log grew, the outbox has rows) and the parts of the relay
that wait (streams, claims, the push deliverer, the dashboard): a name here is the one
spelling both sides agree on, without the store importing the relay's wake-up machinery
(:mod:`.notify`, which re-exports these for its waiters).
"""

from __future__ import annotations


def receiver_topic(workspace: str, agent_id: str) -> str:
    return f"receiver:{workspace}/{agent_id}"


def task_topic(task_id: str) -> str:
    return f"task:{task_id}"


def task_stop_topic(task_id: str) -> str:
    """Woken, besides :func:`task_topic`, when a task reaches a state where a blocking
    SendMessage stops waiting: it ended (succeeded, failed, cancelled) or asks for input.
    The blocking send waits here, not on every change: its task's claim and progress
    each woke it to read a row it could not answer with, beside the claim's own answer
    on the path the caller waits for (docs/benchmarks.md, issue 25, the relay's own path)."""
    return f"task-stop:{task_id}"


PUSH_TOPIC = "push"
"""Woken after any commit that changed a task (whose push configs, if any, got outbox rows
in that commit) or made a push row due: the replica's deliverer looks at the outbox."""


def audit_topic(workspace: str) -> str:
    """Woken whenever a workspace's audit log grows (``mellan audit --follow`` waits here)."""
    return f"audit:{workspace}"
