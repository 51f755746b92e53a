"""How the relay's HTTP surfaces refuse and fail: one error, one JSON shape, one set of handlers.

Every refusal says why: ``{"error": {"code", "reason", "rule"}}``, where ``code`` is
stable for scripts and ``reason`` is a sentence a user can act on; a database outage is a
503 that says truthfully whether anything changed; a bug is a 500 in the same shape (and
a traceback in the log); a client that went away is one access-log line. :data:`HANDLERS`
are the ``/api`` mount's; the A2A and dashboard mounts use :func:`client_gone` and
:func:`unavailable_reason` in their own.

Below every surface (:mod:`.http`, :mod:`.a2a`, :mod:`.dashboard`, :mod:`.presence`): it
knows the store's errors and a policy decision, never the replica (:mod:`.context`), so a
surface and the shared request helpers of :mod:`.http` import it without a cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from melchior.mellan.rawjson import encode
from melchior.mellan.relay.observe import CLIENT_CLOSED
from melchior.mellan.relay.store.base import Conflict, NotFoundError, StoreError, StoreUnavailable
from melchior.policy.decision import Decision

log = logging.getLogger("melchior.mellan")


class ApiError(Exception):
    """A refusal to answer with: HTTP status, stable code, a reason a user can act on, and
    the rule that decided it (the code, unless a policy :class:`Decision` names its own)."""

    def __init__(
        self,
        status: int,
        code: str,
        reason: str,
        extra: dict[str, Any] | None = None,
        *,
        rule: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.code = code
        self.reason = reason
        self.extra = extra or {}
        self.rule = rule or code

    @classmethod
    def of(cls, status: int, decision: Decision, code: str | None = None, **extra: Any) -> ApiError:
        """The refusal a policy decision made, with its rule and its sentence."""
        return cls(status, code or decision.rule, decision.reason, extra, rule=decision.rule)


class JSON(Response):
    media_type = "application/json"

    def __init__(self, content: Any, status_code: int = 200) -> None:
        super().__init__(encode(content).encode("utf-8"), status_code=status_code)


def error_response(
    status: int, code: str, reason: str, extra: dict[str, Any] | None = None, rule: str = ""
) -> JSON:
    body: dict[str, Any] = dict(extra or {})
    body["error"] = {"code": code, "reason": reason, "rule": rule or code}
    return JSON(body, status)


def unavailable_reason(exc: BaseException) -> str:
    """What a 503 may truthfully say: nothing changed, unless the connection was lost while
    the change was being committed (then it may have taken effect)."""
    if getattr(exc, "unclear", False):
        return (
            "the relay lost its database while committing this request, so it may or may not "
            "have taken effect; check (e.g. list it) before you retry"
        )
    return (
        "the relay cannot reach its database right now; nothing was changed by this request, "
        "retry shortly"
    )


# -- the API's exception handlers (one Mount, one place; see melchior.mellan.relay.server.app)
# ---------


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.reason, exc.extra, exc.rule)


async def store_error(request: Request, exc: Exception) -> Response:
    """The store's refusals: unavailable (503, said truthfully), already exists (409),
    names something unknown (404). Drivers' errors never get here: a store wraps them."""
    if isinstance(exc, StoreUnavailable):
        log.warning("database unavailable during %s %s: %s", request.method, request.url.path, exc)
        return error_response(503, "database-unavailable", unavailable_reason(exc))
    if isinstance(exc, Conflict):
        return error_response(409, "exists", f"{exc}; ids are stable, pick another one")
    if isinstance(exc, NotFoundError):
        return error_response(404, "not-found", str(exc))
    return await internal_error(request, exc)


async def client_gone(request: Request, exc: Exception) -> Response:
    """A client that disconnected mid-body (:class:`ClientDisconnect`) ends its request
    normally: one access-log line with :data:`CLIENT_CLOSED`, nothing else."""
    return Response(status_code=CLIENT_CLOSED)


async def internal_error(request: Request, exc: Exception) -> Response:
    """A bug is still an answer in the API's shape (and a traceback in the relay log)."""
    log.exception("unexpected error in %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(
        500,
        "internal",
        f"the relay failed unexpectedly ({type(exc).__name__}); the relay log has the details. "
        "Writes are single transactions, so retrying is safe",
    )


async def route_error(request: Request, exc: Exception) -> Response:
    """Router misses (no such path, wrong method) in the API's JSON error shape."""
    assert isinstance(exc, HTTPException)
    code = {404: "no-such-endpoint", 405: "method-not-allowed"}.get(exc.status_code, "http")
    reason = f"{request.method} {request.url.path}: {exc.detail}; see docs/mellan.md for the API"
    response = error_response(exc.status_code, code, reason)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


HANDLERS: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
    ClientDisconnect: client_gone,
    ApiError: api_error,
    StoreError: store_error,
    HTTPException: route_error,
    Exception: internal_error,
}
"""Exception handlers of the ``/api`` mount: every refusal and failure in one shape."""
