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
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

GREEK = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "chi",
    "psi",
    "omega",
)

ENV_PROJECT = "MAGI_MELCHIOR_PROJECT"
ENV_ID = "MAGI_MELCHIOR_ID"
ENV_PARENT = "MAGI_MELCHIOR_PARENT"
ENV_TOKEN = "MAGI_MELCHIOR_TOKEN"

MAX_ID_LEN = 26
"""Longest id we mint; the socket-path budget assumes it."""

MAX_PROJECT_LEN = 64
SUN_PATH_MAX = 107
"""Usable bytes of ``sun_path`` on Linux (108 including the NUL)."""

_WORD = "(?:" + "|".join(GREEK) + ")"
ID_RE = re.compile(rf"^{_WORD}(?:-{_WORD}){{1,3}}$")
PROJECT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
ROLES = ("main", "sub")
USED_FILE = ".used"
LOCK_FILE = ".lock"


class NamingError(ValueError):
    """A name, project or runtime directory that cannot be used, with why and what to do."""


def is_id(text: str) -> bool:
    return len(text) <= MAX_ID_LEN and ID_RE.match(text) is not None


def check_id(text: str) -> str:
    if not is_id(text):
        raise NamingError(
            f"{text!r} is not a session id; ids are two to four Greek letter names joined by "
            "'-' (like 'alpha-rho'), as printed by 'melchior fork' or in 'listening.at'"
        )
    return text


def check_project(name: str) -> str:
    """Validate a project name: it becomes one path component, so it must be one."""
    if not name:
        raise NamingError(f"the project name is empty; set {ENV_PROJECT} to a short name")
    if len(name.encode()) > MAX_PROJECT_LEN:
        raise NamingError(
            f"project name {name[:20]!r}… is {len(name.encode())} bytes; at most "
            f"{MAX_PROJECT_LEN} are allowed"
        )
    if "/" in name or name in (".", "..") or ".." in name:
        raise NamingError(f"project name {name!r} may not contain '/' or '..'")
    if not PROJECT_RE.match(name):
        raise NamingError(
            f"project name {name!r} may only use letters, digits, '.', '_' and '-', "
            "and must start with a letter or digit"
        )
    return name


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
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{what} {path} does not exist"
    except OSError as exc:
        return f"{what} {path} cannot be read: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{what} {path} is not a directory"
    if st.st_uid != os.getuid():
        return f"{what} {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    if st.st_mode & 0o077:
        return (
            f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must be 0700 so other "
            f"users cannot reach the sockets in it (fix: chmod 700 {path})"
        )
    return None


def _ensure_private_dir(path: Path, *, what: str) -> Path:
    """Create ``path`` 0700 if missing; refuse (never repair) one that is not ours.

    A directory we did not make private is refused rather than silently chmod'ed:
    someone else may already have put a socket in it.
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    why = _check_private_dir(path, what=what)
    if why is not None:
        raise NamingError(why)
    return path


def fallback_base() -> Path:
    return Path(f"/tmp/melchior-{os.getuid()}")


def runtime_base(env: Mapping[str, str]) -> Path:
    """``$XDG_RUNTIME_DIR/melchior``, or ``/tmp/melchior-<uid>`` when that is unusable.

    XDG_RUNTIME_DIR is inherited into places it is wrong (sudo, slurm, a logged-out
    ssh), so it is used only when it is a directory we own with mode 0700.
    """
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg) and _check_private_dir(Path(xdg), what="XDG_RUNTIME_DIR") is None:
        return _ensure_private_dir(Path(xdg) / "melchior", what="runtime directory")
    return _ensure_private_dir(fallback_base(), what="fallback runtime directory")


def project_key(project: str) -> str:
    """A short fixed-width stand-in for a project name too long for ``sun_path``."""
    import base64  # start-up: only long project names pay for these
    import hashlib

    digest = hashlib.sha256(project.encode()).digest()
    return "h-" + base64.b32encode(digest).decode().lower()[:12]


def _fits(directory: Path) -> bool:
    # '.<id>.tmp' is the longest name we bind in the directory.
    return len(os.fsencode(directory)) + 1 + MAX_ID_LEN + len("..tmp") <= SUN_PATH_MAX


def registry_dir(project: str, env: Mapping[str, str] | None = None) -> Path:
    """The validated directory holding one project's sockets, created if missing.

    Paths are budgeted for ``sun_path`` up front: a project whose name would not fit
    gets a hashed key, and a base too long even for that falls back to /tmp. A base
    that still does not fit is a clear error, never a truncated path.
    """
    environ = os.environ if env is None else env
    check_project(project)
    base = runtime_base(environ)
    if _fits(base / project):
        return _ensure_private_dir(base / project, what="project registry")
    key = project_key(project)
    if _fits(base / key):
        return _ensure_private_dir(base / key, what="project registry")
    short = fallback_base()
    if short != base and _fits(short / key):
        _ensure_private_dir(short, what="fallback runtime directory")
        for name in (project, key):
            if _fits(short / name):
                return _ensure_private_dir(short / name, what="project registry")
    raise NamingError(
        f"socket paths under {base} would be longer than the {SUN_PATH_MAX} bytes a unix "
        "socket address holds; set XDG_RUNTIME_DIR to a shorter directory"
    )


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
