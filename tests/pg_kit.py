"""Fresh, empty PostgreSQL databases for tests, recycled instead of dropped.

Why: on PostgreSQL 15 ``DROP DATABASE`` forces a checkpoint of the whole cluster, so
with a database per test every PostgreSQL test waited 0.6-2 s on the disk at teardown
(and ``CREATE DATABASE`` copies template1 through the WAL): measured, that was most of
the time those tests took. A database here is made once per worker process and, after
each test, emptied in place — its sessions cut, every schema dropped and ``public`` made
again as PostgreSQL makes it — which takes about 0.1 s and no checkpoint.

A test still gets a database nobody else uses (a worker runs one test at a time, and the
names are random) that looks freshly created: a database whose emptying fails, or that a
test left in any state emptying does not undo (settings, privileges, connections
refused, large objects, extensions), is dropped as before and never handed out again.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from typing import Any

EMPTY_CHECK = """
SELECT
  (SELECT count(*) FROM pg_namespace
     WHERE nspname NOT LIKE 'pg\\_%' AND nspname NOT IN ('information_schema', 'public'))
  + (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
       WHERE n.nspname = 'public')
  + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
       WHERE n.nspname = 'public')
  + (SELECT count(*) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
       WHERE n.nspname = 'public')
  + (SELECT count(*) FROM pg_extension WHERE extname <> 'plpgsql')
  + (SELECT count(*) FROM pg_largeobject_metadata)
  + (SELECT count(*) FROM pg_event_trigger)
  + (SELECT count(*) FROM pg_publication)
  + (SELECT count(*) FROM pg_default_acl)
"""
"""Objects a fresh database does not have: zero, or the database is not reused."""

DATABASE_CHECK = """
SELECT d.datallowconn AND d.datconnlimit = -1 AND d.datacl IS NULL
       AND NOT EXISTS (SELECT 1 FROM pg_db_role_setting s WHERE s.setdatabase = d.oid)
FROM pg_database d WHERE d.datname = %s
"""
"""What a test may change about the database itself (not inside it): as created, or it
is not reused."""


class Databases:
    """The databases of one test process: handed out one per test, emptied when given back.

    ``connect`` is psycopg's (taken as a parameter so importing this module needs no
    PostgreSQL driver)."""

    def __init__(self, admin_url: str, connect: Any) -> None:
        self.admin_url = admin_url
        self.base = admin_url.rsplit("/", 1)[0]
        self._connect = connect
        self._idle: list[str] = []
        self._public: tuple[Any, ...] | None = None

    def _admin(self) -> Any:
        return self._connect(self.admin_url, autocommit=True, connect_timeout=3)

    def url(self, name: str) -> str:
        return f"{self.base}/{name}"

    def take(self) -> str:
        """An empty database's name: a recycled one, or one made now."""
        if self._idle:
            return self._idle.pop()
        name = f"melchior_t_{secrets.token_hex(6)}"
        with self._admin() as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        if self._public is None:
            with self._connect(self.url(name)) as c:
                self._public = self._public_schema(c)
        return name

    def give_back(self, name: str) -> None:
        """Empty ``name`` for the next test, or drop it if it cannot be made as new."""
        try:
            reused = self._empty(name)
        except Exception:
            reused = False
        if reused:
            self._idle.append(name)
        else:
            self._drop(name)

    def close(self) -> None:
        """Drop every idle database (at the end of the process's session)."""
        while self._idle:
            self._drop(self._idle.pop())

    @contextlib.contextmanager
    def database(self) -> Iterator[str]:
        """A fresh database's URL for the ``with`` block."""
        name = self.take()
        try:
            yield self.url(name)
        finally:
            self.give_back(name)

    @staticmethod
    def _public_schema(c: Any) -> tuple[Any, ...]:
        row = c.execute(
            "SELECT pg_get_userbyid(nspowner), nspacl::text,"
            " obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = 'public'"
        ).fetchone()
        return tuple(row)

    def _empty(self, name: str) -> bool:
        with self._admin() as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            (as_created,) = admin.execute(DATABASE_CHECK, (name,)).fetchone()
        if not as_created:
            return False
        with self._connect(self.url(name), autocommit=True, connect_timeout=3) as c:
            # a terminated session may still hold its locks for a moment; a stuck one
            # makes this fail, and the database is dropped instead
            c.execute("SET lock_timeout = '10s'")
            schemas = [
                r[0]
                for r in c.execute(
                    "SELECT nspname FROM pg_namespace"
                    " WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'"
                )
            ]
            for schema in schemas:
                c.execute(f'DROP SCHEMA "{schema}" CASCADE')
            # public as CREATE DATABASE makes it on PostgreSQL 15 (owner, grant, comment)
            c.execute("CREATE SCHEMA public AUTHORIZATION pg_database_owner")
            c.execute("GRANT USAGE ON SCHEMA public TO PUBLIC")
            c.execute("COMMENT ON SCHEMA public IS 'standard public schema'")
            (left,) = c.execute(EMPTY_CHECK).fetchone()
            return bool(left == 0 and self._public_schema(c) == self._public)

    def _drop(self, name: str) -> None:
        with self._admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
