"""``melchior hook EVENT``: the agent's turn hooks, answered by the agent's own bridge.

A coding agent runs this between its tool calls (Claude Code and Codex hooks, with the
hook's JSON on stdin; Codex's ``notify`` with the JSON as the last argument). It finds
the agent's bridge (:mod:`.locate`), asks it over the session socket what to answer
(the bridge keeps the inbox, the turn and the taint window), and prints that answer in
the shape the agent's hook system reads. So everything stateful lives in one process,
and this one stays small: it imports no SDK and no policy, because it runs on every
tool call.

What each event does, and which shape reaches the model (checked against Claude Code
2.1.332 and Codex 0.171.0 driven by a loopback model; see docs/integrations.md):

=================  ==========================================================================
UserPromptSubmit   a new turn (quota count restarts); every waiting message, as
                   ``hookSpecificOutput.additionalContext``
PostToolUse        waiting attention, questions and answers, as additional context
PreToolUse         the taint window: ``permissionDecision`` ``ask`` (Claude Code) or ``deny``
                   (Codex, which ignores ``ask``), and ``deny`` for a send over the quota
Stop               a waiting attention message, question or answer keeps the turn going
                   (Claude Code: Stop ``additionalContext``; Codex: ``decision: block``);
                   otherwise the turn ends
notify             (Codex's notify program) the turn has ended
=================  ==========================================================================

A hook that cannot find its bridge, or whose bridge does not answer, prints nothing and
exits 0 with a note on stderr: a missing bridge must never stop the agent's own work.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

EVENTS = ("SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop", "notify")
AGENTS = ("claude-code", "codex")
HOOK_VERB = "hook"
"""The one socket verb a bridge answers beyond the session's: only from its own hooks."""

MAX_INPUT = 4 * 1024 * 1024
"""Largest hook input read from stdin (a Write of a big file carries its content)."""
MAX_FIELD = 256 * 1024
"""Longest string of the tool input passed on to the bridge. Longer than any the taint
window reads, so a string cut here is still seen as too long, never judged cut short."""
MAX_ITEMS = 128
"""Most items of a list passed on (Codex's argv lists); likewise more than are read."""
SUBJECT_KEYS = ("command", "cmd", "file_path", "notebook_path", "path", "url", "query", "patch",
                "input", "workdir")  # fmt: skip
START_WAIT = 2.0
"""Seconds a turn's first hook waits for a bridge that may still be starting."""
STARTING = frozenset({"SessionStart", "UserPromptSubmit"})
HOOK_TIMEOUT = 10.0
"""Seconds the hook waits for its bridge before giving up quietly."""


# -- what each agent reads ---------------------------------------------------------------


def context_output(event: str, text: str) -> dict[str, Any]:
    """Text the model reads as context (UserPromptSubmit, PostToolUse, SessionStart)."""
    return {"hookSpecificOutput": {"hookEventName": event, "additionalContext": text}}


def pre_tool_output(decision: str, reason: str) -> dict[str, Any]:
    """PreToolUse's answer: ``ask`` or ``deny`` with the reason (never ``allow``)."""
    if decision not in ("ask", "deny"):
        raise ValueError(f"a PreToolUse answer here is ask or deny, never {decision!r}")
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": decision,
            "permissionDecisionReason": reason,
        }
    }


def stop_output(agent: str, text: str) -> dict[str, Any]:
    """Keep the turn going with ``text`` in front of the model, as each agent allows it."""
    if agent == "codex":
        return {"decision": "block", "reason": text}
    return {"hookSpecificOutput": {"hookEventName": "Stop", "additionalContext": text}}


# -- reading the agent's hook input ------------------------------------------------------


def details(
    data: Mapping[str, Any], agent: str, server: str, env: Mapping[str, str]
) -> dict[str, Any]:
    """What the bridge needs from one hook input, with strings bounded."""
    tool_input = data.get("tool_input")
    subject: dict[str, Any] = {}
    if isinstance(tool_input, dict):
        for k in SUBJECT_KEYS:
            v = tool_input.get(k)
            if isinstance(v, str):
                subject[k] = v[:MAX_FIELD]
            elif isinstance(v, list) and all(isinstance(x, str) for x in v):
                subject[k] = [x[:MAX_FIELD] for x in v[:MAX_ITEMS]]
    out: dict[str, Any] = {"agent": agent, "server": server, "tool_input": subject}
    for k in ("session_id", "tool_name", "cwd", "turn_id", "thread-id"):
        v = data.get(k)
        if isinstance(v, str):
            out[k.replace("-", "_")] = v[:1024]
    out["stop_hook_active"] = data.get("stop_hook_active") is True
    if env.get("CLAUDE_PROJECT_DIR"):
        out["project_dir"] = env["CLAUDE_PROJECT_DIR"]
    out.setdefault("cwd", os.getcwd())
    out["home"] = env.get("HOME") or str(Path.home())
    out["path"] = env.get("PATH", os.defpath)[:MAX_FIELD]
    return out


def read_input(payload: str | None, stdin: Any) -> dict[str, Any]:
    """The hook's JSON: from stdin for hooks, the last argument for Codex's notify."""
    raw = payload if payload is not None else stdin.read(MAX_INPUT + 1)
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    if not raw.strip():
        return {}
    if len(raw) > MAX_INPUT:
        raise ValueError(f"the hook input is over {MAX_INPUT} bytes")
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("the hook input is not a JSON object")
    return data


# -- finding and asking the bridge -------------------------------------------------------


def find_bridge(env: Mapping[str, str], data: Mapping[str, Any]) -> tuple[Path, str] | None:
    """(registry, session id) of this agent's bridge, or None (see :mod:`.locate`)."""
    from melchior import names
    from melchior.integrations import locate
    from melchior.session.registry import Registry

    session = data.get("session_id") or data.get("thread-id")
    cwds = [Path.cwd()]
    if isinstance(data.get("cwd"), str) and os.path.isabs(data["cwd"]):
        cwds.append(Path(data["cwd"]))
    seen: set[Path] = set()
    for cwd in cwds:
        try:
            reg = Registry.open(names.project_from(env, cwd), env)
        except names.NamingError:
            continue
        if reg.dir in seen:
            continue
        seen.add(reg.dir)
        direct = env.get(names.ENV_ID)
        if direct and names.is_id(direct) and reg.is_listed(direct):
            return reg.dir, direct
        for k in locate.candidates(env, session if isinstance(session, str) else None, os.getpid()):
            sid = locate.read(reg.dir, k)
            if sid is not None and reg.is_listed(sid):
                return reg.dir, sid
    return None


def ask_bridge(registry: Path, sid: str, event: str, info: dict[str, Any]) -> Any:
    from melchior.session.client import call, connect

    sock = connect(registry / sid, who=sid, timeout=HOOK_TIMEOUT)
    try:
        result = call(sock, HOOK_VERB, [event, info], sender=sid, who=sid)
    finally:
        sock.close()
    first = result[0] if result else {}
    return first.get("output") if isinstance(first, dict) else None


def run(
    event: str,
    *,
    agent: str,
    server: str,
    payload: str | None,
    env: Mapping[str, str],
    stdin: Any,
    stdout: Any,
    stderr: Any,
) -> int:
    """One hook: read, ask the bridge, print its answer. Never fails the agent's work."""
    from melchior.session.client import Unreachable
    from melchior.wire.calls import Refused

    try:
        data = read_input(payload, stdin)
    except (ValueError, UnicodeDecodeError) as exc:
        print(f"melchior hook {event}: ignored unreadable input: {exc}", file=stderr)
        return 0
    found = find_bridge(env, data)
    if found is None and event in STARTING:
        # The agent may run its first prompt's hook while it is still starting its MCP
        # servers (Codex starts them in the background): give the bridge a moment.
        import time

        deadline = time.monotonic() + START_WAIT
        while found is None and time.monotonic() < deadline:
            time.sleep(0.1)
            found = find_bridge(env, data)
    if found is None:
        print(
            f"melchior hook {event}: no melchior bridge found for this agent (is 'melchior mcp' "
            "configured as one of its MCP servers?)",
            file=stderr,
        )
        return 0
    registry, sid = found
    try:
        output = ask_bridge(registry, sid, event, details(data, agent, server, env))
    except (Unreachable, Refused, OSError) as exc:
        print(f"melchior hook {event}: bridge {sid} did not answer: {exc}", file=stderr)
        return 0
    if output:
        stdout.write(json.dumps(output, ensure_ascii=False) + "\n")
        stdout.flush()
    return 0


def main_streams() -> tuple[Any, Any, Any]:
    return sys.stdin.buffer, sys.stdout, sys.stderr
