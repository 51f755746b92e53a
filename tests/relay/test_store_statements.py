"""The statements both dialects share but for the placeholder are written once.

:mod:`melchior.mellan.relay.store._statements` holds them in SQLite's ``qmark`` form and
converts them for PostgreSQL at import. Each named statement exists in both dialects, in
the dialect's placeholders only, and the converted text is what each backend had written
out by hand before (pinned by value below); the store suite (tests/storekit.py) runs them
on both backends.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from melchior.mellan.relay.store import _statements, postgres, sqlite
from melchior.mellan.relay.store._statements import (
    POSTGRES,
    SQLITE,
    SharedTx,
    Statements,
    to_format,
)


def test_every_named_statement_exists_in_both_dialects() -> None:
    assert SQLITE._fields == POSTGRES._fields == Statements._fields
    for name in Statements._fields:
        lite, pg = getattr(SQLITE, name), getattr(POSTGRES, name)
        assert "%s" not in lite, name
        assert "?" not in pg, name
        assert lite.count("?") == pg.count("%s") >= 1, name
        assert pg.replace("%s", "?") == lite, name  # the same statement but for placeholders


def test_each_backend_runs_every_shared_statement_in_its_own_dialect() -> None:
    """Each statement is run either by the one method both transactions share
    (:class:`SharedTx`, through the backend's own ``SQL``) or by each backend, in its
    dialect; a shared method is never written again in a backend."""
    assert sqlite._Tx.SQL is SQLITE
    assert postgres._Tx.SQL is POSTGRES
    shared = Path(_statements.__file__).read_text(encoding="utf-8")
    lite = Path(sqlite.__file__).read_text(encoding="utf-8")
    pg = Path(postgres.__file__).read_text(encoding="utf-8")
    for name in Statements._fields:
        once = f"self.SQL.{name}" in shared
        assert once or (f"SQLITE.{name}" in lite and f"POSTGRES.{name}" in pg), name
    assert "POSTGRES." not in lite
    assert "SQLITE." not in pg
    methods = {n for n, v in vars(SharedTx).items() if callable(v)} - {"one", "all", "run"}
    assert len(methods) >= 14
    for tx in (sqlite._Tx, postgres._Tx):
        assert issubclass(tx, SharedTx)
        assert not methods & set(vars(tx)), tx


@pytest.mark.parametrize(
    ("name", "lite", "pg"),
    [
        (
            "approved_routes",
            "SELECT * FROM task_route WHERE workspace = ? AND agent = ? AND state = 'approved'",
            "SELECT * FROM task_route WHERE workspace = %s AND agent = %s AND state = 'approved'",
        ),
        (
            "archive_turn",
            "INSERT INTO task_turn (task_id, turn, payload, state, result, error, epoch,"
            " finished_at) SELECT id, turn, payload, state, result, error, lease_epoch,"
            " finished_at FROM task WHERE id = ?",
            "INSERT INTO task_turn (task_id, turn, payload, state, result, error, epoch,"
            " finished_at) SELECT id, turn, payload, state, result, error, lease_epoch,"
            " finished_at FROM task WHERE id = %s",
        ),
        (
            "set_wake",
            "UPDATE agent SET wake_url = ?, wake_secret = COALESCE(?, wake_secret)"
            " WHERE workspace = ? AND id = ? RETURNING wake_url, wake_secret",
            "UPDATE agent SET wake_url = %s, wake_secret = COALESCE(%s, wake_secret)"
            " WHERE workspace = %s AND id = %s RETURNING wake_url, wake_secret",
        ),
        (
            "push_before",
            "SELECT state, turn, upto_seq FROM push_outbox WHERE task_id = ? AND config_id = ?"
            " AND id < ? ORDER BY id DESC LIMIT 1",
            "SELECT state, turn, upto_seq FROM push_outbox WHERE task_id = %s"
            " AND config_id = %s AND id < %s ORDER BY id DESC LIMIT 1",
        ),
        (
            "delete_session",
            "DELETE FROM dashboard_session WHERE id_hash = ? RETURNING workspace, credential_id",
            "DELETE FROM dashboard_session WHERE id_hash = %s RETURNING workspace, credential_id",
        ),
    ],
)
def test_the_converted_text_is_what_each_dialect_had(name: str, lite: str, pg: str) -> None:
    assert getattr(SQLITE, name) == lite
    assert getattr(POSTGRES, name) == pg


def test_only_placeholders_outside_quotes_are_converted() -> None:
    sql = "SELECT '?', x FROM t WHERE a = ? AND b LIKE '50%' AND c = ?"
    assert to_format(sql) == "SELECT '?', x FROM t WHERE a = %s AND b LIKE '50%%' AND c = %s"
    assert re.findall(r"%s", to_format("SELECT 1 WHERE a = ?")) == ["%s"]
