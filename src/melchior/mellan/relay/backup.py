"""``mellan relay backup PATH``: a consistent copy of a running relay's SQLite database.

SQLite's online backup API copies the database page by page from a snapshot; with the
relay's WAL journal a writer is never blocked for long (each step holds a read
transaction for a few pages), and a step that sees the source change since the last one
restarts, so the finished file is one consistent moment — unlike ``cp`` of a database
with a live ``-wal`` file beside it. The copy is written to a temporary file next to
PATH and renamed into place only when complete, so PATH is never a half-written file.
PostgreSQL is backed up with its own tools (``pg_dump``; docs/operations.md).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import TextIO

from melchior.mellan.relay.store import default_sqlite_path, is_postgres

PAGES_PER_STEP = 256
"""Pages copied per step: small enough that writers get the database back quickly."""


class BackupError(Exception):
    """A backup that cannot be taken; the message says why."""


def sqlite_path(url: str | None) -> Path:
    """The file a SQLite database URL (or bare path, or None = the default) names."""
    if url is None:
        return default_sqlite_path()
    if is_postgres(url):
        raise BackupError(
            "the relay's database is PostgreSQL: back it up with pg_dump (see 'Backups' in "
            "docs/operations.md), e.g. pg_dump --format=custom --file relay.dump '<URL>'"
        )
    if url.startswith("sqlite://"):
        rest = url[len("sqlite://") :]
        if not rest.startswith("/"):
            raise BackupError(f"sqlite URL needs an absolute path: {url!r}")
        return Path(rest)
    if "://" in url:
        raise BackupError(f"unsupported database URL: {url!r}")
    return Path(url)


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
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
    dst = sqlite3.connect(partial)
    shown = -1

    def progress(status: int, remaining: int, total: int) -> None:
        nonlocal shown
        percent = 100 * (total - remaining) // total if total else 100
        if percent // 10 != shown // 10 or remaining == 0:
            shown = percent
            print(f"mellan relay backup: {percent}% ({total - remaining}/{total} pages)",
                  file=err, flush=True)  # fmt: skip

    try:
        src.execute("PRAGMA busy_timeout = 30000")
        src.backup(dst, pages=PAGES_PER_STEP, progress=progress)
        dst.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
        check = dst.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise BackupError(f"the copy failed its integrity check: {check}")
        pages = int(dst.execute("PRAGMA page_count").fetchone()[0])
    except sqlite3.Error as exc:
        dst.close()
        partial.unlink(missing_ok=True)
        raise BackupError(f"backup of {source} failed: {exc}") from None
    finally:
        src.close()
    dst.close()
    os.replace(partial, target)
    return pages


def backup_command(database: str | None, target: Path) -> int:
    try:
        source = sqlite_path(database)
        pages = backup(source, target)
    except BackupError as exc:
        print(f"mellan relay backup: {exc}", file=sys.stderr)
        return 1
    print(f"mellan relay backup: {source} copied to {target} ({pages} pages, consistent)",
          file=sys.stderr)  # fmt: skip
    return 0
