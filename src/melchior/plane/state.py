"""What a plane remembers, in SQLite: doors, wake-ups, held notes, the log, ceilings spent.

A plane stopped and started again must not forget that the operator opened a door, that
a note is waiting for a ``y / n``, how far a chain has travelled or what an agent has
spent, so all of it lives here. The database is in WAL mode and every change is one
transaction (:meth:`State.tx` nests, committing once at the outermost level), so a
crash leaves each change whole or absent: a held note released by ``y`` is marked
sent, its door opened, the recipient's wake-up queued and the log written together.

A turn that was running when the plane stopped is not run again (a coding agent may
already have acted): on start it is marked interrupted and whoever waited on it is told.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from melchior.policy.hops import Chain

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS doors (
    sender TEXT NOT NULL, recipient TEXT NOT NULL, how TEXT NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (sender, recipient));
CREATE TABLE IF NOT EXISTS inputs (
    id INTEGER PRIMARY KEY, agent TEXT NOT NULL, kind TEXT NOT NULL, sender TEXT,
    text TEXT NOT NULL, chain TEXT, mentions TEXT NOT NULL DEFAULT '[]', message_id TEXT,
    state TEXT NOT NULL DEFAULT 'pending', turn INTEGER, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS inputs_pending ON inputs (agent, state, id);
CREATE TABLE IF NOT EXISTS held (
    id INTEGER PRIMARY KEY, sender TEXT NOT NULL, recipient TEXT NOT NULL, text TEXT NOT NULL,
    chain TEXT NOT NULL, message_id TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'waiting',
    at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS log (
    id INTEGER PRIMARY KEY, at REAL NOT NULL, kind TEXT NOT NULL, sender TEXT,
    recipient TEXT, receipt TEXT, rule TEXT, reason TEXT, chain TEXT, hop INTEGER,
    message_id TEXT, turn INTEGER, text TEXT);
CREATE TABLE IF NOT EXISTS notices (
    id INTEGER PRIMARY KEY, agent TEXT NOT NULL, text TEXT NOT NULL, told INTEGER NOT NULL
    DEFAULT 0, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS spent (
    agent TEXT PRIMARY KEY, turns INTEGER NOT NULL DEFAULT 0, cost REAL NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY, agent TEXT NOT NULL, input INTEGER, state TEXT NOT NULL,
    text TEXT, error TEXT, cost REAL, started REAL NOT NULL, ended REAL);
"""


class Input(NamedTuple):
    """One wake-up waiting for (or taken by) an agent's turn."""

    id: int
    agent: str
    kind: str  # operator | webhook | note | answer
    sender: str | None
    text: str
    chain: Chain | None
    mentions: tuple[str, ...]
    message_id: str | None
    state: str


class Held(NamedTuple):
    """A note that had no door, waiting for the operator's ``y / n``."""

    id: int
    sender: str
    recipient: str
    text: str
    chain: Chain
    message_id: str
    state: str


def _lock(path: Path) -> int:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StateBusy(f"another plane is running with the state {path}") from None
    return fd


def _chain(raw: str | None) -> Chain | None:
    return None if raw is None else Chain.from_dict(json.loads(raw))


def _chain_json(chain: Chain | None) -> str | None:
    return None if chain is None else json.dumps(chain.as_dict())


class StateBusy(RuntimeError):
    """Another plane is running on this state (two would run every turn twice)."""


class State:
    """The plane's database; one per plane, opened by the runner and read by ``plane log``.

    A writer holds an exclusive lock on ``<state>.lock`` while it is open, so a second
    ``melchior plane run`` of the same plane is refused instead of running every wake-up
    twice; readers (``plane log``, ``plane status``) take no lock.
    """

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        self._depth = 0
        self._lock: int | None = None
        if not readonly:
            self._lock = _lock(path)
        if readonly:
            self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        else:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.db = sqlite3.connect(path, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA busy_timeout=5000")
            with self.tx():
                for stmt in SCHEMA.split(";"):
                    if stmt.strip():
                        self.db.execute(stmt)
                self.db.execute(
                    "INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
                )
        self.db.row_factory = sqlite3.Row

    def close(self) -> None:
        self.db.close()
        if self._lock is not None:
            os.close(self._lock)  # releases the flock
            self._lock = None

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction; nested uses join the outer one."""
        depth = self._depth
        self._depth = depth + 1
        if depth == 0:
            self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            if depth == 0:
                self.db.execute("ROLLBACK")
            raise
        else:
            if depth == 0:
                self.db.execute("COMMIT")
        finally:
            self._depth = depth

    # -- doors ----------------------------------------------------------------------------

    def opened(self, sender: str) -> set[str]:
        rows = self.db.execute("SELECT recipient FROM doors WHERE sender = ?", (sender,))
        return {r[0] for r in rows}

    def open_door(self, sender: str, recipient: str, how: str) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO doors VALUES (?, ?, ?, ?)",
                (sender, recipient, how, time.time()),
            )

    def drop_door(self, sender: str, recipient: str) -> bool:
        with self.tx() as db:
            cur = db.execute(
                "DELETE FROM doors WHERE sender = ? AND recipient = ?", (sender, recipient)
            )
            return cur.rowcount > 0

    # -- wake-ups -------------------------------------------------------------------------

    def enqueue(
        self,
        agent: str,
        kind: str,
        text: str,
        *,
        sender: str | None = None,
        chain: Chain | None = None,
        mentions: Sequence[str] = (),
        message_id: str | None = None,
    ) -> int:
        with self.tx() as db:
            cur = db.execute(
                "INSERT INTO inputs (agent, kind, sender, text, chain, mentions, message_id, at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    agent,
                    kind,
                    sender,
                    text,
                    _chain_json(chain),
                    json.dumps(sorted(mentions)),
                    message_id,
                    time.time(),
                ),
            )
            return int(cur.lastrowid or 0)

    def _input(self, row: sqlite3.Row) -> Input:
        return Input(
            row["id"],
            row["agent"],
            row["kind"],
            row["sender"],
            row["text"],
            _chain(row["chain"]),
            tuple(json.loads(row["mentions"])),
            row["message_id"],
            row["state"],
        )

    def next_input(self, agent: str) -> Input | None:
        row = self.db.execute(
            "SELECT * FROM inputs WHERE agent = ? AND state = 'pending' ORDER BY id LIMIT 1",
            (agent,),
        ).fetchone()
        return None if row is None else self._input(row)

    def pending(self, agent: str) -> list[Input]:
        rows = self.db.execute(
            "SELECT * FROM inputs WHERE agent = ? AND state = 'pending' ORDER BY id", (agent,)
        )
        return [self._input(r) for r in rows]

    def set_input(self, input_id: int, state: str, turn: int | None = None) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE inputs SET state = ?, turn = COALESCE(?, turn) WHERE id = ?",
                (state, turn, input_id),
            )

    def interrupted(self, input_id: int | None = None) -> list[Input]:
        """Inputs whose turn was running when the plane stopped (all, or ``input_id``),
        now marked interrupted, with their turns."""
        where, args = (
            ("state = 'running'", ())
            if input_id is None
            else (
                "state = 'running' AND id = ?",
                (input_id,),
            )
        )
        with self.tx() as db:
            rows = [self._input(r) for r in db.execute(f"SELECT * FROM inputs WHERE {where}", args)]
            db.execute(f"UPDATE inputs SET state = 'interrupted' WHERE {where}", args)
            for inp in rows:
                db.execute(
                    "UPDATE turns SET state = 'interrupted', ended = ? WHERE input = ? AND "
                    "ended IS NULL",
                    (time.time(), inp.id),
                )
            return rows

    # -- turns and ceilings ---------------------------------------------------------------

    def begin_turn(self, agent: str, input_id: int) -> int:
        with self.tx() as db:
            cur = db.execute(
                "INSERT INTO turns (agent, input, state, started) VALUES (?, ?, 'running', ?)",
                (agent, input_id, time.time()),
            )
            turn = int(cur.lastrowid or 0)
            db.execute(
                "UPDATE inputs SET state = 'running', turn = ? WHERE id = ?", (turn, input_id)
            )
            db.execute("INSERT OR IGNORE INTO spent (agent) VALUES (?)", (agent,))
            db.execute("UPDATE spent SET turns = turns + 1 WHERE agent = ?", (agent,))
            return turn

    def end_turn(
        self, turn: int, state: str, text: str, error: str | None, cost: float | None
    ) -> None:
        with self.tx() as db:
            row = db.execute("SELECT agent, input FROM turns WHERE id = ?", (turn,)).fetchone()
            db.execute(
                "UPDATE turns SET state = ?, text = ?, error = ?, cost = ?, ended = ? WHERE id = ?",
                (state, text, error, cost, time.time(), turn),
            )
            db.execute("UPDATE inputs SET state = 'done' WHERE id = ?", (row["input"],))
            if cost:
                db.execute("UPDATE spent SET cost = cost + ? WHERE agent = ?", (cost, row["agent"]))

    def last_turn(self, agent: str) -> tuple[int, str, Input] | None:
        """``agent``'s latest turn: its id, its state and the input that woke it."""
        row = self.db.execute(
            "SELECT turns.id AS turn_id, turns.state AS turn_state, inputs.* FROM turns "
            "JOIN inputs ON inputs.id = turns.input WHERE turns.agent = ? "
            "ORDER BY turns.id DESC LIMIT 1",
            (agent,),
        ).fetchone()
        if row is None:
            return None
        return int(row["turn_id"]), str(row["turn_state"]), self._input(row)

    def spent(self, agent: str) -> tuple[int, float]:
        row = self.db.execute("SELECT turns, cost FROM spent WHERE agent = ?", (agent,)).fetchone()
        return (0, 0.0) if row is None else (int(row[0]), float(row[1]))

    # -- held notes -----------------------------------------------------------------------

    def hold(self, sender: str, recipient: str, text: str, chain: Chain, message_id: str) -> int:
        with self.tx() as db:
            cur = db.execute(
                "INSERT INTO held (sender, recipient, text, chain, message_id, at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (sender, recipient, text, _chain_json(chain), message_id, time.time()),
            )
            return int(cur.lastrowid or 0)

    def _held(self, row: sqlite3.Row) -> Held:
        chain = _chain(row["chain"])
        assert chain is not None
        return Held(
            row["id"],
            row["sender"],
            row["recipient"],
            row["text"],
            chain,
            row["message_id"],
            row["state"],
        )

    def waiting(self, sender: str | None = None) -> list[Held]:
        """Held notes still waiting for an answer (of ``sender``, or all), oldest first."""
        if sender is None:
            rows = self.db.execute("SELECT * FROM held WHERE state = 'waiting' ORDER BY id")
        else:
            rows = self.db.execute(
                "SELECT * FROM held WHERE state = 'waiting' AND sender = ? ORDER BY id",
                (sender,),
            )
        return [self._held(r) for r in rows]

    def settle_held(self, held_id: int, state: str) -> Held | None:
        """Mark a waiting held note ``sent`` or ``declined``; None if it was not waiting."""
        with self.tx() as db:
            row = db.execute(
                "SELECT * FROM held WHERE id = ? AND state = 'waiting'", (held_id,)
            ).fetchone()
            if row is None:
                return None
            db.execute("UPDATE held SET state = ? WHERE id = ?", (state, held_id))
            return self._held(row)._replace(state=state)

    # -- notices --------------------------------------------------------------------------

    def notice(self, agent: str, text: str) -> None:
        """Something ``agent`` is told at the start of its next turn (it wakes nobody)."""
        with self.tx() as db:
            db.execute(
                "INSERT INTO notices (agent, text, at) VALUES (?, ?, ?)", (agent, text, time.time())
            )

    def untold(self, agent: str) -> list[tuple[int, str]]:
        rows = self.db.execute(
            "SELECT id, text FROM notices WHERE agent = ? AND told = 0 ORDER BY id", (agent,)
        )
        return [(int(r[0]), str(r[1])) for r in rows]

    def mark_told(self, ids: Sequence[int]) -> None:
        with self.tx() as db:
            db.executemany("UPDATE notices SET told = 1 WHERE id = ?", [(i,) for i in ids])

    # -- the message log ------------------------------------------------------------------

    def log(
        self,
        kind: str,
        *,
        sender: str | None = None,
        recipient: str | None = None,
        receipt: str | None = None,
        rule: str | None = None,
        reason: str | None = None,
        chain: Chain | None = None,
        message_id: str | None = None,
        turn: int | None = None,
        text: str | None = None,
    ) -> int:
        with self.tx() as db:
            cur = db.execute(
                "INSERT INTO log (at, kind, sender, recipient, receipt, rule, reason, chain, hop,"
                " message_id, turn, text) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    time.time(),
                    kind,
                    sender,
                    recipient,
                    receipt,
                    rule,
                    reason,
                    None if chain is None else chain.chain,
                    None if chain is None else chain.hop,
                    message_id,
                    turn,
                    text,
                ),
            )
            return int(cur.lastrowid or 0)

    def entries(self, after: int = 0, limit: int = 100_000) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT * FROM log WHERE id > ? ORDER BY id LIMIT ?", (after, limit)
        ).fetchall()
        return [{k: r[k] for k in r.keys() if r[k] is not None} for r in rows]  # noqa: SIM118
