"""Dashboard sessions: sign-in with the owner credential, a cookie, CSRF, sign-out.

- The cookie holds only a random session id (256 bits); the store keeps its SHA-256, the
  credential it signed in with, and its idle and absolute expiry on the database clock
  (:meth:`Store.add_session`). Whether it still stands is
  :func:`melchior.policy.sessions.session_stands`: a revoked credential, the absolute
  lifetime or the idle window each end it.
- The cookie is ``HttpOnly``, ``SameSite=Strict``, and ``Secure`` (with the ``__Host-``
  prefix) when the request came over TLS.
- Every state-changing request must come from our own origin (``Sec-Fetch-Site`` and
  ``Origin`` where the browser sends them) and carry the session's CSRF token (a form
  field, or the ``X-CSRF-Token`` header from our script), compared in constant time. The
  token is derived from the session id, so it is never stored and dies with the session.
- Sign-in itself is a form too: before a session exists it is guarded by a short-lived
  sign-in cookie whose value the form must echo (so a foreign page cannot sign a browser
  into someone else's workspace), plus the origin check.
- A **one-time sign-in link** (``mellan dashboard link``, minted with an owner credential)
  spares pasting the owner token: its code is kept like a session — only its SHA-256,
  under a prefix no session cookie can take — with :data:`LINK_TTL` to live, and it is
  used up by deleting it (one statement, so two browsers racing for it cannot both win)
  before a session of its own is started for the same credential. Following the link
  shows a page with a button; only that form's POST signs in, so a link previewer that
  fetches the URL signs nobody in and does not use the link up.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from melchior.mellan.relay.auth import hash_token
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.store.base import CredentialKind, Principal, Record
from melchior.mellan.relay.surfaces.http import actor, record
from melchior.policy.decision import Decision, refuse
from melchior.policy.sessions import csrf_token_matches, same_origin, session_stands

COOKIE = "mellan_session"
SIGNIN_COOKIE = "mellan_signin"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
SIGNIN_TTL = 15 * 60
"""Seconds a sign-in form stays valid (its cookie's lifetime)."""
LINK_TTL = 10 * 60
"""Seconds a one-time sign-in link stays valid."""
LINK_PREFIX = "dashboard-link:"
SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{43}\Z")
"""What a session cookie holds (``secrets.token_urlsafe(32)``); a link's stored key is
never of this form, so a link code cannot be used as a cookie."""


@dataclass(frozen=True)
class Settings:
    """How long a dashboard session lives: ``idle`` seconds without a page view or action,
    ``lifetime`` seconds at most in any case."""

    idle: float = 30 * 60
    lifetime: float = 12 * 3600
    touch_every: float = 30.0
    """A session's idle expiry is pushed forward at most this often (one write, not one
    per page view)."""


class Refused(Exception):
    """A request the dashboard will not serve for the browser that made it: ``status``
    (401 not signed in, 403 forbidden) and the policy decision that refused it."""

    def __init__(self, status: int, decision: Decision) -> None:
        super().__init__(decision.reason)
        self.status = status
        self.decision = decision


@dataclass(frozen=True)
class Owner:
    """The owner behind a request's session: who, which session (by hash), and the CSRF
    token its forms carry."""

    principal: Principal
    id_hash: str
    csrf: str

    @property
    def workspace(self) -> str:
        return self.principal.workspace


def csrf_for(session_id: str) -> str:
    """The session's CSRF token: a MAC of a fixed label under the session id, so knowing
    the token tells nothing of the id, and nothing needs storing."""
    return hmac.new(session_id.encode(), b"mellan-dashboard-csrf", hashlib.sha256).hexdigest()


def secure(request: Request, relay: Relay) -> bool:
    """Did the browser reach us over TLS? Directly (``https`` scheme), or through a TLS
    proxy serving the relay's https public URL under the same host name."""
    if request.url.scheme == "https":
        return True
    public = urlsplit(relay.public_url)
    host = request.headers.get("host", "").lower()
    return public.scheme == "https" and host in {public.netloc.lower(), public.hostname or ""}


def cookie_name(request: Request, relay: Relay, base: str = COOKIE) -> str:
    return f"__Host-{base}" if secure(request, relay) else base


def _cookie_path(request: Request, relay: Relay) -> str:
    # __Host- cookies must have Path=/; otherwise scope the cookie to the dashboard
    return "/" if secure(request, relay) else (request.scope.get("root_path") or "/")


def our_origins(request: Request, relay: Relay) -> set[str]:
    """Origins whose pages may change things: the one this request was addressed to, and
    the relay's public URL."""
    origins = {f"{request.url.scheme}://{request.headers.get('host', '')}".lower()}
    public = urlsplit(relay.public_url)
    if public.scheme and public.netloc:
        origins.add(f"{public.scheme}://{public.netloc}".lower())
    return origins


def check_origin(request: Request, relay: Relay) -> None:
    decision = same_origin(
        method=request.method,
        origin=request.headers.get("origin"),
        fetch_site=request.headers.get("sec-fetch-site"),
        ours=our_origins(request, relay),
    )
    if not decision:
        raise Refused(403, decision)


def _set_cookie(
    response: Response, request: Request, relay: Relay, base: str, value: str, max_age: int
) -> None:
    response.set_cookie(
        cookie_name(request, relay, base),
        value,
        max_age=max_age,
        path=_cookie_path(request, relay),
        secure=secure(request, relay),
        httponly=True,
        samesite="strict",
    )


def _clear_cookie(response: Response, request: Request, relay: Relay, base: str) -> None:
    response.delete_cookie(
        cookie_name(request, relay, base),
        path=_cookie_path(request, relay),
        secure=secure(request, relay),
        httponly=True,
        samesite="strict",
    )


# -- signing in and out --------------------------------------------------------------------------


def signin_token(request: Request, relay: Relay) -> str:
    """The sign-in form's token: the one in the browser's sign-in cookie, or a new one."""
    return request.cookies.get(cookie_name(request, relay, SIGNIN_COOKIE)) or secrets.token_hex(16)


def keep_signin_token(response: Response, request: Request, relay: Relay, token: str) -> None:
    _set_cookie(response, request, relay, SIGNIN_COOKIE, token, SIGNIN_TTL)


def check_signin_form(request: Request, relay: Relay, given: str | None) -> None:
    """A sign-in post must come from our origin and echo its sign-in cookie."""
    check_origin(request, relay)
    expected = request.cookies.get(cookie_name(request, relay, SIGNIN_COOKIE))
    if not expected:
        raise Refused(
            403,
            refuse(
                "csrf-missing",
                "this sign-in form has expired or cookies are blocked; reload the sign-in "
                "page and try again",
            ),
        )
    decision = csrf_token_matches(expected, given)
    if not decision:
        raise Refused(403, decision)


async def sign_in(relay: Relay, settings: Settings, token: str) -> tuple[Principal, str]:
    """Check an owner token and start a session: (the owner, the new session id). An
    agent credential is refused (recorded); an unknown one is refused plainly."""
    principal = await relay.call(relay.store.principal_for, hash_token(token.strip()))
    if principal is None:
        raise Refused(
            401,
            refuse(
                "bad-credential",
                "this token is unknown, revoked or expired; paste the owner token from the "
                "file the relay wrote at its first start (owner.token)",
            ),
        )
    if principal.kind is not CredentialKind.OWNER:
        decision = refuse(
            "owner-only",
            "the dashboard is for the workspace owner; this is an agent credential "
            f"({principal.subject})",
        )
        await record(
            relay, principal.workspace, actor(principal), "session.start", principal.subject,
            False, decision.rule, decision.reason,
        )  # fmt: skip
        raise Refused(403, decision)
    return principal, await _start(relay, settings, principal, "signed in to the dashboard")


async def _keep(
    relay: Relay, principal: Principal, key: str, idle: float, lifetime: float,
    action: str, reason: str,
) -> None:  # fmt: skip
    """Store a session row under ``key`` for ``principal``, recorded as ``action``."""
    audit = Record(actor(principal), action, "owner", reason,
                   {"credential_id": principal.credential_id})  # fmt: skip
    await relay.call(
        relay.store.add_session, principal.workspace, principal.credential_id, key,
        idle_seconds=idle, max_seconds=lifetime, record=audit,
    )  # fmt: skip


async def _start(relay: Relay, settings: Settings, principal: Principal, how: str) -> str:
    """A new session for ``principal`` (an owner), recorded; its id."""
    session_id = secrets.token_urlsafe(32)
    await _keep(
        relay, principal, hash_token(session_id), settings.idle, settings.lifetime,
        "session.start",
        f"{how} (idle timeout {settings.idle:g} s, at most {settings.lifetime:g} s)",
    )  # fmt: skip
    return session_id


def _link_key(code: str) -> str:
    return hash_token(LINK_PREFIX + code)


async def mint_link(relay: Relay, principal: Principal) -> str:
    """A one-time sign-in link's code for the owner ``principal`` (recorded); the caller
    has checked that it is an owner."""
    assert principal.kind is CredentialKind.OWNER
    code = secrets.token_urlsafe(32)
    await _keep(
        relay, principal, _link_key(code), LINK_TTL, LINK_TTL, "session.link",
        f"minted a one-time dashboard sign-in link (valid {LINK_TTL} s)",
    )  # fmt: skip
    return code


LINK_SPENT = refuse(
    "link-spent",
    "this sign-in link was used already, has expired, or was never minted; ask for another "
    "('mellan dashboard link'), or sign in with the owner token",
)


async def redeem_link(relay: Relay, settings: Settings, code: str | None) -> str:
    """Use up the link ``code`` and start a session for its owner: the session id. Only
    one browser wins a link; a spent, expired or revoked one is refused (401)."""
    if not code or len(code) > 200:
        raise Refused(401, LINK_SPENT)
    key = _link_key(code)
    stored = await relay.call(relay.store.session_for, key)
    if stored is None:
        raise Refused(401, LINK_SPENT)
    decision = session_stands(
        now=stored.now,
        idle_until=stored.idle_expires_at,
        until=stored.expires_at,
        credential_live=stored.credential_live,
    )
    used = Record(actor(stored.principal), "session.link", "owner", "used a sign-in link")
    if not await relay.call(relay.store.end_session, key, record=used) or not decision:
        raise Refused(401, LINK_SPENT if decision else decision)
    return await _start(relay, settings, stored.principal, "signed in to the dashboard by a link")


def keep_session(
    response: Response, request: Request, relay: Relay, settings: Settings, session_id: str
) -> None:
    """Give the browser its session cookie; the sign-in cookie has done its work."""
    _set_cookie(response, request, relay, COOKIE, session_id, int(settings.lifetime))
    _clear_cookie(response, request, relay, SIGNIN_COOKIE)


def forget(response: Response, request: Request, relay: Relay) -> None:
    _clear_cookie(response, request, relay, COOKIE)


async def sign_out(relay: Relay, owner: Owner) -> None:
    audit = Record(actor(owner.principal), "session.end", "owner", "signed out of the dashboard")
    await relay.call(relay.store.end_session, owner.id_hash, record=audit)


# -- the owner behind a request --------------------------------------------------------------------

NOT_SIGNED_IN = refuse("unauthenticated", "sign in with the workspace owner token first")


async def current(request: Request, relay: Relay, settings: Settings, *, touch: bool) -> Owner:
    """The owner whose live session the request's cookie names, or :class:`Refused` (401)
    naming why not. With ``touch``, the session's idle window starts again."""
    session_id = request.cookies.get(cookie_name(request, relay))
    if not session_id:
        raise Refused(401, NOT_SIGNED_IN)
    if not SESSION_ID.match(session_id):
        raise Refused(401, refuse("no-session", "this is no session cookie of ours; sign in"))
    id_hash = hash_token(session_id)
    stored = await relay.call(relay.store.session_for, id_hash)
    if stored is None:
        raise Refused(
            401, refuse("no-session", "this session has ended (signed out); sign in again")
        )
    decision = session_stands(
        now=stored.now,
        idle_until=stored.idle_expires_at,
        until=stored.expires_at,
        credential_live=stored.credential_live,
    )
    if not decision:
        raise Refused(401, decision)
    if stored.principal.kind is not CredentialKind.OWNER:  # only owners ever get one
        raise Refused(403, refuse("owner-only", "the dashboard is for the workspace owner"))
    if touch:
        await relay.call(
            relay.store.touch_session,
            id_hash,
            idle_seconds=settings.idle,
            every=settings.touch_every,
        )
    return Owner(stored.principal, id_hash, csrf_for(session_id))


def check_change(request: Request, relay: Relay, owner: Owner, given: str | None) -> None:
    """A state-changing request: from our origin, with this session's CSRF token (the form
    field ``given``, else the ``X-CSRF-Token`` header)."""
    check_origin(request, relay)
    decision = csrf_token_matches(owner.csrf, given or request.headers.get(CSRF_HEADER))
    if not decision:
        raise Refused(403, decision)


def safe_next(target: str | None, base: str) -> str:
    """Where to go after signing in: a path inside the dashboard, never another site."""
    if (
        not target
        or not target.startswith(base + "/")
        or target.startswith("//")
        or "\\" in target
        or any(ord(c) < 0x21 or ord(c) == 0x7F for c in target)
        or target.startswith(base + "/signin")
    ):
        return base + "/"
    return target
