"""The naming rules the tool's hot path needs, without pathlib or typing.

Session ids, project names and the runtime directory that holds a project's sockets
(a private directory, a fallback when ``XDG_RUNTIME_DIR`` is unusable, socket paths
budgeted for ``sun_path``) are decided here, on plain ``str`` paths, so that
``melchior tool --verb=status`` can resolve its registry without importing pathlib
(~3 ms of every exec). :mod:`melchior.names` re-exports all of it with ``Path``
results; everything else should import it from there.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (tool start-up)
if TYPE_CHECKING:
    from collections.abc import Mapping

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

_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_PROJECT_CHARS = _ALNUM | frozenset("._-")
ROLES = ("main", "sub")
USED_FILE = ".used"
LOCK_FILE = ".lock"


class NamingError(ValueError):
    """A name, project or runtime directory that cannot be used, with why and what to do."""


_WORDS = frozenset(GREEK)


def is_id(text: str) -> bool:
    """Two to four of :data:`GREEK` joined by ``-``, at most :data:`MAX_ID_LEN` long.

    Read by splitting rather than by a regular expression (compiling the alternation of
    24 words costs ~1 ms of every tool exec). It answers as the pattern
    ``^W(?:-W){1,3}$`` did under ``re.match``, whose ``$`` also matched before one
    trailing newline (a property test holds the two together).
    """
    if len(text) > MAX_ID_LEN:
        return False
    words = (text[:-1] if text.endswith("\n") else text).split("-")
    return 2 <= len(words) <= 4 and all(w in _WORDS for w in words)


def check_id(text: str) -> str:
    if not is_id(text):
        raise NamingError(
            f"{text!r} is not a session id; ids are two to four Greek letter names joined by "
            "'-' (like 'alpha-rho'), as printed by 'melchior fork' or in 'listening.at'"
        )
    return text


def _project_chars(name: str) -> bool:
    """``^[A-Za-z0-9][A-Za-z0-9._-]*$`` as ``re.match`` reads it (its ``$`` also matches
    before one trailing newline), without importing re for it."""
    body = name[:-1] if name.endswith("\n") else name
    return bool(body) and body[0] in _ALNUM and all(c in _PROJECT_CHARS for c in body)


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
    if not _project_chars(name):
        raise NamingError(
            f"project name {name!r} may only use letters, digits, '.', '_' and '-', "
            "and must start with a letter or digit"
        )
    return name


# -- the runtime directory ----------------------------------------------------------------


def norm(path: str) -> str:
    """``str(pathlib.PurePosixPath(path))`` without pathlib: repeated slashes and ``.``
    parts dropped, no trailing slash (a leading ``//`` kept, as POSIX allows)."""
    lead = "//" if path.startswith("//") and not path.startswith("///") else "/"
    if not path.startswith("/"):
        lead = ""
    parts = "/".join(p for p in path.split("/") if p and p != ".")
    return lead + parts if lead or parts else "."


def join(directory: str, name: str) -> str:
    """``directory / name`` for a normalised directory and a single path component."""
    return directory + name if directory.endswith("/") else f"{directory}/{name}"


def _check_private_dir(path: str, *, what: str) -> str | None:
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


def _ensure_private_dir(path: str, *, what: str) -> str:
    """Create ``path`` 0700 if missing; refuse (never repair) one that is not ours.

    A directory we did not make private is refused rather than silently chmod'ed:
    someone else may already have put a socket in it.
    """
    try:  # noqa: SIM105 (contextlib is one more import on the tool's path)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    why = _check_private_dir(path, what=what)
    if why is not None:
        raise NamingError(why)
    return path


def fallback_base() -> str:
    return f"/tmp/melchior-{os.getuid()}"


def runtime_base(env: Mapping[str, str]) -> str:
    """``$XDG_RUNTIME_DIR/melchior``, or ``/tmp/melchior-<uid>`` when that is unusable.

    XDG_RUNTIME_DIR is inherited into places it is wrong (sudo, slurm, a logged-out
    ssh), so it is used only when it is a directory we own with mode 0700.
    """
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg) and _check_private_dir(norm(xdg), what="XDG_RUNTIME_DIR") is None:
        return _ensure_private_dir(join(norm(xdg), "melchior"), what="runtime directory")
    return _ensure_private_dir(fallback_base(), what="fallback runtime directory")


def project_key(project: str) -> str:
    """A short fixed-width stand-in for a project name too long for ``sun_path``."""
    import base64  # start-up: only long project names pay for these
    import hashlib

    digest = hashlib.sha256(project.encode()).digest()
    return "h-" + base64.b32encode(digest).decode().lower()[:12]


def _fits(directory: str) -> bool:
    # '.<id>.tmp' is the longest name we bind in the directory.
    return len(os.fsencode(directory)) + 1 + MAX_ID_LEN + len("..tmp") <= SUN_PATH_MAX


def registry_dir(project: str, env: Mapping[str, str] | None = None) -> str:
    """The validated directory holding one project's sockets, created if missing.

    Paths are budgeted for ``sun_path`` up front: a project whose name would not fit
    gets a hashed key, and a base too long even for that falls back to /tmp. A base
    that still does not fit is a clear error, never a truncated path.
    """
    environ = os.environ if env is None else env
    check_project(project)
    base = runtime_base(environ)
    if _fits(join(base, project)):
        return _ensure_private_dir(join(base, project), what="project registry")
    key = project_key(project)
    if _fits(join(base, key)):
        return _ensure_private_dir(join(base, key), what="project registry")
    short = fallback_base()
    if short != base and _fits(join(short, key)):
        _ensure_private_dir(short, what="fallback runtime directory")
        for name in (project, key):
            if _fits(join(short, name)):
                return _ensure_private_dir(join(short, name), what="project registry")
    raise NamingError(
        f"socket paths under {base} would be longer than the {SUN_PATH_MAX} bytes a unix "
        "socket address holds; set XDG_RUNTIME_DIR to a shorter directory"
    )
