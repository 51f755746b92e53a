"""What a fenced receiver write came to: one vocabulary for the store, the relay and clients.

The receiver API answers ``{"outcome": …}`` with these values and the store returns them,
so the relay and a receiver on another machine read the same words without the client
importing anything of the server.
"""

from __future__ import annotations

import enum


class Outcome(enum.StrEnum):
    """What a fenced write (renew/progress/complete/fail/cancel-ack) came to."""

    OK = "ok"
    DUPLICATE = "duplicate"  # the same epoch already recorded this very outcome
    LEASE_LOST = "lease-lost"  # stale epoch, expired-and-reclaimed, or cancelled
    NOT_FOUND = "not-found"
