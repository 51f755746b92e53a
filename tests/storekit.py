"""Fixtures and helpers the store/queue tests share: every test runs on both backends.

Import ``db_url_fixture``/``store_fixture`` into a test module to get fixtures
``db_url`` and ``store`` there.

A real SQLite file in a temporary directory and a real, fresh PostgreSQL database
(``pg_url`` from conftest). Test modules import the fixtures by name.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from melchior.mellan.store import open_store
from melchior.mellan.store.base import Capability, NewTask, Store

WS = "w"
CALLER = "local/caller"
RECEIVER = "private/ops"


@pytest.fixture(
    name="db_url",
    params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)],
)
def db_url_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL for one backend: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'relay.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture(name="store")
def store_fixture(db_url: str) -> Iterator[Store]:
    """A migrated store with workspace ``w`` and agents caller → receiver."""
    s = open_store(db_url)
    seed(s)
    try:
        yield s
    finally:
        s.close()


def seed(s: Store) -> None:
    s.ensure_workspace(WS)
    for agent in (CALLER, RECEIVER):
        if s.get_agent(WS, agent) is None:
            s.add_agent(WS, agent, f"agent {agent}", [Capability("incident.inspect", "look")])


def new_task(**kw: Any) -> NewTask:
    base: dict[str, Any] = {
        "workspace": WS,
        "caller": CALLER,
        "receiver": RECEIVER,
        "capability": "incident.inspect",
        "payload": '{"n": 12345678901234567890}',
    }
    base.update(kw)
    return NewTask(**base)


def wait_db_clock_past(s: Store, iso_stamp: str) -> None:
    """Block until the *database* clock is past ``iso_stamp`` (never a wall-clock bound:
    the loop asks the database, and gives up only after very many tries)."""
    for _ in range(100_000):
        if s.now() > iso_stamp:
            return
        time.sleep(0.005)
    raise AssertionError(f"database clock never passed {iso_stamp}")
