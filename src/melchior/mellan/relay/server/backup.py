"""A consistent copy of a running relay's SQLite database (``mellan relay backup PATH``).

SQLite's online backup API copies the database from one read snapshot. The relay runs in
WAL mode, where a reader never blocks the writer, so the copy is taken in a single step:
one consistent moment, however busy the relay is. (Copying in small steps would release
the snapshot between steps, and every write by the relay would restart the copy — under
a steady load it might never finish.) Unlike ``cp`` of a live database with its ``-wal``
file beside it, the result is always a usable database; it is checked before it counts.
The copy is written to a hidden temporary file next to PATH and renamed into place only
when complete and checked, so PATH is never a half-written file.
PostgreSQL is backed up with its own tools (``pg_dump``; docs/operations.md). The command
itself (its messages, exit codes) is :mod:`melchior.mellan.commands.relay`'s.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import TextIO

from melchior.mellan.relay.store.dburl import DatabaseURLError, parse, sqlite_uri


class BackupError(Exception):
    """A backup that cannot be taken; the message says why."""


def sqlite_path(url: str | None) -> Path:
    """The file a SQLite database URL (or bare path, or None = the default) names — read
    by :func:`~.store.dburl.parse`, as every command reads it."""
    try:
        database = parse(url)
    except DatabaseURLError as exc:
        raise BackupError(str(exc)) from None
    if database.postgres:
        raise BackupError(
            "the relay's database is PostgreSQL: back it up with pg_dump (see 'Backups' in "
            "docs/operations.md), e.g. pg_dump --format=custom --file relay.dump '<URL>'"
        )
    assert database.path is not None
    return database.path


def backup(source: Path, target: Path, err: TextIO = sys.stderr) -> int:
    """Copy ``source`` to ``target`` with the backup API; returns the number of pages."""
    if not source.exists():
        raise BackupError(f"no database at {source}")
    if target.exists() and target.resolve() == source.resolve():
        raise BackupError("the backup would overwrite the database itself")
    if not target.parent.is_dir():
        raise BackupError(f"directory {target.parent} does not exist")
    partial = target.with_name(f".{target.name}.partial")
    partial.unlink(missing_ok=True)
    # owner-only from the first byte: the copy holds credential hashes and payloads
    os.close(os.open(partial, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600))

    def progress(status: int, remaining: int, total: int) -> None:
        percent = 100 * (total - remaining) // total if total else 100
        print(f"mellan relay backup: {percent}% ({total - remaining}/{total} pages)",
              file=err, flush=True)  # fmt: skip

    src: sqlite3.Connection | None = None
    dst: sqlite3.Connection | None = None
    try:  # whatever fails — even opening — leaves no partial file behind
        src = sqlite3.connect(sqlite_uri(source, "ro"), uri=True,
                              timeout=30)  # fmt: skip
        dst = sqlite3.connect(partial)
        src.execute("PRAGMA busy_timeout = 30000")
        pages = int(src.execute("PRAGMA page_count").fetchone()[0])
        size = int(src.execute("PRAGMA page_size").fetchone()[0]) * pages
        print(f"mellan relay backup: copying {source} ({pages} pages, {size / 2**20:.1f} MiB) "
              "from one snapshot", file=err, flush=True)  # fmt: skip
        src.backup(dst, pages=-1, progress=progress)  # one step: one snapshot
        dst.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
        check = dst.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise BackupError(f"the copy failed its integrity check: {check}")
        pages = int(dst.execute("PRAGMA page_count").fetchone()[0])
    except BaseException as exc:
        if dst is not None:
            dst.close()
        partial.unlink(missing_ok=True)
        if isinstance(exc, (sqlite3.Error, BackupError, OSError)):
            raise BackupError(f"backup of {source} failed: {exc}") from None
        raise
    finally:
        if src is not None:
            src.close()
    dst.close()
    os.replace(partial, target)
    return pages
