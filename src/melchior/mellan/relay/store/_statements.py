"""Named statements the two dialects share but for the placeholder, written once.

Each backend's transaction (:class:`~.queue.Tx`) is a set of named statements in its own
dialect (River's driver interface). Some of them were the same text twice, ``?`` in
:mod:`.sqlite` and ``%s`` in :mod:`.postgres`: a fix to one (a filter, a column) could
silently miss the other. Those are written here once, in SQLite's ``qmark`` form, and
converted to psycopg's ``format`` form when this module is imported: :data:`SQLITE` and
:data:`POSTGRES` are the same :class:`Statements`, each in its dialect. A statement whose
SQL genuinely differs (claims, leases, group commit, caps) stays in its backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

from melchior.mellan.relay.store._common import RowLike

Params = Sequence[Any] | dict[str, Any]


class Statements(NamedTuple):
    """One field per statement: a name a backend misspells fails the type check."""

    set_push_secret: str
    push_secret: str
    delete_limits: str
    limits_row: str
    message_ref: str
    push_before: str
    approved_routes: str
    archive_turn: str
    delete_push_config: str
    delete_session: str
    finished_turn: str
    push_config_count: str
    push_config_row: str
    set_wake: str
    set_workspace_push_private: str
    workspace_push_private: str


SQLITE = Statements(
    set_push_secret="UPDATE agent SET push_secret = ? WHERE workspace = ? AND id = ?",
    push_secret="SELECT push_secret FROM agent WHERE workspace = ? AND id = ?",
    delete_limits="DELETE FROM agent_limits WHERE workspace = ? AND agent = ?",
    limits_row="SELECT * FROM agent_limits WHERE workspace = ? AND agent = ?",
    message_ref=(
        "SELECT task_id, turn FROM task_message WHERE workspace = ? AND caller = ?"
        " AND message_id = ?"
    ),
    push_before=(
        "SELECT state, turn, upto_seq FROM push_outbox WHERE task_id = ? AND config_id = ?"
        " AND id < ? ORDER BY id DESC LIMIT 1"
    ),
    approved_routes=(
        "SELECT * FROM task_route WHERE workspace = ? AND agent = ? AND state = 'approved'"
    ),
    archive_turn=(
        "INSERT INTO task_turn (task_id, turn, payload, state, result, error, epoch,"
        " finished_at) SELECT id, turn, payload, state, result, error, lease_epoch,"
        " finished_at FROM task WHERE id = ?"
    ),
    delete_push_config="DELETE FROM push_config WHERE workspace = ? AND task_id = ? AND id = ?",
    delete_session=(
        "DELETE FROM dashboard_session WHERE id_hash = ? RETURNING workspace, credential_id"
    ),
    finished_turn="SELECT state FROM task_turn WHERE task_id = ? AND epoch = ?",
    push_config_count="SELECT COUNT(*) AS n FROM push_config WHERE task_id = ?",
    push_config_row="SELECT * FROM push_config WHERE task_id = ? AND id = ?",
    set_wake=(
        "UPDATE agent SET wake_url = ?, wake_secret = COALESCE(?, wake_secret)"
        " WHERE workspace = ? AND id = ? RETURNING wake_url, wake_secret"
    ),
    set_workspace_push_private="UPDATE workspace SET push_allow_private = ? WHERE name = ?",
    workspace_push_private="SELECT push_allow_private FROM workspace WHERE name = ?",
)
"""The statements as written, in SQLite's ``qmark`` placeholders."""


def to_format(sql: str) -> str:
    """``sql`` with its ``?`` placeholders as psycopg's ``%s`` (and a literal ``%`` doubled,
    as that paramstyle wants); a ``?`` inside a quoted string literal is text, not a
    placeholder, and is kept."""
    parts = sql.split("'")
    for i in range(0, len(parts), 2):  # outside quotes: the even parts
        parts[i] = parts[i].replace("%", "%%").replace("?", "%s")
    for i in range(1, len(parts), 2):
        parts[i] = parts[i].replace("%", "%%")
    return "'".join(parts)


POSTGRES = Statements(*(to_format(sql) for sql in SQLITE))
"""The same statements in psycopg's ``format`` placeholders."""


class SharedTx:
    """The transaction methods that are each one of the :class:`Statements` and nothing
    else, written once for both backends' transactions (which give ``SQL``, their
    dialect's statements, and the three ways to run one). A method whose body differs by
    more than the statement's dialect stays in its backend."""

    SQL: ClassVar[Statements]

    def one(self, sql: str, params: Params = ()) -> Any:
        raise NotImplementedError

    def all(self, sql: str, params: Params = ()) -> Any:
        raise NotImplementedError

    def run(self, sql: str, params: Params = ()) -> int:
        raise NotImplementedError

    def message_ref(self, workspace: str, caller: str, message_id: str) -> RowLike | None:
        row: RowLike | None = self.one(self.SQL.message_ref, (workspace, caller, message_id))
        return row

    def delete_limits(self, workspace: str, agent: str) -> None:
        self.run(self.SQL.delete_limits, (workspace, agent))

    def limits_row(self, workspace: str, agent: str) -> RowLike | None:
        row: RowLike | None = self.one(self.SQL.limits_row, (workspace, agent))
        return row

    def push_before(self, task_id: str, config_id: str, row_id: int) -> RowLike | None:
        row: RowLike | None = self.one(self.SQL.push_before, (task_id, config_id, row_id))
        return row

    def archive_turn(self, task_id: str) -> None:
        self.run(self.SQL.archive_turn, (task_id,))

    def finished_turn(self, task_id: str, epoch: int) -> RowLike | None:
        row: RowLike | None = self.one(self.SQL.finished_turn, (task_id, epoch))
        return row

    def delete_session(self, id_hash: str) -> RowLike | None:
        row: RowLike | None = self.one(self.SQL.delete_session, (id_hash,))
        return row

    def approved_routes(self, workspace: str, agent: str) -> list[RowLike]:
        rows: list[RowLike] = self.all(self.SQL.approved_routes, (workspace, agent))
        return rows

    def set_wake(
        self, workspace: str, agent: str, url: str | None, secret: str | None
    ) -> RowLike | None:
        row: RowLike | None = self.one(self.SQL.set_wake, (url, secret, workspace, agent))
        return row

    def push_config_count(self, task_id: str) -> int:
        row = self.one(self.SQL.push_config_count, (task_id,))
        return int(row["n"]) if row else 0

    def delete_push_config(self, workspace: str, task_id: str, config_id: str) -> bool:
        return self.run(self.SQL.delete_push_config, (workspace, task_id, config_id)) == 1

    def push_config_row(self, task_id: str, config_id: str) -> RowLike | None:
        row: RowLike | None = self.one(self.SQL.push_config_row, (task_id, config_id))
        return row

    def agent_push_secret(
        self, workspace: str, agent: str, fresh: str, replace: bool
    ) -> str | None:
        keep = "" if replace else " AND push_secret IS NULL"
        self.run(self.SQL.set_push_secret + keep, (fresh, workspace, agent))
        row = self.one(self.SQL.push_secret, (workspace, agent))
        return None if row is None else str(row["push_secret"])

    def workspace_push_private(self, workspace: str) -> bool:
        row = self.one(self.SQL.workspace_push_private, (workspace,))
        return bool(row and row["push_allow_private"])
