"""Credentials: 256-bit random tokens, stored only as hashes, compared in constant time.

A token is shown once, when it is minted; the store keeps its SHA-256. Because the
token has 256 bits of entropy a fast hash is enough (no password stretching), and
lookup by hash means the comparison that matters happens inside the database's
index rather than in a Python loop an attacker could time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from starlette.requests import Request

from melchior.mellan.relay.caches.memo import Memo
from melchior.mellan.relay.store.base import CredentialKind, Principal, Task
from melchior.policy.visibility import Parties, Viewer

if TYPE_CHECKING:
    from melchior.mellan.relay.context import Relay

TOKEN_PREFIX = "mln_"


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def same_hash(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def bearer(header: str | None) -> str | None:
    """The token in an ``Authorization: Bearer …`` header, or None."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


# -- who is asking: one reading of a bearer credential for every surface ---------------------


class Identified(NamedTuple):
    """The principal behind a request's credential, or why there is none: ``missing`` (no
    bearer header) or ``unknown`` (unknown, revoked or expired). Each surface words the
    refusal its own way; this is the one place the credential is read."""

    principal: Principal | None
    why: str = ""


class Credentials(Memo[str, Principal | None]):
    """Live credentials by token hash, remembered for ``ttl`` seconds (:mod:`.memo`).

    Every request presents a credential, and looking one up is a database read in a
    worker thread; a caller sending hundreds of requests a second would pay it each time.
    So a credential found live is trusted for ``ttl`` seconds more: revoked (or expiring)
    on *another* replica, it is refused within ``ttl`` seconds rather than at once; the
    replica that revokes forgets it at once. Unknown tokens are never remembered, so a
    credential just minted anywhere works at once."""


async def identify(request: Request, relay: Relay) -> Identified:
    token = bearer(request.headers.get("authorization"))
    if token is None:
        return Identified(None, "missing")
    digest = hash_token(token)
    read = partial(relay.call, relay.store.principal_for, digest)
    principal = await relay.credentials.recall(digest, read)
    return Identified(principal, "" if principal is not None else "unknown")


def viewer_of(principal: Principal) -> Viewer:
    """The principal as :mod:`melchior.policy.visibility` sees a viewer."""
    return Viewer(principal.workspace, principal.kind is CredentialKind.OWNER, principal.subject)


def parties_of(task: Task) -> Parties:
    return Parties(task.workspace, task.caller, task.receiver)
