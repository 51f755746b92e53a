"""Shared fixtures. Real parts only: real sockets, processes, SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from hypothesis import HealthCheck, settings

from pg_kit import Databases

# Property tests judge correctness, never speed: on a loaded 2-core machine a slow
# example is not a failure.
settings.register_profile("melchior", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("melchior")

PG_ADMIN_URL = os.environ.get("MELCHIOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
ON_CI = os.environ.get("CI", "").lower() == "true"


def _pg_unreachable(why: str) -> NoReturn:
    if ON_CI:
        pytest.fail(f"PostgreSQL is required on CI but unreachable at {PG_ADMIN_URL}: {why}")
    pytest.skip(f"PostgreSQL unreachable at {PG_ADMIN_URL}: {why}")


_databases: Databases | None = None


@contextlib.contextmanager
def fresh_pg_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for the ``with`` block (see tests/pg_kit.py: the
    process's databases are recycled, emptied in place, rather than dropped)."""
    global _databases
    psycopg = pytest.importorskip("psycopg")
    if _databases is None:
        _databases = Databases(PG_ADMIN_URL, psycopg.connect)
    try:
        name = _databases.take()
    except Exception as exc:
        _pg_unreachable(str(exc).strip())
    try:
        yield _databases.url(name)
    finally:
        _databases.give_back(name)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _databases is not None:
        _databases.close()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, nobody else's meanwhile."""
    with fresh_pg_database() as url:
        yield url


@pytest.fixture
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private XDG_RUNTIME_DIR, short enough for sun_path, for session registries."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="mr-", dir="/tmp"))
    d.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(d))
    yield d
    import shutil

    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def python() -> str:
    return sys.executable
