"""The blocking socket client: connect to a session by id, call one verb, read one reply.

Blocking on purpose: ``melchior tool`` is exec'd per request, makes one or two calls
and exits, so an event loop would only cost start-up time. A refused connect is
never taken at its word (see :func:`melchior.session.registry.probe`), and a stale or
missing recipient is an error the caller sees, never a silent success.
"""

from __future__ import annotations

import _socket
import os
import struct

from melchior.wire import frames
from melchior.wire.calls import call as make_call
from melchior.wire.calls import unwrap
from melchior.wire.codec import TYPE_CHECKING, JSONObject, WireError

if TYPE_CHECKING:  # socket (enums, selectors), pathlib and typing cost the tool's start-up
    import socket
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

CALL_TIMEOUT = 30.0
"""Seconds a call may wait for its reply before the caller is told so."""


class Unreachable(Exception):
    """The recipient could not be reached; ``code`` says why (stale, unknown, other-uid, …)."""

    def __init__(self, reason: str, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def peer_uid(sock: _socket.socket) -> int:
    """The uid of the process at the other end, as the kernel saw it at connect()."""
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def connect(
    path: Path,
    *,
    who: str,
    timeout: float = CALL_TIMEOUT,
    pause: Callable[[], None] | None = None,
) -> socket.socket:
    """Connect to the session socket at ``path``; stale entries are found and removed here."""
    import socket

    from melchior.session.registry import probe

    for attempt in range(2):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(os.fspath(path))
        except FileNotFoundError:
            s.close()
            raise Unreachable(f"no session {who} is listening in this project", "unknown") from None
        except ConnectionRefusedError:
            s.close()
            if attempt == 0 and probe(path, pause=pause) == "live":
                continue
            raise Unreachable(
                f"session {who} is stale: its socket is there but nobody answers (its serve "
                "has died); the entry has been removed",
                "stale",
            ) from None
        except OSError as exc:
            s.close()
            raise Unreachable(
                f"cannot connect to {who}: {exc.strerror or exc}", "unreachable"
            ) from None
        if peer_uid(s) != os.getuid():
            s.close()
            raise Unreachable(f"session {who} is served by another user; refused", "other-uid")
        return s
    raise Unreachable(f"session {who} could not be reached", "unreachable")


def request(sock: _socket.socket, msg: JSONObject, *, who: str) -> JSONObject:
    """Send one call and read its reply (raw), turning timeouts into clear errors."""
    try:
        frames.send(sock, msg)
        reply = frames.recv(sock)
    except TimeoutError:
        raise Unreachable(
            f"session {who} did not answer within {sock.gettimeout()} s", "timeout"
        ) from None
    except (ConnectionError, BrokenPipeError) as exc:
        raise Unreachable(f"session {who} dropped the connection: {exc}", "dropped") from None
    if reply is None:
        raise Unreachable(f"session {who} closed the connection without answering", "dropped")
    return reply


def call(
    sock: _socket.socket,
    verb: str,
    args: list[Any],
    *,
    sender: str | None,
    who: str,
    **extra: Any,
) -> list[Any]:
    """Call ``verb`` and return its result list; a refusal raises ``Refused``."""
    fields = dict(extra)
    if sender is not None:
        fields["from"] = sender
    reply = request(sock, make_call(verb, args, **fields), who=who)
    try:
        return unwrap(reply)
    except WireError as exc:
        raise Unreachable(
            f"session {who} sent a reply that is not valid: {exc.reason}", exc.code
        ) from None


def call_once(
    path: Path, verb: str, args: list[Any], *, sender: str | None, who: str, **extra: Any
) -> list[Any]:
    """Connect, call, close."""
    sock = connect(path, who=who)
    try:
        return call(sock, verb, args, sender=sender, who=who, **extra)
    finally:
        sock.close()
