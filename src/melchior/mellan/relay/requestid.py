"""The id of the request being served, for logs and the audit records it causes.

A context variable: set once per request by the app's outermost middleware
(:mod:`.observe`), copied into the worker threads that run store calls (Starlette's
thread pool runs each call in a copy of the caller's context), and read where a record
is built (:class:`~.store.base.Record`, the store's notes). Work that belongs to no
request (the lease sweeper, a push delivery) has none. A record built for a request but
written by someone else (the accept batcher writes many requests' tasks in one commit)
carries the id it was built with, not the writer's.
"""

from __future__ import annotations

import re
import uuid
from contextvars import ContextVar

HEADER = "X-Request-Id"
MAX_LENGTH = 128
_SANE = re.compile(r"^[A-Za-z0-9._:/+=@-]{1,128}$")

current_id: ContextVar[str | None] = ContextVar("mellan_request_id", default=None)


def current() -> str | None:
    """The id of the request this code runs for, or None outside any request."""
    return current_id.get()


def new() -> str:
    return uuid.uuid4().hex


def accept(incoming: str | None) -> str:
    """An incoming ``X-Request-Id`` when it is sane (at most 128 visible characters of a
    small set: no spaces, quotes or control characters that could forge a log line),
    else a fresh one. A proxy's id thus follows the request through the relay."""
    if incoming is not None and _SANE.match(incoming):
        return incoming
    return new()
