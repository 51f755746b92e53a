"""The A2A 1.0 gRPC binding: the third binding, over the same table of operations.

Every RPC of ``lf.a2a.v1.A2AService`` is answered by the operation of the same name in
:data:`.ops.OPERATIONS`, exactly as JSON-RPC and HTTP+JSON are: the request message is
turned into the JSON its JSON binding would have carried (the proto's own JSON mapping,
which is what A2A 1.0's JSON is) and the operation's JSON answer into the response
message. So authorization (the bearer credential in metadata ``authorization``, through
:func:`.access.authenticate`), the version check, admission, send limits, audit and
every error are the other bindings' own, in one place each.

The agent is named by the request's ``tenant``, ``{workspace}/{agent-id}`` (the agent's
base URL after ``/a2a/``), which the card's gRPC interface announces; an A2A client
echoes it in every request. Errors are a gRPC status from the A2A table (NOT_FOUND,
FAILED_PRECONDITION, …) with a ``google.rpc.Status`` in ``grpc-status-details-bin``
whose ErrorInfo carries the same ``reason`` and domain as the JSON bindings'.

Why ``grpc.aio`` in the relay's own event loop (started by the app's lifespan, see
:func:`start`): the operations are coroutines that share the replica's watches,
batcher and notifier; a gRPC server on threads would need a second loop and a bridge
for every stream. Request bytes are read by this module (not by grpc's deserializer) so
a malformed protobuf is refused as INVALID_ARGUMENT with a reason rather than grpc's
bare INTERNAL, and a big one is parsed on a worker thread, never on the loop. grpc
itself refuses a message over the relay's body limit (RESOURCE_EXHAUSTED) before a byte
of it reaches this module.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from a2a.types import a2a_pb2
from google.protobuf import any_pb2, empty_pb2, json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2, status_pb2
from starlette.requests import Request

from melchior.mellan.relay import requestid
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.observe import access_log
from melchior.mellan.relay.surfaces.a2a import http, jsontext, paths
from melchior.mellan.relay.surfaces.a2a.access import authenticate
from melchior.mellan.relay.surfaces.a2a.errors import (
    A2AError,
    InvalidParams,
    MethodNotFound,
    QuotaExceeded,
    translate,
)
from melchior.mellan.relay.surfaces.a2a.ops import OPERATIONS, encoded
from melchior.mellan.relay.surfaces.body import INLINE_PARSE

log = logging.getLogger(__name__)

SERVICE = "lf.a2a.v1.A2AService"
DETAILS_KEY = "grpc-status-details-bin"
GRACE_SECONDS = 5.0
"""How long open calls may finish when the replica stops (as uvicorn's graceful drain)."""


@dataclass
class GrpcEndpoint:
    """Where a replica serves gRPC; ``port`` 0 means any free one, and is replaced by the
    port bound (for the card and the status line)."""

    host: str
    port: int
    tls_cert: Path | None = None
    tls_key: Path | None = None
    public_host: str | None = None
    """The host clients reach (the public URL's); default: ``host``."""
    on_listening: Callable[[str], None] | None = None
    """Told the bound ``host:port`` once the server is up (the relay's status line)."""
    tls_generation: int = 0
    """Bumped when the HTTPS certificate was reloaded (SIGHUP): new gRPC connections then
    get the pair read afresh from the same files."""

    def reload_tls(self) -> None:
        """Called on the relay's SIGHUP, after the pair loaded for HTTPS."""
        self.tls_generation += 1

    @property
    def target(self) -> str:
        """``host:port`` as a gRPC client dials it (the card's interface URL)."""
        host = self.public_host or self.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"


@dataclass(frozen=True)
class Rpc:
    """One RPC: its request and response message types, and whether it streams."""

    request: type[Message]
    response: type[Message]
    streaming: bool = False


RPCS: dict[str, Rpc] = {
    "SendMessage": Rpc(a2a_pb2.SendMessageRequest, a2a_pb2.SendMessageResponse),
    "SendStreamingMessage": Rpc(a2a_pb2.SendMessageRequest, a2a_pb2.StreamResponse, True),
    "GetTask": Rpc(a2a_pb2.GetTaskRequest, a2a_pb2.Task),
    "ListTasks": Rpc(a2a_pb2.ListTasksRequest, a2a_pb2.ListTasksResponse),
    "CancelTask": Rpc(a2a_pb2.CancelTaskRequest, a2a_pb2.Task),
    "SubscribeToTask": Rpc(a2a_pb2.SubscribeToTaskRequest, a2a_pb2.StreamResponse, True),
    "CreateTaskPushNotificationConfig": Rpc(
        a2a_pb2.TaskPushNotificationConfig, a2a_pb2.TaskPushNotificationConfig
    ),
    "GetTaskPushNotificationConfig": Rpc(
        a2a_pb2.GetTaskPushNotificationConfigRequest, a2a_pb2.TaskPushNotificationConfig
    ),
    "ListTaskPushNotificationConfigs": Rpc(
        a2a_pb2.ListTaskPushNotificationConfigsRequest,
        a2a_pb2.ListTaskPushNotificationConfigsResponse,
    ),
    "GetExtendedAgentCard": Rpc(a2a_pb2.GetExtendedAgentCardRequest, a2a_pb2.AgentCard),
    "DeleteTaskPushNotificationConfig": Rpc(
        a2a_pb2.DeleteTaskPushNotificationConfigRequest, empty_pb2.Empty
    ),
}
assert RPCS.keys() == OPERATIONS.keys(), "every A2A operation has exactly one RPC"


# -- errors -----------------------------------------------------------------------------------


def status_of(err: A2AError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str | bytes], ...]]:
    """(code, message, trailing metadata) of an A2A error: the code of the spec's table
    and a ``google.rpc.Status`` holding the same details the JSON bindings send."""
    code = getattr(grpc.StatusCode, err.grpc, grpc.StatusCode.UNKNOWN)
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=err.domain, metadata=err.metadata)
    details = [_packed(info)]
    if err.violations:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                for f, d in err.violations
            ]
        )
        details.append(_packed(bad))
    status = status_pb2.Status(code=code.value[0], message=err.message, details=details)
    trailing: list[tuple[str, str | bytes]] = [(DETAILS_KEY, status.SerializeToString())]
    if isinstance(err, QuotaExceeded):
        trailing.append(("retry-after", str(err.retry_after)))
    return code, err.message, tuple(trailing)


def _packed(msg: Message) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(msg)
    return out


async def _abort(context: grpc.aio.ServicerContext[Any, Any], err: A2AError) -> None:
    code, message, trailing = status_of(err)
    context.set_trailing_metadata(trailing)
    await context.abort(code, message)


class _Observed:
    """One call as :class:`~melchior.mellan.relay.observe.Observe` sees an HTTP request:
    a request id (a sane incoming ``x-request-id``, or a new one) that its log lines and
    audit records carry and that is sent back in the initial metadata; and, when the
    answer starts (a unary reply, a stream's first event) or the call ends without one,
    its latency under route ``grpc {RPC}`` with the status code's name, and one access
    line."""

    def __init__(self, relay: Relay, name: str, context: grpc.aio.ServicerContext[Any, Any]):
        self.relay, self.name, self.context = relay, name, context
        incoming = next(
            (v for k, v in context.invocation_metadata() or () if k == "x-request-id"), None
        )
        self.rid = requestid.accept(incoming if isinstance(incoming, str) else None)
        self.started = time.perf_counter()
        self.answered = False

    async def __aenter__(self) -> _Observed:
        self.token = requestid.current_id.set(self.rid)
        await self.context.send_initial_metadata(((requestid.HEADER.lower(), self.rid),))
        return self

    def done(self, status: str) -> None:
        if self.answered:
            return
        self.answered = True
        seconds = time.perf_counter() - self.started
        route = f"grpc {self.name}"
        self.relay.metrics.requests.observe(seconds, route=route, method="POST", status=status)
        access_log.info(
            "GRPC %s %s %.1f ms", self.name, status, seconds * 1000,
            extra={"route": route, "status": status, "duration_ms": round(seconds * 1000, 1)},
        )  # fmt: skip

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            if kind is not None and issubclass(kind, asyncio.CancelledError):
                self.done("CANCELLED")  # the caller went away (or its deadline passed)
            elif kind is not None:
                self.done("UNKNOWN")
        finally:
            requestid.current_id.reset(self.token)


# -- requests ---------------------------------------------------------------------------------


def _request(
    metadata: tuple[tuple[str, str | bytes], ...] | None,
    method: str,
    size: int,
    context: grpc.aio.ServicerContext[Any, Any],
) -> Request:
    """The call as the ASGI request the operations read: its text metadata as headers
    (``authorization``, ``a2a-version``, …), its size (for the inline-parse rule) and a
    disconnect that is the call's own end."""
    headers = [
        (k.lower().encode("latin-1"), v.encode("latin-1", "replace"))
        for k, v in metadata or ()
        if isinstance(v, str)
    ]
    scope = {
        "type": "http",
        "method": "POST",
        "path": f"/{SERVICE}/{method}",
        "raw_path": f"/{SERVICE}/{method}".encode(),
        "query_string": b"",
        "headers": headers,
        "state": {"binding": "grpc", "body_bytes": size},
    }

    async def receive() -> dict[str, Any]:
        # read by Request.is_disconnected (a blocking send that stops waiting for a caller
        # who hung up): never awaits, so it answers even inside a cancelled scope
        if context.done() or context.cancelled():
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": b"", "more_body": True}

    return Request(scope, receive)


def _params(msg: Message) -> Any:
    """The request as its JSON binding carries it, less ``tenant`` (said by the target)."""
    params = jsontext.loads(json_format.MessageToJson(msg, indent=None))
    if isinstance(params, dict):
        params.pop("tenant", None)
    return params


async def _parse(relay: Relay, rpc: Rpc, raw: bytes) -> tuple[Message, Any]:
    """The request message and its JSON params; work in proportion to a big request's
    size (decoding it, and turning it into JSON) is done on a worker thread."""

    def parse() -> tuple[Message, Any]:
        msg = rpc.request()
        try:
            msg.ParseFromString(raw)
        except DecodeError as exc:
            raise InvalidParams(
                f"the request is not a valid {rpc.request.__name__}: {exc}"
            ) from None
        return msg, _params(msg)

    return parse() if len(raw) <= INLINE_PARSE else await relay.call(parse)


async def _reply(relay: Relay, name: str, rpc: Rpc, answer: dict[str, Any]) -> bytes:
    """The operation's JSON answer as the response message's bytes (one encoder of the
    answer, the JSON bindings'; big answers are converted on a worker thread)."""
    chunks = await encoded(relay, name, answer)

    def convert() -> bytes:
        out = rpc.response()
        json_format.Parse(b"".join(chunks), out, ignore_unknown_fields=True)
        data: bytes = out.SerializeToString()
        return data

    if sum(len(c) for c in chunks) <= INLINE_PARSE:
        return convert()
    return await relay.call(convert)


async def _prepare(
    relay: Relay, name: str, rpc: Rpc, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
) -> Any:
    """Parse, name the agent, check the version and the credential, run the operation."""
    msg, params = await _parse(relay, rpc, raw)
    tenant = getattr(msg, "tenant", "")
    target = paths.parse(tenant) if tenant else None
    if target is None or target.rest:
        raise MethodNotFound(
            "name the agent in the request's 'tenant': {workspace}/{agent-id}, as its "
            "card's GRPC interface says",
            metadata={"tenant": tenant},
        )
    request = _request(context.invocation_metadata(), name, len(raw), context)
    http.check_version(request)
    caller = await authenticate(relay, request, target)
    left = context.time_remaining()
    if left is not None and left <= 0:
        raise _DeadlinePassed
    return await OPERATIONS[name](relay, caller, params, request)


class _DeadlinePassed(Exception):
    """The call's deadline passed before its operation began: it is not run. Its caller
    has stopped waiting (a deadline of 0 is spent on arrival) and would never learn what
    a send it gave up on did; what began before the deadline runs to its end, as a gRPC
    deadline promises nothing either way."""

    status = grpc.StatusCode.DEADLINE_EXCEEDED
    sentence = "the call's deadline passed before it was run: nothing was done"


def _unary(relay: Relay, name: str, rpc: Rpc) -> Callable[..., Awaitable[bytes]]:
    async def handle(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        async with _Observed(relay, name, context) as call:
            try:
                answer = await _prepare(relay, name, rpc, raw, context)
                out = await _reply(relay, name, rpc, answer)
            except _DeadlinePassed:
                call.done(_DeadlinePassed.status.name)
                await context.abort(_DeadlinePassed.status, _DeadlinePassed.sentence)
                raise  # not reached: abort raises
            except Exception as exc:  # every refusal rendered as a status, never a traceback
                err = translate(exc)
                call.done(err.grpc)
                await _abort(context, err)
                raise  # not reached: abort raises
            call.done("OK")
            return out

    return handle


def _streaming(relay: Relay, name: str, rpc: Rpc) -> Callable[..., AsyncIterator[bytes]]:
    async def handle(
        raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        events: AsyncIterator[dict[str, Any]] | None = None
        async with _Observed(relay, name, context) as call:
            try:
                events = await _prepare(relay, name, rpc, raw, context)
                assert events is not None
                async for event in events:
                    message = await _reply(relay, name, rpc, event)
                    call.done("OK")
                    yield message
            except asyncio.CancelledError:
                raise  # the caller went away: the shared watch forgets this stream
            except _DeadlinePassed:
                call.done(_DeadlinePassed.status.name)
                await context.abort(_DeadlinePassed.status, _DeadlinePassed.sentence)
            except Exception as exc:
                err = translate(exc)
                call.done(err.grpc)
                await _abort(context, err)
            finally:
                close = getattr(events, "aclose", None)
                if close is not None:
                    await close()

    return handle


def handler(relay: Relay) -> grpc.GenericRpcHandler:
    """The service's handlers; requests and responses travel as bytes (see the module)."""
    methods = {
        name: (
            grpc.unary_stream_rpc_method_handler(_streaming(relay, name, rpc))
            if rpc.streaming
            else grpc.unary_unary_rpc_method_handler(_unary(relay, name, rpc))
        )
        for name, rpc in RPCS.items()
    }
    return grpc.method_handlers_generic_handler(SERVICE, methods)


# -- the server -------------------------------------------------------------------------------


def options(relay: Relay) -> list[tuple[str, Any]]:
    """The server's channel options: grpc refuses a request message over the relay's body
    limit itself; answers are bounded by what the relay stores (results are limited at
    complete), so they are not cut here. ``so_reuseport`` off: a second replica on a busy
    port fails to start, as it does for HTTP, instead of silently sharing it."""
    return [
        ("grpc.max_receive_message_length", relay.max_body),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 0),
        ("grpc.max_concurrent_streams", 1000),
    ]


def _tls_config(endpoint: GrpcEndpoint) -> Any:
    assert endpoint.tls_cert is not None
    assert endpoint.tls_key is not None
    pair = (endpoint.tls_key.read_bytes(), endpoint.tls_cert.read_bytes())
    return grpc.ssl_server_certificate_configuration([pair])


def _credentials(endpoint: GrpcEndpoint) -> grpc.ServerCredentials | None:
    """The HTTPS pair (and client CA) as gRPC server credentials that follow a SIGHUP:
    grpc asks the fetcher at each new connection, which reads the files again only
    after a reload (the live HTTPS context has then already loaded them, so they are
    a good pair; should they fail here, the previous pair stays). No client certificate
    is required: the A2A surface authenticates by bearer credential, as over HTTPS
    (``--client-ca`` binds only the receiver API)."""
    if endpoint.tls_cert is None or endpoint.tls_key is None:
        return None
    seen = endpoint.tls_generation

    def fetch() -> Any:
        nonlocal seen
        if endpoint.tls_generation == seen:
            return None
        seen = endpoint.tls_generation
        try:
            return _tls_config(endpoint)
        except OSError as exc:
            access_log.error(
                "gRPC certificate reload failed, still serving the previous one: %s", exc
            )
            return None

    return grpc.dynamic_ssl_server_credentials(
        _tls_config(endpoint), fetch, require_client_authentication=False
    )


async def start(relay: Relay, endpoint: GrpcEndpoint) -> grpc.aio.Server:
    """Bind and start the gRPC server (``endpoint.port`` becomes the port bound); raises
    ``RuntimeError`` when the port cannot be bound."""
    from grpc_reflection.v1alpha import reflection  # with a2a-sdk[grpc]

    server = grpc.aio.server(options=options(relay))
    server.add_generic_rpc_handlers((handler(relay),))
    # server reflection: generic clients (grpcurl, grpcui, Postman) find the A2A service
    # and its messages without a copy of the proto file
    reflection.enable_server_reflection((SERVICE, reflection.SERVICE_NAME), server)
    address = (
        f"[{endpoint.host}]:{endpoint.port}"
        if ":" in endpoint.host
        else f"{endpoint.host}:{endpoint.port}"
    )
    creds = _credentials(endpoint)
    port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    if port == 0:
        raise RuntimeError(f"cannot listen for gRPC on {address} (is the port in use?)")
    endpoint.port = port
    await server.start()
    if endpoint.on_listening is not None:
        endpoint.on_listening(endpoint.target)
    return server


async def run(server: grpc.aio.Server) -> None:
    """Serve until cancelled (the lifespan's way of saying "stop"), then drain."""
    try:
        await server.wait_for_termination()
    finally:
        await server.stop(GRACE_SECONDS)
