"""Names: session ids, projects, addresses and where a project's sockets live.

Everything that turns an environment into a path is here, so that the rules which keep
the registry safe (a private directory, ids never reused, socket paths that fit in
``sun_path``) are decided once and tested once. Nothing here opens a socket.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from melchior import names_core
from melchior.names_core import (
    ENV_ID,
    ENV_PARENT,
    ENV_PROJECT,
    ENV_TOKEN,
    GREEK,
    LOCK_FILE,
    MAX_ID_LEN,
    MAX_PROJECT_LEN,
    ROLES,
    SUN_PATH_MAX,
    USED_FILE,
    NamingError,
    check_id,
    check_project,
    is_id,
    project_key,
)
from melchior.names_core import _check_private_dir as _check_private_dir_str

__all__ = [
    "ENV_ID",
    "ENV_PARENT",
    "ENV_PROJECT",
    "ENV_TOKEN",
    "GREEK",
    "LOCK_FILE",
    "MAX_ID_LEN",
    "MAX_PROJECT_LEN",
    "ROLES",
    "SUN_PATH_MAX",
    "USED_FILE",
    "NamingError",
    "check_id",
    "check_project",
    "is_id",
    "project_key",
]


def derive_project(cwd: Path) -> str:
    """The project a working tree is: its top directory's name, made safe.

    The top is the nearest ancestor holding ``.git``; without one, the directory
    itself. Characters a path component cannot safely hold become ``-``.
    """
    top = cwd.resolve()
    for candidate in (top, *top.parents):
        if (candidate / ".git").exists():
            top = candidate
            break
    raw = top.name or "root"
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", raw).replace("..", "-").lstrip("._-")
    safe = safe.encode()[:MAX_PROJECT_LEN].decode(errors="ignore").rstrip("-") or "root"
    return check_project(safe)


def project_from(env: Mapping[str, str], cwd: Path) -> str:
    explicit = env.get(ENV_PROJECT)
    if explicit is not None and explicit != "":
        try:
            return check_project(explicit)
        except NamingError as exc:
            raise NamingError(f"{ENV_PROJECT}: {exc}") from None
    return derive_project(cwd)


class Address(NamedTuple):
    """``project/role/id``: how a message names its sender to a reader."""

    project: str
    role: str
    id: str

    def __str__(self) -> str:
        return f"{self.project}/{self.role}/{self.id}"

    @classmethod
    def parse(cls, text: str) -> Address:
        parts = text.split("/")
        if len(parts) != 3 or not all(parts):
            raise NamingError(f"{text!r} is not an address; expected project/role/id")
        return cls(check_project(parts[0]), parts[1], parts[2])


OPERATOR_ROLE = "operator"
ANONYMOUS = "-"


# -- the runtime directory ----------------------------------------------------------------


def _check_private_dir(path: Path, *, what: str) -> str | None:
    """Why ``path`` is not a private directory of ours, or None when it is."""
    return _check_private_dir_str(os.fspath(path), what=what)


def fallback_base() -> Path:
    return Path(names_core.fallback_base())


def runtime_base(env: Mapping[str, str]) -> Path:
    """``$XDG_RUNTIME_DIR/melchior``, or ``/tmp/melchior-<uid>`` when that is unusable
    (the rule is :func:`melchior.names_core.runtime_base`)."""
    return Path(names_core.runtime_base(env))


def registry_dir(project: str, env: Mapping[str, str] | None = None) -> Path:
    """The validated directory holding one project's sockets, created if missing (the
    rule, with its ``sun_path`` budget, is :func:`melchior.names_core.registry_dir`)."""
    return Path(names_core.registry_dir(project, env))


# -- ids ----------------------------------------------------------------------------------


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold the registry's lock: minting ids and replacing reports are serialised."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def used_ids(directory: Path) -> set[str]:
    try:
        text = (directory / USED_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return set()
    return {line.strip() for line in text.splitlines() if line.strip()}


def _candidate(words: int) -> str:
    import secrets  # start-up: only minting pays for it

    return "-".join(secrets.choice(GREEK) for _ in range(words))


def choose_id(used: set[str], *, tries: int = 64) -> str:
    """A fresh id not in ``used``: two words while they last, then three, then four."""
    for words in (2, 3, 4):
        for _ in range(tries):
            cand = _candidate(words)
            if cand not in used and len(cand) <= MAX_ID_LEN:
                return cand
    raise NamingError("could not find an unused id; the project's id record is full")


def mint_id(directory: Path) -> str:
    """Mint an id unique in the project and record it so it is never handed out again.

    Ids are never reused so that a stale socket path can never be rebound by a new
    session: "connection refused twice at this name" then always means dead.
    """
    with locked(directory):
        new = choose_id(used_ids(directory) | set(_listed(directory)))
        fd = os.open(
            directory / USED_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600
        )
        try:
            os.write(fd, (new + "\n").encode())
        finally:
            os.close(fd)
    return new


def record_id(directory: Path, session_id: str) -> None:
    """Record an id as used (again): after the directory was lost, its history is gone too."""
    with locked(directory):
        if session_id in used_ids(directory):
            return
        fd = os.open(
            directory / USED_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600
        )
        try:
            os.write(fd, (session_id + "\n").encode())
        finally:
            os.close(fd)


def _listed(directory: Path) -> Iterator[str]:
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        yield name.split(".", 1)[0]


def split_handle(about: object) -> tuple[str, str]:
    """A question handle ``<callee-id>@<message-id>`` (as ``ask`` returns it) → (callee,
    message id); :class:`NamingError` saying what a handle looks like otherwise. The one
    parser of handles, for the tool and for serve."""
    if not isinstance(about, str) or about.count("@") != 1:
        raise NamingError(
            f"{about!r} is not a question handle; expected <callee-id>@<message-id> as 'ask' "
            "returned it"
        )
    callee, mid = about.split("@")
    if not is_id(callee) or not mid:
        raise NamingError(f"{about!r} is not a question handle <callee-id>@<message-id>")
    return callee, mid


def is_enoent(exc: OSError) -> bool:
    return exc.errno == errno.ENOENT
