"""The registry is a directory: one socket per live session, and a few sidecar notes.

    <dir>/alpha-rho              the session's socket, named by its id and nothing else
    <dir>/iota-mu.parent         "alpha-rho": written by the child before it listens
    <dir>/iota-mu.role           "main" or "sub": written by a forked child
    <dir>/iota-mu.report         its latest report (JSON; older files are plain text)
    <dir>/.used                  every id ever minted here, so none is reused
    <dir>/.minted/<minter>/<id>  the secret a fork handed out, kept by whoever minted it

There is no list to keep consistent: a session that died did not get to remove
itself, so an entry is only a claim until a connect proves it (see :func:`probe`).
Blocking I/O only, because ``melchior tool`` reads this and must start fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal, NamedTuple

from melchior import names
from melchior.files import atomic_write
from melchior.policy.walls import Role, Session

Liveness = Literal["live", "stale", "gone"]

STALE_PAUSE = 0.05
"""Seconds between the two refused connects that make a socket stale."""


class Minted(NamedTuple):
    """What ``melchior fork`` recorded for a child it named."""

    id: str
    parent: str
    role: Role
    token: str


def _read_note(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        return None
    if text.startswith('"'):
        with contextlib.suppress(ValueError):
            loaded = json.loads(text)
            if isinstance(loaded, str):
                text = loaded
    return text or None


class Registry:
    """One project's directory, read and written with the hygiene rules in one place."""

    def __init__(self, directory: Path, project: str) -> None:
        self.dir = directory
        self.project = project

    @classmethod
    def open(cls, project: str, env: Mapping[str, str] | None = None) -> Registry:
        return cls(names.registry_dir(project, env), project)

    def path(self, session_id: str) -> Path:
        return self.dir / session_id

    # -- reading ------------------------------------------------------------------------

    def listed(self) -> list[str]:
        """Ids with a socket entry, sorted; entries are claims, not proof of life."""
        out = []
        try:
            entries = list(os.scandir(self.dir))
        except FileNotFoundError:
            return []
        for entry in entries:
            if not names.is_id(entry.name):
                continue
            try:
                if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                    out.append(entry.name)
            except FileNotFoundError:
                continue
        return sorted(out)

    def parent_of(self, session_id: str) -> str | None:
        parent = _read_note(self.dir / f"{session_id}.parent")
        return parent if parent is not None and names.is_id(parent) else None

    def role_of(self, session_id: str, parent: str | None) -> Role:
        note = _read_note(self.dir / f"{session_id}.role")
        if note == "main":
            return "main"
        if note == "sub":
            return "sub"
        return "main" if parent is None else "sub"

    def session(self, session_id: str) -> Session:
        parent = self.parent_of(session_id)
        return Session(session_id, self.project, self.role_of(session_id, parent), parent)

    def tree(self) -> dict[str, Session]:
        """Every listed session, plus the ancestors their notes name (dead or not).

        Gone ancestors stay in the tree so that a dead parent does not change which
        instance its surviving children belong to.
        """
        tree: dict[str, Session] = {}
        pending = self.listed()
        while pending:
            sid = pending.pop()
            if sid in tree:
                continue
            node = self.session(sid)
            tree[sid] = node
            if node.parent is not None and node.parent not in tree:
                pending.append(node.parent)
        return tree

    def ancestry_tree(self, *nodes: Session) -> dict[str, Session]:
        """Just the given sessions and their ancestors: all the walls need for one pair.

        Reading two notes per ancestor instead of the whole directory keeps a call's
        wall check cheap in a project with a thousand live sessions.
        """
        tree: dict[str, Session] = {}
        for start in nodes:
            node = start
            while node.id not in tree:
                tree[node.id] = node
                if node.parent is None:
                    break
                node = tree.get(node.parent) or self.session(node.parent)
        return tree

    def is_listed(self, session_id: str) -> bool:
        """Is there a socket entry for this id? (A claim; a connect proves it.)"""
        try:
            return stat.S_ISSOCK(os.lstat(self.path(session_id)).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    # -- liveness -----------------------------------------------------------------------

    def probe(self, session_id: str, *, pause: Callable[[], None] | None = None) -> Liveness:
        return probe(self.path(session_id), pause=pause)

    def answering(self, ids: list[str]) -> set[str]:
        """Which of ``ids`` answer a connect now; stale entries are removed (see :func:`sweep`)."""
        return sweep({sid: self.path(sid) for sid in ids})

    # -- notes ----------------------------------------------------------------------------

    def write_notes(self, session_id: str, parent: str, role: Role) -> None:
        atomic_write(self.dir / f"{session_id}.role", f"{role}\n".encode())
        atomic_write(self.dir / f"{session_id}.parent", f"{parent}\n".encode())

    # -- minted secrets -------------------------------------------------------------------

    def _minted_dir(self, minter: str) -> Path:
        return self.dir / ".minted" / minter

    def record_minted(self, minted: Minted) -> None:
        d = self._minted_dir(minted.parent)
        d.parent.mkdir(mode=0o700, exist_ok=True)
        d.mkdir(mode=0o700, exist_ok=True)
        body = {"id": minted.id, "parent": minted.parent, "role": minted.role}
        body["token"] = minted.token
        atomic_write(d / minted.id, json.dumps(body).encode())

    def minted(self, minter: str, child: str) -> Minted | None:
        try:
            data = json.loads((self._minted_dir(minter) / child).read_text(encoding="utf-8"))
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return None
        role = data.get("role")
        if not isinstance(data.get("token"), str) or role not in ("main", "sub"):
            return None
        return Minted(child, minter, "main" if role == "main" else "sub", data["token"])


def probe(path: Path, *, pause: Callable[[], None] | None = None) -> Liveness:
    """Is a socket entry answered? Stale (and removed) only after two refusals.

    ECONNREFUSED alone does not mean dead: a socket between bind and listen says
    the same. We publish only after listen, but a second try ~50 ms later costs
    nothing and covers anyone who does not. The entry is unlinked only if its inode
    is still the one first seen, so a replacement published meanwhile survives.
    """
    wait = pause if pause is not None else (lambda: time.sleep(STALE_PAUSE))
    try:
        first = os.lstat(path)
    except FileNotFoundError:
        return "gone"
    if not stat.S_ISSOCK(first.st_mode):
        return "gone"
    for attempt in range(2):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Non-blocking: a full backlog answers EAGAIN at once (busy, so live) instead of
        # holding a blocking connect until the peer gets round to accepting.
        s.setblocking(False)
        try:
            s.connect(os.fspath(path))
            return "live"
        except ConnectionRefusedError:
            if attempt == 0:
                wait()
        except FileNotFoundError:
            return "gone"
        except BlockingIOError:
            return "live"  # a full backlog is busy, not dead
        finally:
            s.close()
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return "gone"
    if (now.st_ino, now.st_dev) != (first.st_ino, first.st_dev):
        # Someone published a new socket here meanwhile: it is theirs to keep.
        return "live" if _connects(path) else "stale"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return "stale"


def sweep(paths: Mapping[str, Path], *, pause: Callable[[], None] | None = None) -> set[str]:
    """Which of many socket entries are answered; the rest are stale (removed) or gone.

    One non-blocking connect per entry (a full backlog is busy, not dead); only the
    refused ones wait, all together, for :data:`STALE_PAUSE` and then go through
    :func:`probe` (a second refusal, the inode guard). So a listing of a thousand
    live sessions costs a thousand connects and no sleep, and each killed session
    costs one shared pause, not one each.
    """
    wait = pause if pause is not None else (lambda: time.sleep(STALE_PAUSE))
    live: set[str] = set()
    refused: list[str] = []
    for key, path in paths.items():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(os.fspath(path))
            live.add(key)
        except BlockingIOError:
            live.add(key)
        except ConnectionRefusedError:
            refused.append(key)
        except OSError:
            pass  # gone (ENOENT), or not a socket we may use: not listed as reachable
        finally:
            s.close()
    if refused:
        wait()
        for key in refused:
            # The shared pause was the gap after the first refusal; probe's own is not needed.
            if probe(paths[key], pause=lambda: None) == "live":
                live.add(key)
    return live


def _connects(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect(os.fspath(path))
        return True
    except BlockingIOError:
        return True  # a full backlog: busy, not dead
    except OSError:
        return False
    finally:
        s.close()
