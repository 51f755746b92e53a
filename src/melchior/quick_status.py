"""``melchior tool --verb=status`` (a session asking about itself) on its shortest path.

A harness execs the tool once per request and ``status`` is its most frequent verb, so
start-up is most of what it costs. :func:`melchior.tool.perform` imports the whole
vocabulary, the walls, the envelope, pathlib and typing to answer it (~3.5x a bare
interpreter); the common case needs none of them: the caller's own socket, one call
and one reply.

This module answers that case only when it is sure the general path would give the
same answer, on the same rules (:mod:`melchior.names_core` for the registry, the config
reader, the blocking client and the wire's codec for the call). Anything else — no
session id, a project derived from the working tree, a config file the general path
would refuse, a socket that is missing, refused or someone else's, any flag but
``--verb`` — returns
``None`` before a call is made, and :func:`melchior.tool.perform` decides, with its
refusals and side effects as they are. Once a call is made its outcome is the answer:
a refusal from the session or a failed exchange is raised as the general path would.
"""

from __future__ import annotations

import _socket
import os
import stat

from melchior import names_core
from melchior.session.client import CALL_TIMEOUT, Unreachable, call, peer_uid

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (tool start-up)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def _notes_readable(directory: str, sid: str) -> bool:
    """Read the caller's notes as :meth:`Registry.session` does; False where it would raise."""
    for suffix in (".parent", ".role"):
        try:
            with open(names_core.join(directory, sid + suffix), encoding="utf-8") as f:
                f.read()
        except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
            continue
        except Exception:
            return False
    return True


def _config_ok(project: str, env: Mapping[str, str]) -> bool:
    """True when reading ``melchior.talk`` would not refuse (a file may hold an error).

    Most machines have no config file, and checking that costs one ``stat``; a file
    that exists is read by the general path's own reader (tomllib and the walls'
    values: a few ms, still far less than the whole vocabulary).
    """
    value = env.get("XDG_CONFIG_HOME") or ""
    if value and os.path.isabs(value):
        base = value
    else:
        home = env.get("HOME")
        if not home:
            return False
        base = os.path.join(home, ".config")
    try:
        os.stat(os.path.join(base, "melchior", "config.toml"))
    except FileNotFoundError:
        return True
    except Exception:
        return False
    try:
        from melchior.session.config import read_talk

        read_talk(project, env)
    except Exception:
        return False
    return True


def _own_socket(env: Mapping[str, str]) -> tuple[str, str] | None:
    """(the caller's id, its socket path) when the general path would reach it, else None."""
    os.getcwd()  # the general path reads it first; a deleted one fails there, not here
    project = env.get(names_core.ENV_PROJECT)
    sid = env.get(names_core.ENV_ID)
    if not project or not sid or not names_core.is_id(sid):
        return None
    try:
        names_core.check_project(project)
        directory = names_core.registry_dir(project, env)
    except Exception:
        return None
    if not _notes_readable(directory, sid) or not _config_ok(project, env):
        return None
    path = names_core.join(directory, sid)
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return None
    except Exception:
        return None
    return sid, path


def status(flags: Any, env: Mapping[str, str] | None = None) -> list[Any] | None:
    """The result of ``status`` for the calling session, or None: ask the general path.

    Raises :class:`~melchior.wire.calls.Refused` exactly where the general path would
    once the call is made (the session's refusal, a timeout, a dropped connection).
    """
    if flags.verb != "status" or flags.schema:
        return None
    if any(getattr(flags, f) is not None for f in ("who", "message", "sort", "about", "chain")):
        return None
    if getattr(flags, "to", None) is not None or getattr(flags, "page", None) is not None:
        return None
    environ = os.environ if env is None else env
    own = _own_socket(environ)
    if own is None:
        return None
    sid, path = own
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(CALL_TIMEOUT)
        try:
            sock.connect(path)
        except OSError:
            return None  # missing, refused (stale?) or unreachable: the general path probes
        if peer_uid(sock) != os.getuid():
            return None
        try:
            return call(sock, "status", [], sender=sid, who=sid)
        except Unreachable as exc:
            from melchior.envelope import deny

            raise deny(exc.code, exc.reason) from None
    finally:
        sock.close()
