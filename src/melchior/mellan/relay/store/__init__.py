"""Durable state of the relay: SQLite by default, PostgreSQL for several replicas.

Both backends implement :class:`melchior.mellan.relay.store.base.Store`; ``open_store``
picks one from a database URL and brings its schema up to date.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from melchior.mellan.relay.store.base import Store
from melchior.mellan.relay.store.dburl import default_sqlite_path, is_postgres, parse


def open_store(
    url: str | None = None,
    *,
    publish: Callable[[str], None] | None = None,
    migrate: bool = True,
) -> Store:
    """Open the store a database URL names and apply pending migrations.

    The URL's forms are :mod:`.dburl`'s (one parser for every command). A new SQLite file
    is created 0600 and a missing directory 0700: they hold credential hashes and payloads.
    """
    store: Store
    database = parse(url)  # DatabaseURLError (a ValueError) says why a URL is unusable
    if database.postgres:
        from melchior.mellan.relay.store.postgres import PostgresStore

        assert url is not None
        store = PostgresStore(url, publish=publish)
    else:
        from melchior.mellan.relay.store.sqlite import SQLiteStore

        assert database.path is not None
        path = database.path
        if not path.parent.exists():
            path.parent.mkdir(parents=True, mode=0o700)
        if not path.exists():  # owner-only from the first byte; SQLite's -wal/-shm follow it
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        store = SQLiteStore(path, publish=publish)
    if migrate:
        try:
            store.migrate()
        except BaseException:
            store.close()
            raise
    return store


__all__ = ["Store", "default_sqlite_path", "is_postgres", "open_store"]
