"""Signed webhooks: HMAC-SHA256 over a timestamp and the body, with a replay window.

Used on both sides of every webhook mellan sends — the relay's *wake* posts to a
receiver (and push notifications) sign with :func:`sign`; whoever receives them checks
with :func:`verify`. One place, so the two sides can never disagree on the bytes signed.

What is signed is ``"{timestamp}." + body`` (the exact body bytes, a decimal unix
timestamp in seconds), so a signature cannot be moved to another body nor, outside the
replay ``window``, to another time. Comparison is constant-time. The headers::

    X-Mellan-Timestamp: 1767225600
    X-Mellan-Signature: v1=<hex HMAC-SHA256>

A verifier that must refuse even an exact replay *inside* the window keeps the
signatures it accepted for ``window`` seconds (a wake-up replayed is harmless: it only
makes a receiver ask for work sooner, so the receiver does not).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from melchior.policy.decision import Decision, allow, refuse

TIMESTAMP_HEADER = "X-Mellan-Timestamp"
SIGNATURE_HEADER = "X-Mellan-Signature"
VERSION = "v1"
WINDOW = 300.0
"""Default replay window, seconds either side of the verifier's clock."""


def _mac(secret: str, timestamp: str, body: bytes) -> str:
    signed = timestamp.encode("ascii") + b"." + body
    return hmac.new(secret.encode("utf-8"), signed, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, now: float) -> dict[str, str]:
    """The headers that sign ``body`` at time ``now`` (unix seconds) with ``secret``."""
    if not secret:
        raise ValueError("a signing secret must not be empty")
    timestamp = str(int(now))
    return {
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: f"{VERSION}={_mac(secret, timestamp, body)}",
    }


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None


def verify(
    secret: str, headers: Mapping[str, str], body: bytes, now: float, window: float = WINDOW
) -> Decision:
    """Was ``body`` signed with ``secret`` within ``window`` seconds of ``now``?"""
    stamp = _header(headers, TIMESTAMP_HEADER)
    given = _header(headers, SIGNATURE_HEADER)
    if stamp is None or given is None:
        return refuse(
            "unsigned", f"the request has no {TIMESTAMP_HEADER} and {SIGNATURE_HEADER} headers"
        )
    if not (stamp.isascii() and stamp.isdigit()) or len(stamp) > 12:
        return refuse("bad-timestamp", f"{TIMESTAMP_HEADER} must be unix seconds")
    if abs(now - int(stamp)) > window:
        return refuse(
            "replay-window",
            f"the signature's timestamp is more than {window:g} s from this clock "
            "(a replay, or clocks out of step)",
        )
    scheme, _, mac = given.partition("=")
    if (
        not secret
        or scheme != VERSION
        or not hmac.compare_digest(
            mac.encode("ascii", "replace"), _mac(secret, stamp, body).encode("ascii")
        )
    ):
        return refuse("bad-signature", "the signature does not match this body and secret")
    return allow("signed", "signed with the shared secret, within the replay window")
