"""The taint window: after peer text enters an agent's context, risky calls go to the operator.

No model can be trusted to ignore what it has read, and a message from another agent is
exactly what an injection would arrive as. So when peer text reaches the model (through
a hook, the ``inbox`` tool or a channel), the window opens: the agent's next K risky
tool calls (writes outside the project, pushes, deletions, network egress, or the
operator's own patterns; :mod:`melchior.policy.taint` judges each) are put to the
operator by the agent's ``PreToolUse`` hook before they run.

How the operator is asked depends on what the agent's hook system can do, as checked
against the real CLIs:

* Claude Code answers ``permissionDecision: "ask"`` with a permission prompt showing the
  reason (in ``-p`` mode, where nobody can answer, the call is refused). Each ask uses
  up one of the K calls: the operator has decided it.
* Codex ignores ``ask`` (the call would simply run), so there the call is *denied* with
  the reason, and a denial does not use up the window: it stays open until the
  operator's next prompt, which is the operator's answer.

Only the operator's configuration sets K and the patterns; new peer text can reopen the
window but never shorten it, and nothing here ever answers ``allow``.
"""

from __future__ import annotations

from typing import NamedTuple

from melchior.policy.decision import Decision
from melchior.policy.taint import Rules, ToolCall, risk, window

TAINT_CALLS = 3
"""Risky calls put to the operator after peer text, unless configured otherwise."""
MAX_TAINT_CALLS = 1000


class Verdict(NamedTuple):
    """What the PreToolUse hook answers: nothing, ``ask`` or ``deny``, and why."""

    decision: str | None
    reason: str
    judged: Decision


class TaintWindow:
    """One session's window: how many risky calls still go to the operator, and why."""

    def __init__(self, calls: int = TAINT_CALLS, rules: Rules | None = None) -> None:
        if (
            isinstance(calls, bool)
            or not isinstance(calls, int)
            or not 0 <= calls <= MAX_TAINT_CALLS
        ):
            raise ValueError(f"taint calls must be a whole number from 0 to {MAX_TAINT_CALLS}")
        self.calls = calls
        self.rules = rules if rules is not None else Rules()
        self.remaining = 0
        self.source: str | None = None
        self.asked = 0

    def open(self, source: str) -> None:
        """Peer text from ``source`` reached the model: the next K risky calls are vetted.
        Reopening never shortens a window already open."""
        if self.calls == 0:
            return
        self.remaining = max(self.remaining, self.calls)
        self.source = source

    def operator_spoke(self, *, deny_mode: bool) -> None:
        """The operator's own prompt: where calls are denied rather than asked (Codex),
        this is the operator's answer, and the window closes."""
        if deny_mode:
            self.remaining = 0
            self.source = None

    def judge(self, call: ToolCall, *, project: str, home: str | None, deny_mode: bool) -> Verdict:
        judged = risk(call, self.rules, project=project, home=home)
        decided = window(self.remaining, judged, source=self.source or "another agent")
        if decided.allowed:
            return Verdict(None, decided.reason, judged)
        self.asked += 1
        if deny_mode:
            reason = (
                f"{decided.reason}. This agent cannot ask the operator mid-call, so the call "
                "was not run: say what you want to run and why, and the operator's next "
                "prompt decides"
            )
            return Verdict("deny", reason, judged)
        self.remaining -= 1
        return Verdict("ask", decided.reason, judged)
