"""The A2A 1.0 entry of the relay: one base URL per receiving agent, two bindings.

``{relay}/a2a/{workspace}/{agent-id}`` is an agent's base URL (see :mod:`.paths` for how
ids with ``/`` are read). Its public card is at ``.well-known/agent-card.json``;
JSON-RPC is served by POST to the base URL and HTTP+JSON under it. The wire is written
by hand as plain JSON (not the a2a-sdk server types) so payloads pass unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.refusals import client_gone
from melchior.mellan.relay.store.base import StoreError
from melchior.mellan.relay.surfaces.a2a import cards, errors, jsonrpc, paths, rest


async def entry(request: Request) -> Response:
    relay: Relay = request.app.state.relay
    target = paths.parse(request.path_params["rest"])
    if target is None:
        raise errors.MethodNotFound("an A2A URL is /a2a/{workspace}/{agent-id}[/operation]")
    if target.rest == (".well-known", "agent-card.json") and request.method == "GET":
        grpc = relay.grpc.target if relay.grpc is not None else None
        card = cards.public_card(relay.public_url, target.workspace, target.agent, grpc)
        body, _ = cards.encode(card)
        return rest.card_response(
            request, body, f"public, max-age={cards.PUBLIC_MAX_AGE}", cards.STARTED
        )
    if not target.rest:
        if request.method != "POST":
            raise errors.MethodNotFound(
                "POST JSON-RPC here; the agent card is at .well-known/agent-card.json"
            )
        return await jsonrpc.handle(relay, request, target)
    return await rest.handle(relay, request, target)


async def error(request: Request, exc: Exception) -> Response:
    """Every refusal and failure under ``/a2a``, rendered in the request's binding: a
    JSON-RPC error with the request's id, or a ``google.rpc.Status`` body. Unexpected
    exceptions are logged and answered as an internal error, never a traceback."""
    err = errors.translate(exc)
    if getattr(request.state, "binding", "") == "jsonrpc":
        return jsonrpc.error_response(err, getattr(request.state, "rpc_id", None))
    return rest.error_response(err)


HANDLERS: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
    ClientDisconnect: client_gone,
    errors.A2AError: error,
    StoreError: error,
    HTTPException: error,
    Exception: error,
}
"""Exception handlers of the ``/a2a`` mount."""


def routes() -> list[BaseRoute]:
    """The entry, relative to its mount at :data:`.paths.PREFIX`."""
    return [Route("/{rest:path}", entry, methods=["GET", "POST", "DELETE", "PUT", "PATCH"])]
