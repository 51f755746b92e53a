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
