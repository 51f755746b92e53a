"""Is an agent's receiver online? Pure: decided from when the relay last saw it.

A receiver has no inbound listener, so the relay cannot ask it; it can only notice it
asking. Its claim is the heartbeat (and each lease renewal counts too): a receiver
long-polls with some ``wait`` and claims again as soon as the poll answers, so a live one
is seen at least every ``wait`` seconds — plus the relay's own write throttle
(:data:`SEEN_EVERY`: the sighting is written at most that often per agent, not per
claim). The rule gives it twice its wait and a margin above the throttle before calling
it offline, so one slow round trip never flips the dashboard:

    online  ⇔  now − last_seen ≤ 2 × wait + MARGIN        (wait capped at MAX_WAIT)

``wait`` is the one the receiver last claimed with (MAX_WAIT when unknown). A receiver
whose task slots are all busy does not claim, but it renews its leases every TTL/3 (10 s
at the default TTL, well inside the window), which counts too.
"""

from __future__ import annotations

from datetime import datetime

from melchior.policy.decision import Decision, allow, refuse

MAX_WAIT = 60.0
"""The longest long-poll the receiver API allows (seconds)."""
SEEN_EVERY = 5.0
"""Seconds between two stored sightings of one agent, at most one write (per replica)."""
MARGIN = 3 * SEEN_EVERY
"""Seconds of slack beyond twice the wait: above the write throttle, with room to spare."""


def _when(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def window(wait: float | None) -> float:
    """Seconds of silence after which a receiver that long-polls with ``wait`` is offline."""
    w = MAX_WAIT if wait is None else min(max(wait, 0.0), MAX_WAIT)
    return 2 * w + MARGIN


def receiver_online(last_seen: str | None, now: str, wait: float | None) -> Decision:
    """``last_seen`` and ``now`` are ISO-8601 stamps from one clock (the database's)."""
    if last_seen is None:
        return refuse("never-seen", "no receiver has claimed work for this agent yet")
    silent = (_when(now) - _when(last_seen)).total_seconds()
    limit = window(wait)
    if silent <= limit:
        return allow("seen", f"its receiver claimed work {max(silent, 0.0):.0f} s ago")
    return refuse(
        "silent",
        f"its receiver has not claimed work for {silent:.0f} s (more than {limit:.0f} s: "
        "twice its long-poll wait and a margin)",
    )
