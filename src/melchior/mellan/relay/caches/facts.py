"""What the door reads about a send's parties, remembered for a moment (:mod:`.memo`).

Every accepted send needs the receiver (its declared capabilities), the caller's grants
to it, the receiver's approved route for the capability (a bound session decides the
task's queue key) and, with a push config, the workspace's private-webhook switch. Read
each time they were four database round trips per send, a third of the relay's time
under load (docs/benchmarks.md). Remembered, a busy caller's sends are decided on the
event loop with no read at all.

What is kept: a receiver found, a non-empty set of granted capabilities, a route or the
absence of one, the switch either way. Never kept: an unknown agent or no grant — what
would refuse a send is read afresh every time, so a grant or agent just added anywhere
works at once. A grant revoked, a route approved or revoked, or the switch turned on
*another* replica applies to new sends here within :data:`~.memo.TTL` seconds; the
replica that changes one forgets all of these at once (:meth:`DoorFacts.forget`). A
route's session only picks the queue key: a claim reads the routes afresh in its own
transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from melchior.mellan.relay.caches.memo import TTL, Memo
from melchior.mellan.relay.store.base import Agent, Route

if TYPE_CHECKING:
    from melchior.mellan.relay.context import Relay


class DoorFacts:
    def __init__(self, ttl: float = TTL, clock: Callable[[], float] = time.monotonic) -> None:
        self.agents: Memo[tuple[str, str], Agent | None] = Memo(ttl, clock=clock)
        self.grants: Memo[tuple[str, str, str], frozenset[str]] = Memo(ttl, clock=clock)
        self.routes: Memo[tuple[str, str, str], Route | None] = Memo(ttl, clock=clock)
        self.private: Memo[str, bool] = Memo(ttl, clock=clock)

    def forget(self) -> None:
        """This replica changed an agent, a grant, a route or the switch: read afresh."""
        for memo in (self.agents, self.grants, self.routes, self.private):
            memo.forget()

    async def agent(self, relay: Relay, workspace: str, agent_id: str) -> Agent | None:
        read = partial(relay.call, relay.store.get_agent, workspace, agent_id)
        return await self.agents.recall((workspace, agent_id), read)

    async def granted(
        self, relay: Relay, workspace: str, caller: str, receiver: str
    ) -> frozenset[str]:
        async def read() -> frozenset[str]:
            store = relay.store
            return frozenset(
                await relay.call(store.granted_capabilities, workspace, caller, receiver)
            )

        return await self.grants.recall((workspace, caller, receiver), read)

    async def route(
        self, relay: Relay, workspace: str, agent: str, capability: str
    ) -> Route | None:
        read = partial(relay.call, relay.store.approved_route, workspace, agent, capability)
        return await self.routes.recall((workspace, agent, capability), read, _always)

    async def allow_private(self, relay: Relay, workspace: str) -> bool:
        read = partial(relay.call, relay.store.push_allow_private, workspace)
        return await self.private.recall(workspace, read, _always)


def _always(_: object) -> bool:
    """Keep the fact either way (no route is a fact; so is the switch turned off)."""
    return True
