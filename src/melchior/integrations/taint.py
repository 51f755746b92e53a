"""The taint window: after peer text enters an agent's context, only harmless calls run unasked.

No model can be trusted to ignore what it has read, and a message from another agent is
exactly what an injection would arrive as. So when peer text reaches the model (through
a hook, the ``inbox`` tool or a channel), the window opens, and it stays open until the
operator's next prompt (their answer) or the end of the turn. While it is open, every
tool call that :mod:`melchior.policy.harmless` does not know to be harmless is put to
the operator by the agent's ``PreToolUse`` hook before it runs.

How the operator is asked depends on what the agent's hook system can do, as checked
against the real CLIs:

* Claude Code answers ``permissionDecision: "ask"`` with a permission prompt showing the
  reason (in ``-p`` mode, where nobody can answer, the call is refused). Asking does not
  use the window up. So that peer text cannot bury the operator in prompts, one window
  asks at most K times (the operator's ``taint_calls``); past that each call is denied
  and the turn is stopped (``continue: false``), saying why.
* Codex ignores ``ask`` (the call would simply run), so there the call is *denied* with
  the reason; the operator's next prompt is their answer.

This module is the edge: it does the I/O the pure policy must not — following symlinks
(``os.path.realpath``) and finding programs on the agent's ``PATH`` — and keeps the
window's state. Only the operator's configuration sets K and the patterns; nothing here
ever answers ``allow``.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any, NamedTuple

from melchior.policy import harmless
from melchior.policy.decision import Decision
from melchior.policy.harmless import Facts
from melchior.policy.taint import Rules, ToolCall, judge, needs, window

TAINT_CALLS = 10
"""Calls one window puts to the operator before it stops the turn, unless configured."""
MAX_TAINT_CALLS = 1000
MAX_ROUNDS = 4
"""Rounds of resolving what a judgement reads (a symlink can lead to more paths)."""
MAX_LOOKUPS = 512
"""Most paths and programs looked up for one call; a call needing more is not harmless."""


class Verdict(NamedTuple):
    """What the PreToolUse hook answers: nothing, ``ask`` or ``deny``, why, and whether
    the turn should stop."""

    decision: str | None
    reason: str
    judged: Decision
    stop: bool = False


class TaintWindow:
    """One session's window: open or not, since whose words, and what it has asked."""

    def __init__(self, calls: int = TAINT_CALLS, rules: Rules | None = None) -> None:
        if (
            isinstance(calls, bool)
            or not isinstance(calls, int)
            or not 0 <= calls <= MAX_TAINT_CALLS
        ):
            raise ValueError(f"taint calls must be a whole number from 0 to {MAX_TAINT_CALLS}")
        self.calls = calls
        self.rules = rules if rules is not None else Rules()
        self.source: str | None = None
        self.asked = 0
        self.edited = False

    @property
    def is_open(self) -> bool:
        return self.source is not None

    def open(self, source: str) -> None:
        """Peer text from ``source`` reached the model. More peer text keeps it open (and
        names the newest sender); it never resets what this window has asked."""
        if self.calls == 0:
            return
        self.source = source

    def close(self) -> None:
        """The operator's next prompt (their answer), or the end of the turn."""
        self.source = None
        self.asked = 0
        self.edited = False

    def status(self) -> dict[str, Any]:
        return {"open": self.is_open, "asked": self.asked, "limit": self.calls}

    def judge(
        self,
        call: ToolCall,
        *,
        project: str,
        cwd: str,
        home: str | None,
        path: str,
        server: str,
        deny_mode: bool,
    ) -> Verdict:
        if self.source is None:
            return Verdict(None, "no peer text in the context", _none)
        base = Facts(project, cwd, home, server, terminal=deny_mode)
        judged = judge(call, self.rules, resolve(call, self.rules, base, path))
        decided = window(
            judged,
            source=self.source,
            asked=self.asked,
            limit=None if deny_mode else self.calls,
            edited=self.edited,
        )
        if decided.allowed:
            if judged.rule == harmless.PROJECT_WRITE:
                self.edited = True
            return Verdict(None, decided.reason, judged)
        if not deny_mode and decided.rule != "taint-limit":
            self.edited = True  # the operator may let it run, and it may change the project
        if deny_mode:
            reason = (
                f"{decided.reason}. This agent cannot ask the operator mid-call, so the call "
                "was not run: say what you want to run and why, and the operator's next "
                "prompt decides"
            )
            return Verdict("deny", reason, judged)
        if decided.rule == "taint-limit":
            return Verdict("deny", decided.reason, judged, stop=True)
        self.asked += 1
        return Verdict("ask", decided.reason, judged)


_none = Decision(True, "taint-window", "no peer text in the context")


def resolve(call: ToolCall, rules: Rules, base: Facts, path: str) -> Facts:
    """``base`` with every path the judgement reads resolved and every program found.

    Asks the pure policy what it reads (:func:`melchior.policy.taint.needs`), answers,
    and asks again, so a path reached only through a symlink is resolved as well. What
    stays unanswered (too many lookups) is judged not harmless."""
    resolved: dict[str, str] = {}
    programs: dict[str, str | None] = {}
    facts = base
    for _ in range(MAX_ROUNDS):
        wanted = needs(call, rules, facts)
        if not wanted.paths and not wanted.programs:
            break
        if len(resolved) + len(programs) + len(wanted.paths) + len(wanted.programs) > MAX_LOOKUPS:
            break
        for p in wanted.paths:
            real = _realpath(p)
            if real is not None:
                resolved[p] = real
        for name in wanted.programs:
            programs[name] = which(name, path, base.cwd)
        facts = base._replace(resolved=dict(resolved), programs=dict(programs))
    return facts


def _realpath(path: str) -> str | None:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):  # a NUL byte, a loop the OS refuses
        return None


def which(name: str, path: str, cwd: str) -> str | None:
    """The file the agent's shell would run for ``name`` (resolved), as its ``PATH`` says.

    A relative entry (``.``, or an empty one) names wherever the command runs, which a
    ``cd`` in the line can change: the program is then taken to be there, found or not."""
    for entry in path.split(os.pathsep):
        if not entry.startswith("/"):
            return posixpath.normpath(posixpath.join(cwd, entry or ".", name))
        candidate = posixpath.join(entry, name)
        try:
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return os.path.realpath(candidate)
        except (OSError, ValueError):
            continue
    return None
