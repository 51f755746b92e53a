"""Copy a relay's whole database into an empty PostgreSQL one (``mellan relay migrate``).

The move from one machine (SQLite) to several replicas (PostgreSQL). The source is read
in one snapshot; the target is brought to the current schema by the same migrations a
relay applies, must be empty, and is filled in **one transaction**: a failure anywhere
leaves it empty, never half-copied. Row ids (``seq``, outbox ids) are copied as they
are, identity sequences are then set past the largest id ever handed out, and the row
count of every table is compared before the commit.

The target's triggers are held off while copying (``session_replication_role =
replica``, or, for a role that may not set it, each table's user triggers disabled for
the transaction): the push triggers of schema v6 would otherwise write an outbox row for
every copied event, and the copy must be the source, not the source plus side effects.

:data:`TABLES` is the one list of what a database holds, in an order that satisfies
foreign keys; a test compares it with the tables the migrations create, so a new table
cannot be left behind. The command itself (its messages, exit codes) is
:mod:`melchior.mellan.commands.relay`'s.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from melchior.mellan.relay.store import is_postgres, open_store
from melchior.mellan.relay.store.dburl import DatabaseURLError, parse, sqlite_uri

TABLES: tuple[str, ...] = (
    "workspace",
    "credential",
    "agent",
    "agent_limits",
    "agent_key",
    "enrollment",
    "agent_grant",
    "audit",
    "task",
    "push_config",
    "task_event",
    "task_turn",
    "task_message",
    "push_outbox",
    "dashboard_session",
    "task_route",
    "receiver_queued",
    "caller_unfinished",
)
"""Every table of the relay's schema (schema_version aside: the target migrates itself),
parents first. A task's push configs come before its events, as in a live database: so
the copy *would* fire the push triggers, were they not held off."""

BATCH = 1000


class MigrateError(Exception):
    """A copy that cannot be made; the message says why (nothing was written)."""


def _sqlite_path(url: str | None) -> str:
    try:
        database = parse(url)
    except DatabaseURLError as exc:
        raise MigrateError(str(exc)) from None
    assert database.path is not None  # is_postgres was checked by the caller
    return str(database.path)


class _Source:
    """The source database, read in one snapshot: counts, columns and rows per table."""

    def __init__(self, url: str | None, stack: ExitStack) -> None:
        self.postgres = is_postgres(url)
        if self.postgres:
            import psycopg

            assert url is not None
            self.pg = stack.enter_context(psycopg.connect(url))
            self.pg.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        else:
            path = _sqlite_path(url)
            try:
                self.lite = sqlite3.connect(sqlite_uri(Path(path), "ro"), uri=True, timeout=30)
            except sqlite3.Error as exc:
                raise MigrateError(f"cannot open the source {path}: {exc}") from None
            stack.callback(self.lite.close)
            self.lite.execute("BEGIN")  # one read snapshot for every table

    def one(self, sql: str) -> Any:
        if self.postgres:
            row = self.pg.execute(sql).fetchone()
        else:
            row = self.lite.execute(sql).fetchone()
        return None if row is None else row[0]

    def schema_version(self) -> int:
        try:
            return int(self.one("SELECT COALESCE(MAX(version), 0) FROM schema_version"))
        except Exception:
            return 0

    def columns(self, table: str) -> list[str]:
        if self.postgres:
            rows = self.pg.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                "AND table_schema = current_schema() ORDER BY ordinal_position",
                (table,),
            ).fetchall()
            return [r[0] for r in rows]
        return [r[1] for r in self.lite.execute(f'PRAGMA table_info("{table}")')]

    def count(self, table: str) -> int:
        return int(self.one(f'SELECT COUNT(*) FROM "{table}"'))

    def rows(self, table: str, columns: Sequence[str]) -> Iterator[Sequence[Any]]:
        cols = ", ".join(f'"{c}"' for c in columns)
        if self.postgres:
            with self.pg.cursor(name=f"copy_{table}") as cur:
                cur.execute(f'SELECT {cols} FROM "{table}"')
                while batch := cur.fetchmany(BATCH):
                    yield from batch
            return
        lite = self.lite.execute(f'SELECT {cols} FROM "{table}"')
        while batch := lite.fetchmany(BATCH):
            yield from batch

    def high_water(self, table: str, column: str) -> int:
        """The largest id ever handed out (deleted rows included), so none is reused."""
        top = int(self.one(f'SELECT COALESCE(MAX("{column}"), 0) FROM "{table}"'))
        if self.postgres:
            seq = self.one(f"SELECT pg_sequence_last_value(pg_get_serial_sequence('{table}', "
                           f"'{column}'))")  # fmt: skip
        else:
            try:
                seq = self.one(f"SELECT seq FROM sqlite_sequence WHERE name = '{table}'")
            except sqlite3.Error:
                seq = None
        return max(top, int(seq or 0))


def _converter(data_type: str, from_sqlite: bool) -> Callable[[Any], Any] | None:
    """How a SQLite value becomes the PostgreSQL column's (milliseconds → timestamptz,
    0/1 → boolean); PostgreSQL sources need none."""
    if not from_sqlite:
        return None
    if data_type == "timestamp with time zone":
        return lambda v: None if v is None else datetime.fromtimestamp(v / 1000, UTC)
    if data_type == "boolean":
        return lambda v: None if v is None else bool(v)
    return None


def _scalar(tx: Any, sql: str) -> Any:
    row = tx.execute(sql).fetchone()
    return None if row is None else row[0]


def _hold_triggers(tx: Any, say: Callable[[str], None]) -> Callable[[], None]:
    """Keep the target's triggers from firing during the copy; returns the undo."""
    import psycopg

    try:
        with tx.transaction():  # a savepoint: a refusal must not abort the copy
            tx.execute("SET LOCAL session_replication_role = replica")
        say("target triggers held off for the copy (session_replication_role = replica)")
        return lambda: tx.execute("SET LOCAL session_replication_role = DEFAULT")
    except psycopg.errors.InsufficientPrivilege:
        say("target triggers disabled for the copy's transaction (ALTER TABLE … DISABLE "
            "TRIGGER USER; this role may not set session_replication_role)")  # fmt: skip
        for table in TABLES:  # owner of the tables: it just created them by migrating
            tx.execute(f'ALTER TABLE "{table}" DISABLE TRIGGER USER')

        def undo() -> None:
            for table in TABLES:
                tx.execute(f'ALTER TABLE "{table}" ENABLE TRIGGER USER')

        return undo


def migrate(source_url: str | None, target_url: str, err: TextIO = sys.stderr) -> dict[str, int]:
    """Copy every table; returns the row count per table. MigrateError if refused."""
    if not is_postgres(target_url):
        raise MigrateError(f"--to must be a postgresql:// URL, not {target_url!r}")
    if source_url is not None and source_url.rstrip("/") == target_url.rstrip("/"):
        raise MigrateError("--from and --to name the same database")
    import psycopg

    def say(line: str) -> None:
        print(f"mellan relay migrate: {line}", file=err, flush=True)

    with ExitStack() as stack:
        src = _Source(source_url, stack)
        version = src.schema_version()
        try:  # the same migrations a relay applies; a newer target schema is refused there
            target_store = open_store(target_url)
            latest = target_store.migrate()
            target_store.close()
        except Exception as exc:
            raise MigrateError(f"cannot prepare the target database: {exc}") from None
        if version != latest:
            raise MigrateError(
                f"the source database is at schema version {version}, this mellan at "
                f"{latest}: start this version's 'mellan relay' on the source once (it "
                "upgrades the schema), stop it, then migrate"
            )
        counts = {t: src.count(t) for t in TABLES}
        say(f"source schema version {version}; " + ", ".join(f"{t} {n}" for t, n in counts.items()))
        tx = stack.enter_context(psycopg.connect(target_url))
        with tx.transaction():
            nonempty = [t for t in TABLES if _scalar(tx, f'SELECT EXISTS (SELECT 1 FROM "{t}")')]
            if nonempty:
                raise MigrateError(
                    f"the target database is not empty ({', '.join(nonempty)} have rows); "
                    "migrate into a new database (and do not start a relay on it first)"
                )
            types = {
                (r[0], r[1]): (r[2], r[3] == "YES")
                for r in tx.execute(
                    "SELECT table_name, column_name, data_type, is_identity FROM "
                    "information_schema.columns WHERE table_schema = current_schema()"
                ).fetchall()
            }
            undo = _hold_triggers(tx, say)
            for table in TABLES:
                columns = src.columns(table)
                missing = [c for c in columns if (table, c) not in types]
                extra = [c for (t, c) in types if t == table and c not in columns]
                if missing or extra:
                    raise MigrateError(
                        f"table {table}: columns differ between source and target "
                        f"(only in source: {missing}, only in target: {extra})"
                    )
                convert = [_converter(types[(table, c)][0], not src.postgres) for c in columns]
                cols = ", ".join(f'"{c}"' for c in columns)
                n = 0
                with tx.cursor() as cur, cur.copy(f'COPY "{table}" ({cols}) FROM STDIN') as copy:
                    for row in src.rows(table, columns):
                        copy.write_row(
                            [f(v) if f else v for f, v in zip(convert, row, strict=True)]
                        )
                        n += 1
                say(f"copied {table}: {n} rows")
                for column in [c for c in columns if types[(table, c)][1]]:
                    top = src.high_water(table, column)
                    tx.execute(
                        "SELECT setval(pg_get_serial_sequence(%s, %s), %s, %s)",
                        (table, column, max(top, 1), top > 0),
                    )
            undo()
            copied = {t: int(_scalar(tx, f'SELECT COUNT(*) FROM "{t}"')) for t in TABLES}
            wrong = {t: (counts[t], copied[t]) for t in TABLES if counts[t] != copied[t]}
            if wrong:
                raise MigrateError(f"row counts differ after the copy (source, target): {wrong}")
        say("verified: every table has the source's row count; committed")
        return copied
