"""Which bridge is *this* agent's: how a hook command finds the session its agent started.

The coding agent starts both: the MCP server (``melchior mcp``, the session) once, and
the hook command (``melchior hook``) between its tool calls. Neither is told the other's
name, so the bridge leaves notes a hook can find by what it does know, in a private
directory beside the sockets::

    <registry>/.harness/pid-4242            "alpha-rho": the agent process that started it
    <registry>/.harness/claude-<uuid>       Claude Code's session id (CLAUDE_CODE_SESSION_ID,
                                            which the agent gives both its MCP servers and hooks)
    <registry>/.harness/session-<id>        the session id a hook reported (a Codex thread id,
                                            which is how Codex's ``notify`` program finds it)

A hook looks in that order of certainty: ``MAGI_MELCHIOR_ID`` when the harness set it
(a forked child's environment names its session outright), then the Claude Code session
id, then the hook input's ``session_id``, then each of its ancestor processes (the
agent is the hook's parent or grandparent, as checked on Claude Code 2.1.332 and
Codex 0.171.0). A note is only a claim: the hook uses it only if that session's socket
is listed, and the bridge removes its notes when it ends. Blocking and small: the hook
runs between every tool call.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from melchior import names

INDEX = ".harness"
MAX_ANCESTORS = 8
"""How far up its process tree a hook looks for the agent that started a bridge."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
MAX_KEY = 128


def key(kind: str, value: str) -> str | None:
    """The note name for one fact (``pid``/``claude``/``session``), or None if unusable."""
    value = value.strip()
    if not value or len(value) > MAX_KEY or _UNSAFE.search(value) or value in (".", ".."):
        return None
    return f"{kind}-{value}"


def index_dir(registry: Path) -> Path:
    path = registry / INDEX
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    return path


def bridge_keys(env: Mapping[str, str], ppid: int) -> list[str]:
    """The notes a bridge leaves when it starts: its parent's pid, and the agent's session."""
    found = [key("pid", str(ppid)) if ppid > 1 else None]
    found.append(key("claude", env.get("CLAUDE_CODE_SESSION_ID", "")))
    return [k for k in found if k is not None]


def write(registry: Path, keys: Iterable[str], session_id: str) -> list[str]:
    """Leave notes naming ``session_id``; returns the ones written."""
    from melchior.files import atomic_write

    d = index_dir(registry)
    done = []
    for k in keys:
        atomic_write(d / k, f"{session_id}\n".encode())
        done.append(k)
    return done


def remove(registry: Path, keys: Iterable[str], session_id: str) -> None:
    """Remove our notes, but never one that now names another session."""
    d = registry / INDEX
    for k in keys:
        with contextlib.suppress(OSError):
            if (d / k).read_text(encoding="utf-8").strip() == session_id:
                os.unlink(d / k)


def read(registry: Path, k: str) -> str | None:
    try:
        text = (registry / INDEX / k).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if names.is_id(text) else None


def ancestors(pid: int, depth: int = MAX_ANCESTORS) -> Iterator[int]:
    """``pid``'s parent, grandparent, … (Linux /proc; elsewhere ``ps``)."""
    for _ in range(depth):
        parent = _parent(pid)
        if parent is None or parent <= 1:
            return
        yield parent
        pid = parent


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2 :].split()[1])
    except FileNotFoundError:
        pass
    except (OSError, ValueError, IndexError):
        return None
    if not Path("/proc/self").exists():
        import subprocess

        try:
            out = subprocess.run(
                ["ps", "-o", "ppid=", "-p", str(pid)], capture_output=True, timeout=5, check=False
            ).stdout
            return int(out.strip() or b"0") or None
        except (OSError, ValueError, subprocess.SubprocessError):
            return None
    return None


def candidates(env: Mapping[str, str], session: str | None, pid: int) -> Iterator[str]:
    """Note names to try for a hook, most certain first."""
    for k in (
        key("claude", env.get("CLAUDE_CODE_SESSION_ID", "")),
        key("session", session or ""),
    ):
        if k is not None:
            yield k
    for p in ancestors(pid):
        k = key("pid", str(p))
        if k is not None:
            yield k
