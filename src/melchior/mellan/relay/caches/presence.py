"""Receivers online: the claim is the heartbeat, written cheaply.

Every claim (and every lease renewal) says "this agent's receiver is alive". Writing that
on every claim would add a commit per long-poll round — at high claim rates, a write per
claim for a fact that changes once. So each replica remembers in memory when it last
stored a sighting of each agent and writes again only when that is :data:`SEEN_EVERY`
old (the first sighting at once). What the receiver says about itself (``receiver`` in
the claim: name, version, adapters, running, concurrency) rides along with those writes.
Whether a receiver counts as online is :func:`melchior.policy.presence.receiver_online`.

A failed write (database away) is only logged: the sighting is a hint for people, and
the claim itself will answer the outage.
"""

from __future__ import annotations

import logging
import time
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from melchior.mellan.rawjson import decode, encode, whole
from melchior.mellan.relay.refusals import ApiError
from melchior.mellan.relay.store.base import Agent, Principal, StoreError
from melchior.policy.presence import SEEN_EVERY, receiver_online

if TYPE_CHECKING:
    from melchior.mellan.relay.context import Relay

log = logging.getLogger("melchior.mellan")

MAX_REMEMBERED = 100_000
"""Agents remembered per replica; past it the memory starts afresh (one extra write each)."""
_TEXT = {"name": 100, "version": 50}
_COUNTS = ("running", "concurrency")
MAX_ADAPTERS = 16


def receiver_info(raw: Any, wait: float) -> dict[str, Any]:
    """The claim's optional ``receiver`` object, checked field by field and bounded, with
    the claim's ``wait`` (the online window is twice it). Unknown keys are dropped."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _bad("receiver", "must be an object {name, version, adapters, running, concurrency}")
    info: dict[str, Any] = {}
    for key, most in _TEXT.items():
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or len(value) > most:
            raise _bad(f"receiver.{key}", f"must be a string of at most {most} characters")
        info[key] = value
    adapters = raw.get("adapters")
    if adapters is not None:
        if (
            not isinstance(adapters, list)
            or len(adapters) > MAX_ADAPTERS
            or not all(isinstance(a, str) and 0 < len(a) <= 32 for a in adapters)
        ):
            raise _bad(
                "receiver.adapters",
                f"must be a list of at most {MAX_ADAPTERS} adapter names (1-32 characters)",
            )
        info["adapters"] = adapters
    for key in _COUNTS:
        value = raw.get(key)
        if value is None:
            continue
        try:
            info[key] = whole(value, 0, 100_000)
        except ValueError as exc:
            raise _bad(f"receiver.{key}", str(exc)) from None
    info["wait"] = wait
    return info


def _bad(field: str, what: str) -> ApiError:
    return ApiError(400, "bad-request", f"field {field!r} {what}", {"field": field})


class Presence:
    """One replica's memory of the sightings it stored (see the module docstring)."""

    def __init__(self, every: float = SEEN_EVERY) -> None:
        self.every = every
        self._stored: dict[tuple[str, str], float] = {}
        self.writes = 0

    def due(self, workspace: str, agent: str, now: float | None = None) -> bool:
        """Is a sighting of ``agent`` worth a write now? (Claims it if so.)"""
        now = time.monotonic() if now is None else now
        key = (workspace, agent)
        last = self._stored.get(key)
        if last is not None and now - last < self.every:
            return False
        if len(self._stored) >= MAX_REMEMBERED:
            self._stored.clear()
        self._stored[key] = now
        return True

    def forget(self, workspace: str, agent: str) -> None:
        """The write failed: let the next sighting try again."""
        self._stored.pop((workspace, agent), None)


async def seen(relay: Relay, me: Principal, info: dict[str, Any] | None = None) -> None:
    """Note that ``me``'s receiver is alive — a write only when the last is stale."""
    if not relay.presence.due(me.workspace, me.subject):
        return
    text = encode(info) if info is not None else None
    try:
        await relay.call(relay.store.receiver_seen, me.workspace, me.subject, text)
    except StoreError as exc:
        relay.presence.forget(me.workspace, me.subject)
        log.warning("receiver sighting of %s not stored: %s", me.subject, exc)


def view(agent: Agent, now: str) -> dict[str, Any]:
    """``receiver`` in an agent's JSON: online, last seen, and what it said about itself."""
    info: dict[str, Any] | None = None
    if agent.receiver_info:
        try:
            loaded = decode(agent.receiver_info.encode("utf-8"))
        except ValueError:
            loaded = None
        info = loaded if isinstance(loaded, dict) else None
    wait = info.get("wait") if info else None
    decided = receiver_online(
        agent.receiver_seen_at,
        now,
        float(wait) if isinstance(wait, int | float | Decimal) else None,
    )
    return {
        "online": decided.allowed,
        "last_seen": agent.receiver_seen_at,
        "why": decided.reason,
        "info": info,
    }
