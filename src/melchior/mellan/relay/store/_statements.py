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

from typing import NamedTuple


class Statements(NamedTuple):
    """One field per statement: a name a backend misspells fails the type check."""

    set_push_secret: str
    push_secret: str
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
