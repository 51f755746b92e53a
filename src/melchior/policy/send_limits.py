"""How much one agent may send through the relay, and how much may wait for one. Pure.

The relay's counterpart of the plane's three-a-turn (:mod:`.quotas`) and a bridged
agent's per-turn count (:mod:`.turn_quota`). Those count *turns*, because a plane or a
bridged coding agent has turns; a relay caller has none — it is any program holding an
agent credential — so its bound is a rate and caps on work outstanding:

- ``send-rate``: sends per second per calling agent, with a burst (a token bucket: it
  holds ``burst`` tokens, refills ``rate`` a second, a send takes one);
- ``max-unfinished-per-receiver``: tasks a caller has queued, running or waiting for
  input at one receiver — a caller may not bury one receiver under its own work;
- ``max-queued``: tasks waiting (queued) for a receiving agent from all callers
  together — back-pressure when a receiver is down or slow, before the database fills.

Each refusal names its limit, says why, and says when to try again (``Retry-After``).
The numbers are checked here; the counting is the store's (inside the enqueue
transaction, so two replicas cannot both take the last place) and the bucket's.
"""

from __future__ import annotations

import math
from typing import NamedTuple, TypeVar

from melchior.policy.decision import Decision, allow, refuse

RATE = "send-rate"
UNFINISHED = "max-unfinished-per-receiver"
QUEUED = "max-queued"
LIMITS = (RATE, UNFINISHED, QUEUED)

CAP_RETRY_AFTER = 5
"""Seconds a caller refused by a cap is told to wait: a cap frees when a receiver works,
which the relay cannot foresee; a few seconds keeps a polite client from hammering."""

MAX_RATE = 100_000.0
MAX_COUNT = 10_000_000


class Limits(NamedTuple):
    """The limits in force for one agent: as caller (rate, burst, unfinished per
    receiver) and as receiver (queued)."""

    send_rate: float  # sends per second
    burst: int  # sends in a row before the rate applies
    max_unfinished_per_receiver: int
    max_queued: int


DEFAULTS = Limits(send_rate=100.0, burst=1000, max_unfinished_per_receiver=1000, max_queued=10000)
"""Generous enough that normal use never meets them (docs/mellan.md, "Quotas"): they are
there to stop a runaway loop or a dead receiver from filling the database."""

FIELDS = Limits._fields


class Overrides(NamedTuple):
    """Per-agent (or workspace-default) values; None keeps the level below."""

    send_rate: float | None = None
    burst: int | None = None
    max_unfinished_per_receiver: int | None = None
    max_queued: int | None = None


V = TypeVar("V")


def pick(a: V | None, w: V | None, b: V) -> V:
    return a if a is not None else w if w is not None else b


def effective(workspace: Overrides, agent: Overrides, base: Limits = DEFAULTS) -> Limits:
    """The limits in force: the agent's override, else the workspace's, else the relay's."""

    return Limits(
        pick(agent.send_rate, workspace.send_rate, base.send_rate),
        pick(agent.burst, workspace.burst, base.burst),
        pick(
            agent.max_unfinished_per_receiver,
            workspace.max_unfinished_per_receiver,
            base.max_unfinished_per_receiver,
        ),
        pick(agent.max_queued, workspace.max_queued, base.max_queued),
    )


def check_value(name: str, value: float | int) -> float | int:
    """A configured limit, refused naming the field when it cannot be one."""
    if name not in FIELDS:
        raise ValueError(f"unknown limit {name!r}; limits are {', '.join(FIELDS)}")
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number")
    if name == "send_rate":
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError("send_rate must be a finite number of sends per second")
        if not 0 < value <= MAX_RATE:
            raise ValueError(f"send_rate must be above 0 and at most {MAX_RATE:g} per second")
        return float(value)
    if not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number")
    if not 1 <= value <= MAX_COUNT:
        raise ValueError(f"{name} must be between 1 and {MAX_COUNT}")
    return value


class Bucket(NamedTuple):
    """A token bucket's state: ``tokens`` left at time ``at`` (seconds, any clock)."""

    tokens: float
    at: float


class Take(NamedTuple):
    decision: Decision
    bucket: Bucket  # the state to keep (unchanged by a refusal but for the refill)
    retry_after: int  # whole seconds; 0 when allowed


def take(bucket: Bucket | None, now: float, rate: float, burst: int) -> Take:
    """Take one token for a send at ``now``; refused when the bucket is empty, with the
    seconds until a token is there. A new bucket starts full; a clock that went back
    refills nothing."""
    if bucket is None:
        bucket = Bucket(float(burst), now)
    elapsed = max(0.0, now - bucket.at)
    tokens = min(float(burst), bucket.tokens + elapsed * rate)
    if tokens >= 1.0:
        left = Bucket(tokens - 1.0, max(now, bucket.at))
        return Take(allow(RATE, f"{int(tokens) - 1} send(s) left in the burst"), left, 0)
    wait = max(1, math.ceil((1.0 - tokens) / rate))
    why = (
        f"this agent sends faster than its limit of {rate:g} a second (burst {burst}); "
        f"nothing was stored, retry in {wait} s"
    )
    return Take(refuse(RATE, why), Bucket(tokens, max(now, bucket.at)), wait)


def cap(limit: str, count: int, allowed: int, receiver: str) -> tuple[Decision, int]:
    """May one more task be stored when ``count`` already count against ``limit``
    (``UNFINISHED`` or ``QUEUED``, capped at ``allowed``)? (decision, retry-after)."""
    if count < allowed:
        return allow(limit, f"{count + 1} of at most {allowed}"), 0
    if limit == UNFINISHED:
        why = (
            f"this agent already has {count} unfinished task(s) at {receiver} (the limit is "
            f"{allowed}); wait for some to finish or cancel them. Nothing was stored"
        )
    elif limit == QUEUED:
        why = (
            f"{receiver} already has {count} task(s) waiting (the limit is {allowed}); it is "
            "not keeping up or not running. Nothing was stored; retry later"
        )
    else:
        raise ValueError(f"{limit!r} is not a cap")
    return refuse(limit, why), CAP_RETRY_AFTER
