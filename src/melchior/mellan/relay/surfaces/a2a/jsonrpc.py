"""The JSON-RPC 2.0 binding: one POST endpoint at the agent's base URL.

Checks run in the order the spec and the TCK expect: content type before parsing
(-32005), then JSON (-32700), the envelope (-32600), the version (-32009), the method
(-32601), the credential (HTTP 401/403), then the operation. A2A errors are answered
with HTTP 200 and an ``error`` object whose ``data`` is ``[ErrorInfo]``; credential
failures also carry their HTTP status. Streaming methods answer ``text/event-stream``,
each event a full JSON-RPC response with the request's id.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.surfaces.a2a import http, jsontext, sse
from melchior.mellan.relay.surfaces.a2a.access import authenticate
from melchior.mellan.relay.surfaces.a2a.errors import (
    A2AError,
    Forbidden,
    InvalidRequest,
    MethodNotFound,
    PayloadTooLarge,
    QuotaExceeded,
    RequestTimeout,
    Unauthenticated,
    Unavailable,
    translate,
)
from melchior.mellan.relay.surfaces.a2a.ops import OPERATIONS, STREAMING, encoded
from melchior.mellan.relay.surfaces.a2a.paths import Target

RequestId = str | int | None


def _status(err: A2AError) -> int:
    if isinstance(
        err,
        Unauthenticated
        | Forbidden
        | PayloadTooLarge
        | RequestTimeout
        | Unavailable
        | QuotaExceeded,
    ):
        return err.http
    return 200


def error_response(err: A2AError, rid: RequestId) -> Response:
    body = {"jsonrpc": "2.0", "id": rid, "error": err.jsonrpc_error()}
    headers = err.headers()
    if isinstance(err, Unauthenticated):
        headers["WWW-Authenticate"] = "Bearer"
    return Response(
        jsontext.dumpb(body), _status(err), headers=headers, media_type="application/json"
    )


def envelope(body: Any) -> tuple[RequestId, str, dict[str, Any]]:
    """(id, method, params) of a JSON-RPC request, or :class:`InvalidRequest`."""
    if isinstance(body, list):
        raise InvalidRequest("JSON-RPC batches are not supported; send one request per call")
    if not isinstance(body, dict):
        raise InvalidRequest("a JSON-RPC request is a JSON object")
    rid = body.get("id")
    if "id" not in body or isinstance(rid, bool) or not isinstance(rid, str | int | type(None)):
        raise InvalidRequest("'id' must be present and a string, a number or null")
    if body.get("jsonrpc") != "2.0":
        raise InvalidRequest("'jsonrpc' must be \"2.0\"")
    method = body.get("method")
    if not isinstance(method, str) or not method:
        raise InvalidRequest("'method' must be a non-empty string")
    params = body.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InvalidRequest("'params' must be an object")
    return rid, method, params


def request_id(body: Any) -> RequestId:
    if isinstance(body, dict):
        rid = body.get("id")
        if isinstance(rid, str | int) and not isinstance(rid, bool):
            return rid
    return None


async def handle(relay: Relay, request: Request, target: Target) -> Response:
    """Answer one JSON-RPC request. Refusals are raised: the ``/a2a`` mount's handler
    (:func:`melchior.mellan.relay.surfaces.a2a.error`) renders them in this binding, with the
    request's id, which is kept on ``request.state`` as soon as it is known."""
    request.state.binding = "jsonrpc"
    request.state.rpc_id = None
    body = await http.read_json(request, relay)
    request.state.rpc_id = request_id(body)
    rid, method, params = envelope(body)
    http.check_version(request)
    op = OPERATIONS.get(method)
    if op is None:
        raise MethodNotFound(
            f"method {method!r} is not an A2A 1.0 method (they are PascalCase, e.g. SendMessage)",
            metadata={"method": method},
        )
    request.state.route = f"/a2a jsonrpc {method}"  # a bounded label: A2A methods only
    caller = await authenticate(relay, request, target)
    result = await op(relay, caller, params, request)
    if method in STREAMING:
        assert not isinstance(result, dict)
        return _stream(result, rid)
    assert isinstance(result, dict)
    answer = {"jsonrpc": "2.0", "id": rid, "result": result}
    return http.json_response(await encoded(relay, method, answer), "application/json")


def stream_envelope(rid: RequestId) -> sse.Envelope:
    """A stream's frames are ``{"jsonrpc":"2.0","id":<rid>,"result":<event>}``: the id's
    bytes around each event's shared bytes (:class:`~.sse.Envelope`)."""
    head = b'{"jsonrpc":"2.0","id":' + sse.line_safe(jsontext.dumpb(rid)) + b',"result":'
    return sse.Envelope(head, b"}")


def _stream(events: AsyncIterator[dict[str, Any]], rid: RequestId) -> Response:
    def on_error(exc: Exception) -> Any:
        err = exc if isinstance(exc, A2AError) else translate(exc)
        return {"jsonrpc": "2.0", "id": rid, "error": err.jsonrpc_error()}

    return sse.stream(events, stream_envelope(rid), on_error)
