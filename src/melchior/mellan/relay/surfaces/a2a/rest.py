"""The HTTP+JSON binding: A2A 1.0 REST paths under the agent's base URL (no ``/v1``).

``POST message:send|message:stream``, ``GET tasks``, ``GET tasks/{id}``,
``POST tasks/{id}:cancel``, ``GET|POST tasks/{id}:subscribe`` (the spec text says
POST, the proto GET; clients use both), ``GET extendedAgentCard``, and a task's
push-notification configs: ``POST|GET tasks/{id}/pushNotificationConfigs`` (create,
list), ``GET|DELETE tasks/{id}/pushNotificationConfigs/{configId}``. Errors are
``google.rpc.Status`` bodies with an ``ErrorInfo`` detail.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from email.utils import format_datetime, parsedate_to_datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.surfaces.a2a import cards, http, jsontext, requests, sse
from melchior.mellan.relay.surfaces.a2a.access import authenticate
from melchior.mellan.relay.surfaces.a2a.errors import (
    A2AError,
    InvalidParams,
    MethodNotFound,
    Unauthenticated,
    translate,
)
from melchior.mellan.relay.surfaces.a2a.ops import OPERATIONS, STREAMING, encoded
from melchior.mellan.relay.surfaces.a2a.paths import Target


def error_response(err: A2AError) -> Response:
    headers = err.headers()
    if isinstance(err, Unauthenticated):
        headers["WWW-Authenticate"] = "Bearer"
    return Response(
        jsontext.dumpb(err.rest_body()), err.http, headers=headers, media_type="application/json"
    )


def _not_here(method: str, rest: tuple[str, ...]) -> MethodNotFound:
    return MethodNotFound(
        f"no A2A operation at {method} {'/'.join(rest) or '(base URL)'}",
        metadata={"path": "/".join(rest), "method": method},
    )


def route(method: str, rest: tuple[str, ...]) -> tuple[str, dict[str, Any], bool]:
    """(operation, params from the path, whether a JSON body is expected)."""
    if rest == ("message:send",) and method == "POST":
        return "SendMessage", {}, True
    if rest == ("message:stream",) and method == "POST":
        return "SendStreamingMessage", {}, True
    if rest == ("extendedAgentCard",) and method == "GET":
        return "GetExtendedAgentCard", {}, False
    if rest == ("tasks",) and method == "GET":
        return "ListTasks", {}, False
    if len(rest) >= 2 and rest[0] == "tasks":
        head = rest[1]
        if len(rest) == 3 and rest[2] == "pushNotificationConfigs":
            if method == "POST":
                return "CreateTaskPushNotificationConfig", {"taskId": head}, True
            if method == "GET":
                return "ListTaskPushNotificationConfigs", {"taskId": head}, False
        if len(rest) == 4 and rest[2] == "pushNotificationConfigs":
            ref = {"taskId": head, "id": rest[3]}
            if method == "GET":
                return "GetTaskPushNotificationConfig", ref, False
            if method == "DELETE":
                return "DeleteTaskPushNotificationConfig", ref, False
        if len(rest) == 2:
            tid, _, verb = head.rpartition(":")
            if tid and verb == "cancel" and method == "POST":
                return "CancelTask", {"id": tid}, False
            if tid and verb == "subscribe" and method in ("GET", "POST"):
                return "SubscribeToTask", {"id": head.rpartition(":")[0]}, False
            if method == "GET" and ":" not in head:
                return "GetTask", {"id": head}, False
    raise _not_here(method, rest)


def _with_path(body: dict[str, Any], path: dict[str, Any]) -> dict[str, Any]:
    """The body with what the path names; a body naming something else is refused, not
    overridden (``taskId`` in both, differing, is a caller's mistake worth saying)."""
    for key, value in path.items():
        given = body.get(key, body.get(requests.SNAKE_OF.get(key, key)))
        if given not in (None, "", value):
            raise InvalidParams(
                f"{key}: the path names {value!r} but the body {given!r}",
                violations=[(key, "differs from the path")],
            )
    return {**body, **path}


async def handle(relay: Relay, request: Request, target: Target) -> Response:
    """Answer one HTTP+JSON request; refusals are raised and rendered by the mount's
    handler as ``google.rpc.Status`` bodies."""
    op_name, params, needs_body = route(request.method, target.rest)
    request.state.route = f"/a2a rest {op_name}"  # a bounded label: A2A operations only
    http.check_version(request)
    body: Any = None
    if needs_body or (request.method == "POST" and http.has_body(request)):
        body = await http.read_json(request, relay, optional=not needs_body)
    if needs_body:
        params = _with_path(body, params) if isinstance(body, dict) and params else body
    elif isinstance(body, dict):
        params = {**body, **params}
    if request.method == "GET":
        params = {**dict(request.query_params), **params}
        params.pop(http.VERSION_HEADER, None)
    caller = await authenticate(relay, request, target)
    result = await OPERATIONS[op_name](relay, caller, params, request)
    if op_name in STREAMING:
        assert not isinstance(result, dict)
        return _stream(result)
    assert isinstance(result, dict)
    chunks = await encoded(relay, op_name, result)
    media = http.response_type(request)
    if op_name == "GetExtendedAgentCard":
        return card_response(
            request,
            b"".join(chunks),
            f"private, max-age={cards.EXTENDED_MAX_AGE}",
            getattr(request.state, "last_modified", cards.STARTED),
        )
    return http.json_response(chunks, media)


def card_response(
    request: Request, content: bytes, cache_control: str, last_modified: datetime
) -> Response:
    """A card with ``ETag`` and ``Last-Modified``, or 304 when the client's copy is current:
    ``If-None-Match`` decides when it is sent (RFC 9110), else ``If-Modified-Since``."""
    tag = cards.etag(content)
    headers = {
        "ETag": tag,
        "Cache-Control": cache_control,
        "Last-Modified": format_datetime(last_modified, usegmt=True),
    }
    if_none_match = request.headers.get("if-none-match")
    if if_none_match is not None:
        tags = [t.strip() for t in if_none_match.split(",")]
        if tag in tags or "*" in tags:
            return Response(status_code=304, headers=headers)
    elif _not_modified_since(request.headers.get("if-modified-since"), last_modified):
        return Response(status_code=304, headers=headers)
    return Response(content, headers=headers, media_type="application/json")


def _not_modified_since(header: str | None, last_modified: datetime) -> bool:
    if not header or len(header) > 64:
        return False
    try:
        since = parsedate_to_datetime(header)
    except (TypeError, ValueError, IndexError):
        return False  # an unreadable date is ignored, as HTTP says
    if since.tzinfo is None:
        return False
    return last_modified <= since


def _stream(events: AsyncIterator[dict[str, Any]]) -> Response:
    def on_error(exc: Exception) -> Any:
        err = exc if isinstance(exc, A2AError) else translate(exc)
        return err.rest_body()

    return sse.stream(events, sse.BARE, on_error)
