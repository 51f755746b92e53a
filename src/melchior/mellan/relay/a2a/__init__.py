"""The A2A 1.0 entry of the relay: one base URL per receiving agent, two bindings.

``{relay}/a2a/{workspace}/{agent-id}`` is an agent's base URL (see :mod:`.paths` for how
ids with ``/`` are read). Its public card is at ``.well-known/agent-card.json``;
JSON-RPC is served by POST to the base URL and HTTP+JSON under it. The wire is written
by hand as plain JSON (not the a2a-sdk server types) so payloads pass unchanged.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from melchior.mellan.relay.a2a import cards, errors, jsonrpc, paths, rest
from melchior.mellan.relay.context import Relay


async def entry(request: Request) -> Response:
    relay: Relay = request.app.state.relay
    target = paths.parse(request.path_params["rest"])
    if target is None:
        return rest.error_response(
            errors.MethodNotFound("an A2A URL is /a2a/{workspace}/{agent-id}[/operation]")
        )
    if target.rest == (".well-known", "agent-card.json") and request.method == "GET":
        card = cards.public_card(relay.public_url, target.workspace, target.agent)
        body, _ = cards.encode(card)
        return rest.card_response(request, body, f"public, max-age={cards.PUBLIC_MAX_AGE}")
    if not target.rest:
        if request.method != "POST":
            return rest.error_response(
                errors.MethodNotFound(
                    "POST JSON-RPC here; the agent card is at .well-known/agent-card.json"
                )
            )
        return await jsonrpc.handle(relay, request, target)
    return await rest.handle(relay, request, target)


def routes() -> list[BaseRoute]:
    return [
        Route(
            paths.PREFIX + "/{rest:path}",
            entry,
            methods=["GET", "POST", "DELETE", "PUT", "PATCH"],
        )
    ]
