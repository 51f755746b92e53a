"""Durable state of the relay: SQLite by default, PostgreSQL for several replicas.

Both backends implement :class:`melchior.mellan.relay.store.base.Store`; ``open_store``
picks one from a database URL and brings its schema up to date.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from melchior.files import xdg
from melchior.mellan.relay.store.base import Store


def default_sqlite_path() -> Path:
    """``$XDG_DATA_HOME/mellan/relay.db`` (XDG default ``~/.local/share``)."""
    return xdg("data") / "mellan" / "relay.db"


def is_postgres(url: str | None) -> bool:
    """Whether a database URL names PostgreSQL (else it is SQLite)."""
    return url is not None and url.startswith(("postgresql://", "postgres://"))


def open_store(
    url: str | None = None,
    *,
    publish: Callable[[str], None] | None = None,
    migrate: bool = True,
) -> Store:
    """Open the store a database URL names and apply pending migrations.

    ``None`` → SQLite at :func:`default_sqlite_path`; ``sqlite:///path`` or a bare path →
    SQLite there; ``postgresql://…`` (or ``postgres://…``) → PostgreSQL. A new SQLite file
    is created 0600 and a missing directory 0700: they hold credential hashes and payloads.
    """
    store: Store
    if url is not None and is_postgres(url):
        from melchior.mellan.relay.store.postgres import PostgresStore

        store = PostgresStore(url, publish=publish)
    else:
        from melchior.mellan.relay.store.sqlite import SQLiteStore

        if url is None:
            path = default_sqlite_path()
        elif url.startswith("sqlite://"):
            rest = url[len("sqlite://") :]
            if not rest.startswith("/"):
                raise ValueError(f"sqlite URL needs an absolute path: {url!r}")
            path = Path(rest)
        elif "://" in url:
            raise ValueError(f"unsupported database URL: {url!r}")
        else:
            path = Path(url)
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
