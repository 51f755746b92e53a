"""What a database URL names: the one parser every command uses (the relay, ``backup``,
``migrate``, the settings check).

Each command once read the URL its own way, and they disagreed: ``sqlite:////abs/x.db``
opened fine in the relay while ``mellan relay backup`` turned it into an SQLite URI with
an authority and died in a traceback. So the forms are decided once, here:

* none → SQLite at the default path (``$XDG_DATA_HOME/mellan/relay.db``);
* ``postgresql://…`` or ``postgres://…`` → PostgreSQL, the URL handed to libpq as is;
* ``sqlite:///ABS/PATH`` (any number of slashes after ``sqlite:``: ``sqlite:////ABS`` is
  the same file) → SQLite at that absolute path;
* a bare path (no ``://``) → SQLite there, relative to the working directory.

Refused, with the reason: ``sqlite://`` with a relative path (``sqlite://relay.db``
reads as a host name), an SQLite URL with a query or fragment (no options are read from
it, so none may seem to be), an empty path, a NUL byte, and any other scheme.

:func:`redact` is the form a URL is shown in (status lines, ``--print-config``,
``migrate``'s summary): no password.

Pure: no file is opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

SCHEMES = "sqlite:///PATH, postgresql://… or a file path"


class DatabaseURLError(ValueError):
    """A database URL no command can use; the message says why."""


@dataclass(frozen=True)
class Database:
    """A parsed database URL: PostgreSQL (``url`` for libpq) or an SQLite file (``path``)."""

    url: str | None
    postgres: bool
    path: Path | None


def sqlite_uri(path: Path, mode: str = "ro") -> str:
    """An SQLite ``file:`` URI for the file at ``path`` (percent-encoded by
    :meth:`Path.as_uri`, so a path with ``?`` or ``#`` stays a path)."""
    return f"{path.resolve().as_uri()}?mode={mode}"


def default_sqlite_path() -> Path:
    """``$XDG_DATA_HOME/mellan/relay.db`` (XDG default ``~/.local/share``)."""
    from melchior.files import xdg

    return xdg("data") / "mellan" / "relay.db"


def redact(url: str | None) -> str:
    """A database URL fit for a status line: no password."""
    if url is None:  # sqlite:// + an absolute path: sqlite:///home/…
        return f"sqlite://{default_sqlite_path().resolve()}"
    if "://" not in url:
        return f"sqlite://{Path(url).resolve()}"
    parts = urlsplit(url)
    if parts.password:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        netloc = f"{parts.username}:***@{host}" if parts.username else host
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def is_postgres(url: str | None) -> bool:
    """Whether a database URL names PostgreSQL (else it is SQLite, or refused)."""
    return url is not None and url.startswith(("postgresql://", "postgres://"))


def parse(url: str | None) -> Database:
    """The database ``url`` names (see the module docstring), or :class:`DatabaseURLError`."""
    if url is None:
        return Database(None, False, default_sqlite_path())
    if "\x00" in url:
        raise DatabaseURLError("database URL contains a NUL byte")
    if is_postgres(url):
        return Database(url, True, None)
    if url.startswith("sqlite:"):
        rest = url[len("sqlite:") :]
        if not rest.startswith("//"):
            raise DatabaseURLError(f"unsupported database URL {url[:200]!r}: use {SCHEMES}")
        rest = rest[2:]
        if "?" in rest or "#" in rest:
            raise DatabaseURLError(
                f"sqlite URL takes no query or fragment (none would be read): {url[:200]!r}"
            )
        if not rest.startswith("/"):
            raise DatabaseURLError(
                f"sqlite URL needs an absolute path (sqlite:///PATH): {url[:200]!r}"
            )
        path = "/" + rest.lstrip("/")
        if path == "/":
            raise DatabaseURLError(f"sqlite URL names no file: {url[:200]!r}")
        return Database(url, False, Path(path))
    if "://" in url:
        raise DatabaseURLError(f"unsupported database URL {url[:200]!r}: use {SCHEMES}")
    if not url:
        raise DatabaseURLError("database path is empty")
    return Database(url, False, Path(url))


def problem(url: str) -> str | None:
    """Why ``url`` is not a database URL (for the settings check), or None."""
    try:
        parse(url)
    except DatabaseURLError as exc:
        return str(exc)
    return None
