"""What a task route may say, and the session key a bound route gives its tasks: pure.

A route says how one receiving agent runs one capability (seed 002, "Session
resumption"). It is proposed from the destination machine and runs nothing until the
owner approves it, so what it may say is checked before it is stored, each refusal
naming the field and the rule:

- ``unknown-adapter``: the adapter is one of :data:`ADAPTERS` (``melchior.runtimes``);
- ``unknown-capability``: the agent declares the capability (a route for anything else
  would never be used);
- ``fresh-run``: a ``provider`` route starts fresh work per task, so it binds no session;
- ``bad-session`` / ``bad-profile``: identifiers of a safe alphabet and length (they end
  up in a session key, a command line and the dashboard);
- ``relative-cwd``: the working directory is absolute (``mellan connect`` resolves it on
  the machine it runs on; the relay has no idea what "." means there), without control
  characters;
- ``options-too-large``: adapter options are a small JSON object.

Session keys: tasks sharing a ``session_key`` run one at a time, in order (queue rule 3).
A route bound to a session gives every task it runs the key of *that session*, so two
tasks for one Claude Code or Codex session never overlap, whichever A2A context (or
caller) they came from; unbound routes leave the key to the A2A context.
"""

from __future__ import annotations

import re
from collections.abc import Set

from melchior.policy.decision import Decision, allow, refuse

ADAPTERS = ("command", "claude-code", "codex", "pi", "a2a", "provider")
SESSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,255}\Z")
PROFILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
MAX_CWD = 4096
MAX_OPTIONS = 16 * 1024
"""Bytes of a route's adapter options (as JSON text), at most."""

FIELD = {
    "unknown-adapter": "adapter",
    "unknown-capability": "capability",
    "fresh-run": "session",
    "bad-session": "session",
    "bad-profile": "profile",
    "relative-cwd": "cwd",
    "options-too-large": "options",
}
"""The request field each refusal is about."""


def check_route(
    *,
    agent: str,
    capability: str,
    adapter: str,
    declared: Set[str],
    session: str | None,
    cwd: str | None,
    profile: str | None,
    options_bytes: int,
) -> Decision:
    """May ``agent`` propose this route? (The owner still decides whether it applies.)"""
    if adapter not in ADAPTERS:
        return refuse(
            "unknown-adapter",
            f"field 'adapter': {adapter!r} is not an adapter; use one of {', '.join(ADAPTERS)}",
        )
    if capability not in declared:
        return refuse(
            "unknown-capability",
            f"field 'capability': {agent} declares no capability {capability!r}; the owner "
            "declares capabilities with the agent",
        )
    if session is not None:
        if adapter == "provider":
            return refuse(
                "fresh-run",
                "field 'session': a provider route starts a fresh run for every task and "
                "binds no session",
            )
        if not SESSION.match(session):
            return refuse(
                "bad-session",
                "field 'session': a session id is 1-256 letters, digits and . _ : @ + = -",
            )
    if profile is not None and not PROFILE.match(profile):
        return refuse(
            "bad-profile", "field 'profile': a profile name is 1-64 letters, digits and . _ -"
        )
    if cwd is not None and (
        not cwd.startswith("/")
        or len(cwd) > MAX_CWD
        or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in cwd)
    ):
        return refuse(
            "relative-cwd",
            f"field 'cwd': the working directory must be an absolute path of at most "
            f"{MAX_CWD} characters without control characters",
        )
    if options_bytes > MAX_OPTIONS:
        return refuse(
            "options-too-large",
            f"field 'options': adapter options are at most {MAX_OPTIONS} bytes of JSON",
        )
    return allow("self", f"{agent} proposes how it runs {capability} ({adapter})")


def session_key(agent: str, session: str) -> str:
    """The queue's session key of every task a route bound to ``session`` runs."""
    return f"route-session:{agent}:{session}"
