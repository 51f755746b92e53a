"""Facts read from the store, trusted for a moment: the one rule of every replica cache.

A relay replica reads the same few rows on every request — the credential behind a
token, the receiver a send goes to, the caller's grants to it, the route for the
capability. Read from the database each time, they cost more than the send itself. So a
fact once read is trusted for ``ttl`` seconds. The price, stated in docs/mellan.md: a
change made on *another* replica (a credential or grant revoked, a route approved) takes
effect here within ``ttl`` seconds rather than at once; the replica that makes a change
forgets what it remembered at once (:meth:`Memo.forget`). What the callers keep is
their choice: the credential and door memos never keep what would refuse a request (an
unknown token, a missing grant), so something just created anywhere works at once.

Used from the event loop's thread only (no lock): a replica's requests read and fill it
between awaits.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar, cast

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

TTL = 2.0
"""Seconds a remembered fact is trusted (docs/mellan.md and docs/operations.md say 2 s)."""


class Memo(Generic[K, V]):
    """At most ``size`` facts by key, each trusted until ``ttl`` seconds after it was read.

    Over ``size`` the table starts again rather than grow or track use: a rare refill
    costs only reads."""

    def __init__(
        self, ttl: float = TTL, size: int = 4096, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self.size = size
        self.clock = clock
        self._known: dict[K, tuple[float, V]] = {}
        self._generation = 0

    @property
    def generation(self) -> int:
        """Take this before a read whose result you will :meth:`put`: a :meth:`forget`
        in between (this replica changed the fact meanwhile) makes the put a no-op, so a
        read that raced a change is never trusted."""
        return self._generation

    def lookup(self, key: K) -> tuple[bool, V | None]:
        """(True, fact) while the fact is trusted, else (False, None) — a fact may itself
        be None (e.g. "this agent has no approved route for the capability")."""
        found = self._known.get(key)
        if found is None:
            return False, None
        until, value = found
        if self.clock() >= until:
            del self._known[key]
            return False, None
        return True, value

    def get(self, key: K) -> V | None:
        return self.lookup(key)[1]

    def put(self, key: K, value: V, since: int | None = None) -> None:
        """Remember ``value``; ``since``: the :attr:`generation` taken before reading it."""
        if since is not None and since != self._generation:
            return
        if len(self._known) >= self.size:
            self._known.clear()
        self._known[key] = (self.clock() + self.ttl, value)

    async def recall(
        self, key: K, read: Callable[[], Awaitable[V]], keep: Callable[[V], bool] = bool
    ) -> V:
        """The fact while it is trusted, else ``read()`` it — and remember it if ``keep``
        says so (by default a fact that is something: never None or empty), unless this
        replica changed facts while it was being read (:attr:`generation`)."""
        hit, known = self.lookup(key)
        if hit:
            return cast(V, known)  # a hit is a fact as stored (it may be None)
        since = self._generation
        found = await read()
        if keep(found):
            self.put(key, found, since)
        return found

    def forget(self) -> None:
        """Drop everything: this replica just changed what some fact says."""
        self._known.clear()
        self._generation += 1
