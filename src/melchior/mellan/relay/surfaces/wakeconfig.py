"""The owner configures where an agent's receiver is woken (:mod:`.wake` sends them).

HTTP (owner credential; JSON; errors as everywhere in ``/api``)::

    PUT /api/wake   {"agent": A, "url": "https://…" | null, "rotate": false}
        → {"agent", "url", "secret"?}   the secret only when it was made now (the first
                                         URL, or "rotate": true): shown once
    GET /api/wake?agent=A[&show_secret=true] → {"agent", "url", "secret"?}

The URL is checked when it is set (:func:`melchior.policy.outbound.check_url`, private
addresses only where the workspace allows them) and again, after DNS, at every wake-up.
Each change is audited (``agent.wake``).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.outbound import resolve, vet
from melchior.mellan.relay.store.base import Principal, Record
from melchior.mellan.relay.store.routes import new_wake_secret
from melchior.mellan.relay.surfaces.actions import not_found, owner_only
from melchior.mellan.relay.surfaces.http import (
    JSON,
    ApiError,
    actor,
    authenticate,
    field_bool,
    field_str,
    read_object,
)

MAX_URL = 2048


async def set_wake(
    relay: Relay, me: Principal, agent: str, url: str | None, rotate: bool
) -> tuple[str | None, str | None]:
    """Set (or clear, with None) ``agent``'s wake URL; (url, secret if made now)."""
    await owner_only(relay, me, "agent.wake")
    if url is not None:
        private = await relay.call(relay.store.push_allow_private, me.workspace)
        resolver = relay.waker.resolver if relay.waker is not None else resolve
        verdict = await vet(url, allow_private=private, resolver=resolver)  # as at delivery
        if not verdict.allowed:
            raise ApiError(
                400, "bad-request", f"field 'url': {verdict.reason}", {"field": "url"},
                rule=verdict.rule,
            )  # fmt: skip
    why = f"wake-ups go to {url}" if url else "wake-ups are off"
    if rotate:
        why += "; the signing secret was replaced"
    audit = Record(actor(me), "agent.wake", "owner", why, {"url": url, "rotated": rotate})
    secret = new_wake_secret() if rotate else None
    done = await relay.call(
        relay.store.set_wake, me.workspace, agent, url, secret=secret, record=audit
    )
    if done is None:
        raise not_found(f"agent {agent!r}")
    stored_url, stored_secret, fresh = done
    return stored_url, stored_secret if fresh else None


async def put_wake(request: Request) -> Response:
    relay: Relay = request.app.state.relay
    me = await authenticate(request, relay)
    body = await read_object(request, relay)
    agent = field_str(body, "agent")
    url = field_str(body, "url", required=False, max_len=MAX_URL) or None
    rotate = field_bool(body, "rotate", False)
    stored, secret = await set_wake(relay, me, agent, url, rotate)
    out: dict[str, object] = {"agent": agent, "url": stored}
    if secret is not None:
        out["secret"] = secret
    return JSON(out)


async def get_wake(request: Request) -> Response:
    relay: Relay = request.app.state.relay
    me = await authenticate(request, relay)
    await owner_only(relay, me, "agent.wake.read")
    agent = request.query_params.get("agent") or ""
    show = request.query_params.get("show_secret", "") in ("1", "true", "yes")
    found = await relay.call(relay.store.get_agent, me.workspace, agent)
    if found is None:
        raise not_found(f"agent {agent!r}")
    out: dict[str, object] = {"agent": agent, "url": found.wake_url}
    if show:
        target = await relay.call(relay.store.wake_target, me.workspace, agent)
        out["secret"] = target[1] if target is not None else None
    return JSON(out)


def http_routes() -> list[BaseRoute]:
    return [
        Route("/wake", put_wake, methods=["PUT"]),
        Route("/wake", get_wake, methods=["GET"]),
    ]
