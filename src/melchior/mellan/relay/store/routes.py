"""Task routes, receivers' sightings and wake-up settings in the store, written once above
the two dialects (as :mod:`.queue` and :mod:`.outbox` are).

A route says how one receiving agent runs one capability. The rules kept here:

- **One approved route per (agent, capability).** Approving a route revokes the one
  approved before it, in the same transaction, each change with its own audit record
  (``route.approve``, and ``route.revoke`` naming the route that superseded it); the
  partial unique index ``task_route_approved`` (migrations v7) makes a second approved
  route impossible even if two approvals race (PostgreSQL retries the loser, which then
  supersedes the winner: the later approval stands).
- **A route only moves forward**: pending → approved → revoked, or pending → revoked. A
  revoked route is never approved again (the agent proposes a new one), so an approval
  always means what the owner read when approving it.
- **A route names an agent of the workspace** (the proposer).

Sightings (:meth:`RouteQueue.receiver_seen`) are a plain stamp on the agent row; the
relay writes one at most every few seconds per agent (:mod:`melchior.mellan.relay.caches.presence`).
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from melchior.mellan.relay.store import _common as C
from melchior.mellan.relay.store.base import (
    NewRoute,
    NotFoundError,
    Record,
    Route,
    RouteChange,
    RouteState,
)

T = TypeVar("T")
Row = C.RowLike


class RouteTx(Protocol):
    """The named statements routes need, in a backend's dialect."""

    topics: list[str]

    def agent_exists(self, workspace: str, agent_id: str) -> bool: ...

    def insert_route(self, route_id: str, route: NewRoute) -> Row: ...

    def route_row(self, workspace: str, route_id: str) -> Row | None:
        """The route, locked for the rest of the transaction (PostgreSQL: ``FOR UPDATE``)."""
        ...

    def route_to(
        self, workspace: str, route_id: str, state: str, by: str, from_states: Sequence[str]
    ) -> Row | None:
        """Move the route to ``state`` (stamping when and by whom) if it is in one of
        ``from_states``; the row as it is now, or None when it was not."""
        ...

    def supersede_routes(
        self, workspace: str, agent: str, capability: str, keep: str, by: str
    ) -> Sequence[Row]:
        """Revoke the approved routes of (agent, capability) other than ``keep``."""
        ...

    def approved_routes(self, workspace: str, agent: str) -> Sequence[Row]: ...

    def touch_receiver(self, workspace: str, agent: str, info: str | None) -> bool: ...

    def set_wake(
        self, workspace: str, agent: str, url: str | None, secret: str | None
    ) -> Row | None:
        """Set the wake URL (None clears it) and, unless None, the secret; the agent's
        ``wake_url`` and ``wake_secret`` as they are now, or None for an unknown agent."""
        ...


def new_route_id() -> str:
    return "rt_" + uuid.uuid4().hex[:20]


def new_wake_secret() -> str:
    return "mws_" + secrets.token_urlsafe(32)


def route_from_row(r: Row) -> Route:
    return Route(
        id=r["id"],
        workspace=r["workspace"],
        agent=r["agent"],
        capability=r["capability"],
        adapter=r["adapter"],
        session=r["session"],
        cwd=r["cwd"],
        profile=r["profile"],
        options=r["options"],
        state=RouteState(r["state"]),
        proposed_at=C.iso(r["proposed_at"]),
        proposed_by=r["proposed_by"],
        approved_at=C.iso_or_none(r["approved_at"]),
        approved_by=r["approved_by"],
        revoked_at=C.iso_or_none(r["revoked_at"]),
        revoked_by=r["revoked_by"],
    )


def superseded_note(old: Route, by: str, new_id: str) -> C.Note:
    return C.Note(
        old.workspace, by, "route.revoke", old.id, True, "superseded",
        f"route {new_id} was approved for {old.agent} running {old.capability}; this one "
        "stops applying",
        {"agent": old.agent, "capability": old.capability, "superseded_by": new_id},
    )  # fmt: skip


class RouteQueue:
    """Mixin of :class:`~.queue.QueueStore`: the routes half of the store."""

    P: ClassVar[str]

    def _transact(self, fn: Callable[[RouteTx], T]) -> T:
        raise NotImplementedError

    def _read(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Sequence[Any]:
        raise NotImplementedError

    @staticmethod
    def _notes(tx: Any, notes: Sequence[C.Note | None]) -> list[int]:
        raise NotImplementedError

    # -- routes -------------------------------------------------------------------------------
    def propose_route(self, route: NewRoute, *, record: Record | None = None) -> Route:
        def go(tx: RouteTx) -> Route:
            if not tx.agent_exists(route.workspace, route.agent):
                raise NotFoundError(f"unknown agent {route.agent!r}")
            made = route_from_row(tx.insert_route(new_route_id(), route))
            self._notes(tx, [C.record_note(route.workspace, record, made.id)])
            return made

        return self._transact(go)

    def get_route(self, workspace: str, route_id: str) -> Route | None:
        p = self.P
        rows = self._read(
            f"SELECT * FROM task_route WHERE workspace = {p} AND id = {p}", (workspace, route_id)
        )
        return route_from_row(rows[0]) if rows else None

    def list_routes(
        self,
        workspace: str,
        *,
        agent: str | None = None,
        capability: str | None = None,
        states: Sequence[RouteState] | None = None,
        limit: int = 500,
    ) -> list[Route]:
        p = self.P
        sql = f"SELECT * FROM task_route WHERE workspace = {p}"
        params: list[Any] = [workspace]
        for col, val in (("agent", agent), ("capability", capability)):
            if val is not None:
                sql += f" AND {col} = {p}"
                params.append(val)
        if states is not None:
            if not states:
                return []
            sql += f" AND state IN ({', '.join([p] * len(states))})"
            params += [RouteState(s).value for s in states]
        sql += f" ORDER BY proposed_at DESC, id DESC LIMIT {p}"
        params.append(limit)
        return [route_from_row(r) for r in self._read(sql, params)]

    def approve_route(
        self, workspace: str, route_id: str, by: str, *, record: Record | None = None
    ) -> RouteChange:
        def go(tx: RouteTx) -> RouteChange:
            row = tx.route_row(workspace, route_id)
            if row is None:
                return RouteChange(None, False)
            if row["state"] != RouteState.PENDING.value:
                return RouteChange(route_from_row(row), False)
            old = [
                route_from_row(r)
                for r in tx.supersede_routes(workspace, row["agent"], row["capability"],
                                             route_id, by)
            ]  # fmt: skip
            went = tx.route_to(workspace, route_id, RouteState.APPROVED.value, by, ("pending",))
            assert went is not None  # locked above, and pending
            notes = [superseded_note(o, by, route_id) for o in old]
            self._notes(tx, [C.record_note(workspace, record, route_id), *notes])
            return RouteChange(route_from_row(went), True, tuple(old))

        return self._transact(go)

    def revoke_route(
        self, workspace: str, route_id: str, by: str, *, record: Record | None = None
    ) -> RouteChange:
        def go(tx: RouteTx) -> RouteChange:
            went = tx.route_to(
                workspace, route_id, RouteState.REVOKED.value, by, ("pending", "approved")
            )
            if went is None:
                row = tx.route_row(workspace, route_id)
                return RouteChange(None if row is None else route_from_row(row), False)
            self._notes(tx, [C.record_note(workspace, record, route_id)])
            return RouteChange(route_from_row(went), True)

        return self._transact(go)

    def approved_route(self, workspace: str, agent: str, capability: str) -> Route | None:
        p = self.P
        rows = self._read(
            f"SELECT * FROM task_route WHERE workspace = {p} AND agent = {p}"
            f" AND capability = {p} AND state = 'approved'",
            (workspace, agent, capability),
        )
        return route_from_row(rows[0]) if rows else None

    @staticmethod
    def _routes_for(tx: RouteTx, workspace: str, agent: str) -> dict[str, Route]:
        """The approved routes of ``agent`` by capability, read in the claim's transaction."""
        return {r["capability"]: route_from_row(r) for r in tx.approved_routes(workspace, agent)}

    # -- receivers and wake-ups ---------------------------------------------------------------
    def receiver_seen(self, workspace: str, agent: str, info: str | None = None) -> bool:
        return self._transact(lambda tx: tx.touch_receiver(workspace, agent, info))

    def set_wake(
        self,
        workspace: str,
        agent: str,
        url: str | None,
        *,
        secret: str | None = None,
        record: Record | None = None,
    ) -> tuple[str | None, str | None, bool] | None:
        def go(tx: RouteTx) -> tuple[str | None, str | None, bool] | None:
            row = tx.set_wake(workspace, agent, url, secret)
            if row is None:
                return None
            fresh = secret is not None
            if url is not None and row["wake_secret"] is None:
                row = tx.set_wake(workspace, agent, url, new_wake_secret())
                assert row is not None
                fresh = True
            self._notes(tx, [C.record_note(workspace, record, agent)])
            return row["wake_url"], row["wake_secret"], fresh

        return self._transact(go)

    def wake_target(self, workspace: str, agent: str) -> tuple[str, str, bool] | None:
        p = self.P
        rows = self._read(
            "SELECT a.wake_url, a.wake_secret, w.push_allow_private FROM agent a"
            f" JOIN workspace w ON w.name = a.workspace WHERE a.workspace = {p} AND a.id = {p}",
            (workspace, agent),
        )
        if not rows or rows[0]["wake_url"] is None or rows[0]["wake_secret"] is None:
            return None
        r = rows[0]
        return str(r["wake_url"]), str(r["wake_secret"]), bool(r["push_allow_private"])
