"""Whether a browser may act for the workspace owner: a session that still stands, and a
state-changing request that really comes from the dashboard's own pages.

Pure, like the rest of :mod:`melchior.policy`: the relay's dashboard reads the stored
session (with the database clock) and the request's headers, and these functions decide,
naming the rule. Three separate checks guard a change made through a browser:

- the **session** stands: its owner credential is still live (revoking the credential
  ends its sessions), it is younger than its absolute lifetime, and it was used within
  its idle window;
- the request **came from our own origin**: a browser says so in ``Sec-Fetch-Site``
  and ``Origin`` where it sends them (a cross-site form post is refused even before its
  token is looked at);
- it carries the session's **CSRF token**, compared in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Collection
from datetime import UTC, datetime

from melchior.policy.decision import Decision, allow, refuse

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that change nothing, so need no origin or token check."""


def _instant(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def session_stands(*, now: str, idle_until: str, until: str, credential_live: bool) -> Decision:
    """Does a stored session still stand at ``now`` (all ISO-8601, one clock)?"""
    if not credential_live:
        return refuse(
            "credential-revoked",
            "the owner credential this session signed in with was revoked; sign in again "
            "with a live owner token",
        )
    moment = _instant(now)
    if moment >= _instant(until):
        return refuse("session-expired", "this session reached its maximum lifetime; sign in again")
    if moment >= _instant(idle_until):
        return refuse("session-idle", "this session was idle too long; sign in again")
    return allow("session", "a live owner session")


def same_origin(
    *, method: str, origin: str | None, fetch_site: str | None, ours: Collection[str]
) -> Decision:
    """Does a request that may change something come from one of ``ours`` (origins such as
    ``http://127.0.0.1:8787``)? Headers a browser did not send are not held against it
    (the CSRF token still is required); headers it sent must say "same origin"."""
    if method.upper() in SAFE_METHODS:
        return allow("safe-method", f"{method.upper()} changes nothing")
    if fetch_site is not None and fetch_site.strip().lower() != "same-origin":
        return refuse(
            "cross-site",
            f"the browser says this request was made from another site ({fetch_site!r}); "
            "changes are accepted only from the dashboard's own pages",
        )
    if origin is not None and origin.strip().rstrip("/").lower() not in {
        o.rstrip("/").lower() for o in ours
    }:
        return refuse(
            "cross-origin",
            f"the request comes from origin {origin!r}, not from this relay's dashboard; "
            "changes are accepted only from its own pages",
        )
    return allow("same-origin", "the request comes from the dashboard's own origin")


def csrf_token_matches(expected: str, given: str | None) -> Decision:
    """Is ``given`` the session's CSRF token? Compared in constant time."""
    if not given:
        return refuse(
            "csrf-missing",
            "this form is missing its CSRF token; reload the page and submit it again",
        )
    if not hmac.compare_digest(expected.encode("utf-8"), given.encode("utf-8")):
        return refuse(
            "csrf-mismatch",
            "this form's CSRF token does not belong to your session (it may come from an "
            "older sign-in); reload the page and submit it again",
        )
    return allow("csrf", "the form carries this session's CSRF token")
