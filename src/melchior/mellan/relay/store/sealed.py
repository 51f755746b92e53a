"""Sealed tasks in the store (schema v12): agents' public keys and grants that require
sealing, written once above the two dialects.

A sealed task is encrypted to the receiving agent's public key, which the caller fetches
from the relay. The rules kept here: a key is **bound to an agent of the workspace** (the
row references the agent); registering one **replaces** the agent's key and says whether
it changed, with an audit record in the same transaction (``agent.key``), so the owner can
see every change a caller's pin would refuse; only the public half ever reaches the relay
(it is validated as one by the control API before it gets here). The relay holds keys but
is not trusted for them: callers pin what they first saw (``mellan/keys.py``).

A grant made ``sealed`` requires every send on its capabilities to be sealed: a capability
of (caller, receiver) requires it when any live grant covering it does
(:meth:`SealedStore.sealed_capabilities`, read uncached by the door for unsealed sends
only, so a sealed send pays nothing and a just-made grant holds at once).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from melchior.mellan.relay.store import _common as C
from melchior.mellan.relay.store.base import AgentKey, Grant, NotFoundError, Record

T = TypeVar("T")
Row = C.RowLike


class KeyTx(Protocol):
    """What registering a key needs of a backend's transaction: plain statements."""

    topics: list[str]

    def one(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Row | None: ...

    def run(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int: ...


class SealedStore:
    """The store's methods for sealed tasks; a backend supplies ``_transact``, ``_read``, ``P``."""

    P: ClassVar[str]
    NOW_SQL: ClassVar[str]

    def _transact(self, fn: Callable[[Any], T]) -> T:
        raise NotImplementedError

    def _read(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Sequence[Any]:
        raise NotImplementedError

    @staticmethod
    def _notes(tx: Any, notes: Sequence[C.Note | None]) -> list[int]:
        raise NotImplementedError

    def set_agent_key(
        self,
        workspace: str,
        agent: str,
        public_key: str,
        fingerprint: str,
        *,
        record: Record | None = None,
    ) -> tuple[AgentKey, bool]:
        """Register ``agent``'s public key (replacing any); the key and whether it changed.
        :class:`NotFoundError` for an agent the workspace does not have."""
        p = self.P

        def go(tx: KeyTx) -> tuple[AgentKey, bool]:
            if (
                tx.one(
                    f"SELECT 1 FROM agent WHERE workspace = {p} AND id = {p}", (workspace, agent)
                )
                is None
            ):
                raise NotFoundError(f"no agent {agent!r} in workspace {workspace!r}")
            old = tx.one(
                f"SELECT fingerprint FROM agent_key WHERE workspace = {p} AND agent = {p}",
                (workspace, agent),
            )
            changed = old is None or old["fingerprint"] != fingerprint
            if changed:
                tx.run(
                    f"DELETE FROM agent_key WHERE workspace = {p} AND agent = {p}",
                    (workspace, agent),
                )
                tx.run(
                    "INSERT INTO agent_key (workspace, agent, public_key, fingerprint,"
                    f" registered_at) VALUES ({p}, {p}, {p}, {p}, {self.NOW_SQL})",
                    (workspace, agent, public_key, fingerprint),
                )
                self._notes(tx, [C.record_note(workspace, record, agent)])
            row = tx.one(
                f"SELECT * FROM agent_key WHERE workspace = {p} AND agent = {p}", (workspace, agent)
            )
            assert row is not None
            return _key(row), changed

        return self._transact(go)

    def agent_key(self, workspace: str, agent: str) -> AgentKey | None:
        """The public key registered for ``agent``, if any."""
        p = self.P
        rows = self._read(
            f"SELECT * FROM agent_key WHERE workspace = {p} AND agent = {p}", (workspace, agent)
        )
        return _key(rows[0]) if rows else None

    def _seal_grant(self, tx: KeyTx, grant: Grant) -> Grant:
        """Make a grant just inserted (in ``tx``) require sealing."""
        p = self.P
        tx.run(f"UPDATE agent_grant SET sealed = {p} WHERE id = {p}", (True, grant.id))
        return dataclasses.replace(grant, sealed=True)

    def sealed_capabilities(self, workspace: str, caller: str, receiver: str) -> frozenset[str]:
        """The capabilities ``caller`` holds on ``receiver`` under a grant requiring sealing."""
        p = self.P
        rows = self._read(
            "SELECT capabilities FROM agent_grant WHERE workspace = "
            f"{p} AND caller = {p} AND receiver = {p} AND revoked_at IS NULL AND sealed = {p}",
            (workspace, caller, receiver, True),
        )
        return frozenset(c for r in rows for c in json.loads(r["capabilities"]))


def _key(r: Row) -> AgentKey:
    return AgentKey(r["agent"], r["public_key"], r["fingerprint"], C.iso(r["registered_at"]))
