"""Signing in and out of the dashboard (the pages anyone may reach)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.surfaces.dashboard import render, sessions
from melchior.mellan.relay.surfaces.dashboard.forms import Form, read_form
from melchior.mellan.relay.surfaces.dashboard.guard import relay_of, settings_of
from melchior.mellan.relay.surfaces.dashboard.sessions import Owner, Refused

WHY = {
    "unauthenticated": "Sign in with the workspace owner token to continue.",
    "no-session": "That session has ended. Sign in again.",
    "session-idle": "Your session was idle too long and has ended. Sign in again.",
    "session-expired": "Your session reached its maximum lifetime. Sign in again.",
    "credential-revoked": "The owner credential this session used was revoked. Sign in with "
    "a live owner token.",
    "signed-out": "You are signed out.",
}
"""Why the sign-in page is shown (fixed sentences, chosen by a rule name in the link)."""


def _form(request: Request, *, status: int = 200, error: dict[str, str] | None = None) -> Response:
    relay = relay_of(request)
    token = sessions.signin_token(request, relay)
    base = render.base_path(request)
    response = render.page(
        request,
        "signin.html",
        {
            "why": WHY.get(request.query_params.get("why", ""), ""),
            "next": sessions.safe_next(request.query_params.get("next"), base),
            "signin_token": token,
            "error": error,
            "relay_url": relay.public_url,
        },
        status=status,
    )
    sessions.keep_signin_token(response, request, relay, token)
    return response


async def signin_page(request: Request) -> Response:
    return _form(request)


async def _signed_in_by(
    request: Request, start: Callable[[Relay, Form], Awaitable[str]], where: Callable[[Form], str]
) -> Response:
    """A sign-in form's POST (origin, its sign-in cookie): ``start`` makes the session, or
    the sign-in page says why not; the browser goes ``where`` with its session cookie."""
    relay = relay_of(request)
    sessions.check_origin(request, relay)
    form: Form = await read_form(request, relay.body_deadline)
    sessions.check_signin_form(request, relay, form.get(sessions.CSRF_FIELD))
    try:
        session_id = await start(relay, form)
    except Refused as exc:
        said = {"rule": exc.decision.rule, "reason": exc.decision.reason}
        return _form(request, status=exc.status, error=said)
    response = RedirectResponse(where(form), status_code=303)
    sessions.keep_session(response, request, relay, settings_of(request), session_id)
    return response


async def signin(request: Request) -> Response:
    async def start(relay: Relay, form: Form) -> str:
        _, session_id = await sessions.sign_in(relay, settings_of(request), form.get("token"))
        return session_id

    base = render.base_path(request)
    return await _signed_in_by(request, start, lambda f: sessions.safe_next(f.get("next"), base))


async def link_page(request: Request) -> Response:
    """Where a one-time sign-in link lands: a page with one button. Only its form's POST
    uses the link up, so a previewer fetching the URL signs nobody in."""
    relay = relay_of(request)
    token = sessions.signin_token(request, relay)
    response = render.page(
        request, "signin_link.html",
        {"code": request.query_params.get("code", "")[:200], "signin_token": token},
    )  # fmt: skip
    sessions.keep_signin_token(response, request, relay, token)
    return response


async def link_signin(request: Request) -> Response:
    async def start(relay: Relay, form: Form) -> str:
        return await sessions.redeem_link(relay, settings_of(request), form.get("code"))

    return await _signed_in_by(request, start, lambda _: f"{render.base_path(request)}/")


async def signout(request: Request, owner: Owner, form: Form) -> Response:
    relay = relay_of(request)
    await sessions.sign_out(relay, owner)
    where = f"{render.base_path(request)}/signin?why=signed-out"
    response: Response
    if "application/json" in request.headers.get("accept", ""):
        response = JSONResponse({"ok": True, "location": where})
    else:
        response = RedirectResponse(where, status_code=303)
    sessions.forget(response, request, relay)
    return response
