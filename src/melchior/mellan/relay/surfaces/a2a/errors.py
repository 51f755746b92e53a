"""A2A errors, and their two renderings: JSON-RPC error objects and ``google.rpc.Status``.

One exception type per A2A error class so handlers raise what they mean and each
binding renders it the way A2A 1.0 says: JSON-RPC code -32001…-32009 with ``data`` an
array holding a ``google.rpc.ErrorInfo``; HTTP+JSON a ``google.rpc.Status`` body with the
same ErrorInfo and the HTTP status of the spec's table. Authentication failures have no
A2A code (401/403 on HTTP, and on JSON-RPC the HTTP status carries them too).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from starlette.exceptions import HTTPException

from melchior.mellan.relay.store.base import StoreUnavailable

log = logging.getLogger(__name__)

ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
BAD_REQUEST_TYPE = "type.googleapis.com/google.rpc.BadRequest"
DOMAIN = "a2a-protocol.org"
RELAY_DOMAIN = "melchior.dev"

_GRPC_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    408: "DEADLINE_EXCEEDED",
    413: "INVALID_ARGUMENT",
    415: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


class A2AError(Exception):
    """An error a caller receives. ``metadata`` goes into the ErrorInfo; ``violations``
    (field, description) pairs into a ``google.rpc.BadRequest`` detail."""

    code: ClassVar[int] = -32603
    http: ClassVar[int] = 500
    grpc: ClassVar[str] = "INTERNAL"
    reason: ClassVar[str] = "INTERNAL_ERROR"
    domain: ClassVar[str] = DOMAIN
    default_message: ClassVar[str] = "Internal error"

    def __init__(
        self,
        message: str | None = None,
        *,
        metadata: dict[str, str] | None = None,
        violations: list[tuple[str, str]] | None = None,
    ) -> None:
        self.message = message or self.default_message
        self.metadata = dict(metadata or {})
        self.violations = list(violations or [])
        super().__init__(self.message)

    def details(self) -> list[dict[str, Any]]:
        info: dict[str, Any] = {
            "@type": ERROR_INFO_TYPE,
            "reason": self.reason,
            "domain": self.domain,
        }
        if self.metadata:
            info["metadata"] = self.metadata
        out = [info]
        if self.violations:
            out.append(
                {
                    "@type": BAD_REQUEST_TYPE,
                    "fieldViolations": [{"field": f, "description": d} for f, d in self.violations],
                }
            )
        return out

    def headers(self) -> dict[str, str]:
        """HTTP headers the answer carries (both bindings)."""
        return {}

    def jsonrpc_error(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "data": self.details()}

    def rest_body(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.http,
                "status": self.grpc,
                "message": self.message,
                "details": self.details(),
            }
        }


# -- the nine A2A errors (spec §5.4) ---------------------------------------------------------


class TaskNotFound(A2AError):
    code, http, grpc, reason = -32001, 404, "NOT_FOUND", "TASK_NOT_FOUND"
    default_message = "Task not found"


class TaskNotCancelable(A2AError):
    code, http, grpc, reason = -32002, 400, "FAILED_PRECONDITION", "TASK_NOT_CANCELABLE"
    default_message = "Task cannot be canceled"


class PushNotificationNotSupported(A2AError):
    code, http, grpc = -32003, 400, "FAILED_PRECONDITION"
    reason = "PUSH_NOTIFICATION_NOT_SUPPORTED"
    default_message = "Push notifications are not supported by this relay"


class UnsupportedOperation(A2AError):
    code, http, grpc, reason = -32004, 400, "FAILED_PRECONDITION", "UNSUPPORTED_OPERATION"
    default_message = "This operation is not supported"


class ContentTypeNotSupported(A2AError):
    # The spec table says 400; the 1.0 TCK expects 415, which is also what HTTP means.
    code, http, grpc, reason = -32005, 415, "INVALID_ARGUMENT", "CONTENT_TYPE_NOT_SUPPORTED"
    default_message = "Content type not supported"


class InvalidAgentResponse(A2AError):
    code, http, grpc, reason = -32006, 500, "INTERNAL", "INVALID_AGENT_RESPONSE"
    default_message = "The agent's response is not valid A2A"


class ExtendedAgentCardNotConfigured(A2AError):
    code, http, grpc = -32007, 400, "FAILED_PRECONDITION"
    reason = "EXTENDED_AGENT_CARD_NOT_CONFIGURED"
    default_message = "No extended agent card is configured"


class ExtensionSupportRequired(A2AError):
    code, http, grpc, reason = -32008, 400, "FAILED_PRECONDITION", "EXTENSION_SUPPORT_REQUIRED"
    default_message = "A required extension is not supported by the client"


class VersionNotSupported(A2AError):
    code, http, grpc, reason = -32009, 400, "FAILED_PRECONDITION", "VERSION_NOT_SUPPORTED"
    default_message = "A2A version not supported"


# -- JSON-RPC standard errors ----------------------------------------------------------------


class ParseError(A2AError):
    code, http, grpc, reason = -32700, 400, "INVALID_ARGUMENT", "PARSE_ERROR"
    default_message = "Request body is not valid JSON"


class InvalidRequest(A2AError):
    code, http, grpc, reason = -32600, 400, "INVALID_ARGUMENT", "INVALID_REQUEST"
    default_message = "Not a valid JSON-RPC 2.0 request"


class MethodNotFound(A2AError):
    code, http, grpc, reason = -32601, 404, "NOT_FOUND", "METHOD_NOT_FOUND"
    default_message = "Method not found"


class InvalidParams(A2AError):
    code, http, grpc, reason = -32602, 400, "INVALID_ARGUMENT", "INVALID_PARAMS"
    default_message = "Invalid parameters"


class InternalError(A2AError):
    pass


# -- the relay's own refusals (no A2A code of their own) ------------------------------------


class Unauthenticated(A2AError):
    """No usable credential: missing, malformed, unknown, expired or revoked (HTTP 401)."""

    code, http, grpc, reason = -32600, 401, "UNAUTHENTICATED", "UNAUTHENTICATED"
    domain = RELAY_DOMAIN
    default_message = "A valid bearer credential is required"


class Forbidden(A2AError):
    """A known credential that may not do this here (HTTP 403)."""

    code, http, grpc, reason = -32600, 403, "PERMISSION_DENIED", "PERMISSION_DENIED"
    domain = RELAY_DOMAIN
    default_message = "This credential may not do that"


class HopLimit(A2AError):
    """The task would travel further from a person than the hop budget allows."""

    code, http, grpc, reason = -32602, 400, "FAILED_PRECONDITION", "HOP_LIMIT"
    domain = RELAY_DOMAIN
    default_message = "Hop budget exhausted"


class Unavailable(A2AError):
    """The database could not be reached; nothing was written, retry later (HTTP 503)."""

    code, http, grpc, reason = -32603, 503, "UNAVAILABLE", "STORE_UNAVAILABLE"
    domain = RELAY_DOMAIN
    default_message = "The relay's database is unavailable; nothing was stored, retry later"


class QuotaExceeded(A2AError):
    """A send over one of the caller's or the receiver's limits (HTTP 429 with
    ``Retry-After``; :mod:`melchior.policy.send_limits`); nothing was stored. The
    ErrorInfo names the limit and the seconds to wait."""

    code, http, grpc, reason = -32600, 429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"
    domain = RELAY_DOMAIN
    default_message = "Over a send limit; nothing was stored, retry later"

    def __init__(self, message: str, *, limit: str, retry_after: int) -> None:
        super().__init__(message, metadata={"limit": limit, "retryAfter": str(retry_after)})
        self.limit = limit
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class RequestTimeout(A2AError):
    """The request body did not arrive within the relay's deadline (HTTP 408)."""

    code, http, grpc, reason = -32600, 408, "DEADLINE_EXCEEDED", "REQUEST_TIMEOUT"
    domain = RELAY_DOMAIN
    default_message = "The request body did not arrive in time"


class PayloadTooLarge(A2AError):
    code, http, grpc, reason = -32600, 413, "INVALID_ARGUMENT", "PAYLOAD_TOO_LARGE"
    domain = RELAY_DOMAIN
    default_message = "Request body too large"


ALL_A2A: tuple[type[A2AError], ...] = (
    TaskNotFound,
    TaskNotCancelable,
    PushNotificationNotSupported,
    UnsupportedOperation,
    ContentTypeNotSupported,
    InvalidAgentResponse,
    ExtendedAgentCardNotConfigured,
    ExtensionSupportRequired,
    VersionNotSupported,
)


def grpc_status(http: int) -> str:
    return _GRPC_STATUS.get(http, "UNKNOWN")


def translate(exc: Exception) -> A2AError:
    """An unexpected exception as the error a caller may see (details only in the log)."""
    if isinstance(exc, A2AError):
        return exc
    if isinstance(exc, HTTPException):  # a router miss under /a2a (only by method)
        return MethodNotFound(f"{exc.detail}: no A2A operation answers that method here")
    if isinstance(exc, StoreUnavailable):
        if exc.unclear:
            return Unavailable(
                "The relay lost its database while committing; the change may or may not "
                "have been made. Look (GetTask/ListTasks) before retrying"
            )
        return Unavailable()
    log.exception("a2a request failed", exc_info=exc)
    return InternalError("the relay failed to handle this request; it has been logged")
