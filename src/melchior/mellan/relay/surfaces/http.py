"""What the relay's JSON APIs share: bounded JSON bodies, credentials, fields, views, audit.

Three rules live here (or below, re-exported) so that no endpoint can forget them:

* **Every refusal says why.** Errors are ``{"error": {"code", "reason"}}`` where ``code``
  is stable for scripts and ``reason`` is a sentence a user can act on: the error, its
  shape and the ``/api`` mount's handlers are :mod:`.refusals`', below the surfaces
  (the A2A and dashboard packages import them from there, not from here).
* **Payloads are carried faithfully.** Bodies are parsed with exact decimals
  (``parse_float=Decimal``; Python ints are already exact), and stored raw JSON text is
  spliced into responses verbatim (:class:`Raw`), so ``12345678901234567890`` and
  ``0.10000000000000000001`` come out exactly as they went in.
* **A database outage is a 503 with a plain message**, never a 500 with a traceback; each
  store call is one transaction, so nothing is half-written.
"""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

from starlette.requests import Request

from melchior.mellan.rawjson import Raw, whole
from melchior.mellan.relay.auth import identify
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.notify import audit_topic
from melchior.mellan.relay.refusals import HANDLERS as HANDLERS
from melchior.mellan.relay.refusals import JSON as JSON
from melchior.mellan.relay.refusals import ApiError as ApiError
from melchior.mellan.relay.refusals import client_gone as client_gone
from melchior.mellan.relay.refusals import error_response as error_response
from melchior.mellan.relay.refusals import unavailable_reason as unavailable_reason
from melchior.mellan.relay.store.base import (
    CredentialKind,
    Principal,
    StoreUnavailable,
    Task,
    TaskEvent,
)
from melchior.mellan.relay.surfaces.body import BodyError
from melchior.mellan.relay.surfaces.body import read_json as read_json_body

log = logging.getLogger("melchior.mellan")


async def read_json(request: Request, relay: Relay) -> Any:
    """The request body as exact, checked JSON (an empty body reads as ``{}``); every bound
    and refusal is :mod:`melchior.mellan.relay.surfaces.body`'s, answered in this API's error
    shape."""
    try:
        return await read_json_body(request, relay.max_body, relay.body_deadline, empty={})
    except BodyError as exc:
        extra = {"field": exc.path} if exc.path else None
        raise ApiError(exc.status, exc.code, exc.reason, extra) from None


async def read_object(request: Request, relay: Relay) -> dict[str, Any]:
    body = await read_json(request, relay)
    if not isinstance(body, dict):
        raise ApiError(400, "bad-request", "the request body must be a JSON object")
    return body


async def authenticate(request: Request, relay: Relay) -> Principal:
    """The principal behind the request's bearer credential, or a 401 that says what to do."""
    principal, why = await identify(request, relay)
    if why == "missing":
        raise ApiError(
            401,
            "unauthenticated",
            "this endpoint needs a credential: send 'Authorization: Bearer <token>' "
            "(an owner token from the relay's first start, or an agent token from 'mellan join')",
        )
    if principal is None:
        raise ApiError(
            401,
            "bad-credential",
            "the credential is unknown, revoked or expired; log in again or ask the owner "
            "for a new enrollment code",
        )
    return principal


def require_owner(principal: Principal) -> None:
    if principal.kind is not CredentialKind.OWNER:
        raise ApiError(
            403,
            "owner-only",
            "this needs a workspace owner credential; agent credentials may only read "
            "what concerns their own agent",
        )


def require_agent(principal: Principal) -> None:
    if principal.kind is not CredentialKind.AGENT:
        raise ApiError(
            403,
            "agent-only",
            "the receiver API needs an agent credential (get one with 'mellan join CODE')",
        )


def actor(principal: Principal) -> str:
    return f"{principal.kind.value}:{principal.subject}"


# -- small validators for request fields ---------------------------------------------------------


def field_str(
    body: dict[str, Any],
    name: str,
    *,
    required: bool = True,
    default: str = "",
    max_len: int = 256,
) -> str:
    """A string field of at most ``max_len`` characters (the limits are in docs/mellan.md)."""
    value = body.get(name)
    if value is None:
        if required:
            raise ApiError(400, "bad-request", f"field {name!r} is required")
        return default
    if not isinstance(value, str):
        raise ApiError(400, "bad-request", f"field {name!r} must be a string")
    if len(value) > max_len:
        raise ApiError(400, "bad-request", f"field {name!r} is longer than {max_len} characters")
    return value


def field_int(body: dict[str, Any], name: str, default: int | None, lo: int, hi: int) -> int:
    """A whole number in ``lo..hi``, judged by its size before it is converted
    (:func:`melchior.mellan.rawjson.whole`: ``1e1000000`` costs nothing)."""
    value = body.get(name, default)
    if value is None:
        raise ApiError(400, "bad-request", f"field {name!r} is required")
    try:
        return whole(value, lo, hi)
    except ValueError as exc:
        raise ApiError(400, "bad-request", f"field {name!r} {exc}") from None


def field_number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise ApiError(400, "bad-request", f"field {name!r} must be a number")
    if isinstance(value, Decimal) and (not value.is_finite() or value.adjusted() > 300):
        number = float("inf")  # decided from the exponent; no conversion of a huge number
    else:
        number = float(value)
    if not lo <= number <= hi:
        raise ApiError(400, "bad-request", f"field {name!r} must be between {lo:g} and {hi:g}")
    return number


def field_bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError(400, "bad-request", f"field {name!r} must be true or false")
    return value


def query_int(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        return whole(raw, lo, hi, text=True)
    except ValueError as exc:
        raise ApiError(400, "bad-request", f"query parameter {name!r} {exc}") from None


# -- views of stored values ----------------------------------------------------------------------


def raw_or_null(text: str | None) -> Raw | None:
    return Raw(text) if text else None


def task_view(task: Task, *, payload: bool = True) -> dict[str, Any]:
    """A task as JSON; payload, metadata and result are the stored JSON text, verbatim."""
    view: dict[str, Any] = {
        "id": task.id,
        "workspace": task.workspace,
        "caller": task.caller,
        "receiver": task.receiver,
        "capability": task.capability,
        "context_id": task.context_id,
        "state": task.state.value,
        "message_id": task.message_id,
        "session_key": task.session_key,
        "chain": task.chain,
        "hop": task.hop,
        "path": list(task.path),
        "attempt": task.attempt,
        "max_attempts": task.max_attempts,
        "lease_epoch": task.lease_epoch,
        "lease_owner": task.lease_owner,
        "lease_expires_at": task.lease_expires_at,
        "turn": task.turn,
        "metadata": raw_or_null(task.metadata),
        "result": raw_or_null(task.result),
        "error": task.error,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
    }
    if payload:
        view["payload"] = raw_or_null(task.payload)
    return view


def event_view(event: TaskEvent) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "task_id": event.task_id,
        "at": event.at,
        "kind": event.kind,
        "body": raw_or_null(event.body),
    }


async def record(
    relay: Relay,
    workspace: str,
    who: str,
    action: str,
    subject: str,
    allowed: bool,
    rule: str,
    reason: str,
    detail: dict[str, Any] | None = None,
) -> int:
    """Append one decision that changed nothing in the store (a refusal, or a change the
    store cannot record itself) to the audit log and wake ``mellan audit --follow``.

    Queue changes (claim, complete, fail, cancel, lease losses) are *not* recorded here:
    the store writes their records in the same transaction (``actor=``), so a decision
    and its record commit together or not at all. For the rest, the decision was
    committed before this, so if the database drops right now the answer must still tell
    the truth about the decision: the record goes to the relay log and -1 is returned.
    """
    try:
        seq = await relay.call(
            relay.store.audit, workspace, who, action, subject, allowed, rule, reason, detail
        )
    except StoreUnavailable as exc:
        log.error(
            "audit record not stored (database unavailable: %s): workspace=%s actor=%s "
            "action=%s subject=%s allowed=%s rule=%s reason=%s detail=%s",
            exc, workspace, who, action, subject, allowed, rule, reason, detail,
        )  # fmt: skip
        return -1
    relay.notifier.publish(audit_topic(workspace))
    return seq
