"""Shared fixtures. Real parts only: real sockets, processes, SQLite and PostgreSQL."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property tests judge correctness, never speed: on a loaded 2-core machine a slow
# example is not a failure.
settings.register_profile("melchior", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("melchior")

PG_ADMIN_URL = os.environ.get("MELCHIOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
ON_CI = os.environ.get("CI", "").lower() == "true"


def _pg_unreachable(why: str) -> None:
    if ON_CI:
        pytest.fail(f"PostgreSQL is required on CI but unreachable at {PG_ADMIN_URL}: {why}")
    pytest.skip(f"PostgreSQL unreachable at {PG_ADMIN_URL}: {why}")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    psycopg = pytest.importorskip("psycopg")
    name = f"melchior_t_{secrets.token_hex(6)}"
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except Exception as exc:
        _pg_unreachable(str(exc).strip())
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
