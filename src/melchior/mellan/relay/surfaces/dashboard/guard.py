"""Every dashboard route but sign-in and the static assets is wrapped here, so that no
page can forget its checks: a page or stream needs the owner's live session; a change
also needs our origin and the session's CSRF token, checked before the handler runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.surfaces.dashboard import sessions
from melchior.mellan.relay.surfaces.dashboard.forms import Form, read_form
from melchior.mellan.relay.surfaces.dashboard.sessions import Owner, Settings

View = Callable[[Request, Owner], Awaitable[Response]]
Change = Callable[[Request, Owner, Form], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


def relay_of(request: Request) -> Relay:
    relay: Relay = request.app.state.relay
    return relay


def settings_of(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def view(handler: View, *, touch: bool = True) -> Endpoint:
    """A page (or, with ``touch=False``, a live stream, which must not keep an idle
    session alive): the owner's session first."""

    async def endpoint(request: Request) -> Response:
        owner = await sessions.current(
            request, relay_of(request), settings_of(request), touch=touch
        )
        return await handler(request, owner)

    endpoint.__name__ = handler.__name__
    return endpoint


def change(handler: Change) -> Endpoint:
    """A state-changing form: the session, then the origin and the CSRF token, then the
    handler with the form's fields."""

    async def endpoint(request: Request) -> Response:
        relay = relay_of(request)
        owner = await sessions.current(request, relay, settings_of(request), touch=True)
        sessions.check_origin(request, relay)  # before reading the body of a foreign post
        form = await read_form(request, relay.body_deadline)
        sessions.check_change(request, relay, owner, form.get(sessions.CSRF_FIELD))
        return await handler(request, owner, form)

    endpoint.__name__ = handler.__name__
    return endpoint
