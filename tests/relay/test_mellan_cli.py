"""The real ``mellan`` executable against a real relay: the owner's walk-through, an agent
joining, refusals that say why, --json, --help and --version on every command."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from melchior.mellan.relay.store.base import Store
from relay_proc import (
    MELLAN,
    Cli,
    RelayProc,
    db_url_fixture,
    enqueue,
    owner_fixture,
    relay_fixture,
    store_fixture,
)

__all__ = ["db_url_fixture", "owner_fixture", "relay_fixture", "store_fixture"]


def test_owner_walk_through(relay: RelayProc, owner: Cli, store: Store, tmp_path: Path) -> None:
    out = owner(
        "agent", "add", "private/ops", "--capability", "incident.inspect=Read the incident log",
        "--capability", "deploy", "--description", "the ops box",
    )  # fmt: skip
    assert "private/ops" in out
    assert "incident.inspect" in out
    owner("agent", "add", "local/codex")
    agents = owner.json("agent", "list")["agents"]
    assert sorted(a["id"] for a in agents) == ["local/codex", "private/ops"]
    table = owner("agent", "list")
    assert "AGENT" in table
    assert "incident.inspect, deploy" in table
    assert owner.json("agent", "get", "private/ops")["description"] == "the ops box"

    grant = owner.json("grant", "add", "local/codex", "private/ops", "incident.inspect")
    assert grant["capabilities"] == ["incident.inspect"]
    assert "local/codex" in owner("grant", "list")
    err = owner("grant", "add", "local/codex", "private/ops", "reboot", code=1)
    assert "declares no capability 'reboot'" in err
    assert "deploy" in err
    err = owner("grant", "add", "ghost", "private/ops", "deploy", code=1)
    assert "no calling agent 'ghost'" in err

    # enroll on the owner's machine, join on the agent's machine
    enrolled = owner.json("enroll", "private/ops")
    agent = Cli(tmp_path / "agent-machine")
    out = agent("join", enrolled["code"], "--relay", relay.url)
    assert "private/ops" in out
    cred = tmp_path / "agent-machine" / "config" / "mellan" / "agents" / "private" / "ops.json"
    assert stat.S_IMODE(cred.stat().st_mode) == 0o600
    stored = json.loads(cred.read_text())
    assert stored["agent"] == "private/ops"
    assert stored["relay"] == relay.url
    assert stored["token"] not in out
    again = agent("join", enrolled["code"], "--relay", relay.url, code=1)
    assert "already used" in again
    mine = agent.json("agent", "list", "--as", "private/ops")["agents"]
    assert [a["id"] for a in mine] == ["private/ops"]
    assert "mellan join" in agent("agent", "list", "--as", "local/codex", code=2)

    # the agent's credential sees only itself
    as_agent = Cli(tmp_path / "agent-machine", MELLAN_RELAY=relay.url, MELLAN_TOKEN=stored["token"])
    assert [a["id"] for a in as_agent.json("agent", "list")["agents"]] == ["private/ops"]
    assert "owner credential" in as_agent("audit", code=1)

    # tasks
    task_id = enqueue(store)
    listed = owner.json("task", "list")["tasks"]
    assert [t["id"] for t in listed] == [task_id]
    assert "queued" in owner("task", "list")
    assert owner.json("task", "get", task_id)["payload"] == {"text": "hi"}
    assert "cancelled" in owner("task", "cancel", task_id)
    assert owner.json("task", "get", task_id)["state"] == "cancelled"
    assert "already cancelled" in owner("task", "cancel", task_id)
    assert "no task" in owner("task", "get", "nope", code=1)

    # grant revoke, audit
    owner("grant", "revoke", grant["id"])
    assert "no active grant" in owner("grant", "revoke", grant["id"], code=1)
    records = owner.json("audit")["records"]
    actions = [r["action"] for r in records]
    for expected in ("agent.add", "grant.add", "enrollment.add", "enrollment.redeem",
                     "task.cancel", "grant.revoke"):  # fmt: skip
        assert expected in actions
    assert any(not r["allowed"] for r in records)
    audit_table = owner("audit")
    assert "REFUSE" in audit_table
    assert "DECISION" in audit_table.splitlines()[0]

    # revoke the agent's credential: refused from then on, with the reason
    owner("credential", "revoke", stored["credential_id"])
    assert "revoked" in as_agent("agent", "list", code=1)


def test_audit_follow_prints_new_records(relay: RelayProc, owner: Cli) -> None:
    proc = subprocess.Popen(
        [MELLAN, "audit", "--follow", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=owner.env,
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())  # the bootstrap record
        assert first["action"] == "credential.add"
        owner("agent", "add", "late/comer")
        record = json.loads(proc.stdout.readline())
        assert record["action"] == "agent.add"
        assert record["subject"] == "late/comer"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_refusals_say_why_and_exit_codes(relay: RelayProc, tmp_path: Path) -> None:
    nobody = Cli(tmp_path / "fresh", MELLAN_RELAY=relay.url)
    err = nobody("agent", "list", code=2)
    assert "MELLAN_TOKEN" in err
    assert "mellan login" in err
    wrong = Cli(tmp_path / "fresh", MELLAN_RELAY=relay.url, MELLAN_TOKEN="mln_wrong")
    assert "unknown, revoked or expired" in wrong("agent", "list", code=1)
    gone = Cli(tmp_path / "fresh", MELLAN_RELAY="http://127.0.0.1:9", MELLAN_TOKEN="mln_x")
    assert "cannot reach the relay" in gone("agent", "list", code=3)
    err = nobody("login", "--relay", relay.url, "--token-file", str(tmp_path / "missing"), code=2)
    assert "cannot read" in err
    assert "unknown, revoked or expired" in nobody(
        "login", "--relay", relay.url, stdin="mln_bad\n", code=1
    )
    assert "unknown, expired or already used" in nobody(
        "join", "mlj_nope", "--relay", relay.url, code=1
    )


COMMANDS = [
    ["relay"], ["login"], ["whoami"], ["agent"], ["agent", "add"], ["agent", "list"],
    ["agent", "get"], ["enroll"], ["join"], ["grant"], ["grant", "add"], ["grant", "list"],
    ["grant", "revoke"], ["audit"], ["task"], ["task", "list"], ["task", "get"],
    ["task", "cancel"], ["credential"], ["credential", "revoke"],
]  # fmt: skip


@pytest.mark.parametrize("words", COMMANDS, ids=lambda w: "-".join(w))
def test_help_and_version_everywhere(words: list[str], tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    assert "usage: mellan" in cli(*words, "--help")
    assert cli(*words, "--version").strip().startswith("mellan ")
    if words[-1] not in ("agent", "grant", "task", "credential"):
        assert "--json" in cli(*words, "--help")


def test_top_level_help_lists_commands(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    out = cli("--help")
    for name in ("relay", "agent", "enroll", "join", "grant", "audit", "task", "login"):
        assert f"  {name}" in out
    assert "unknown command" in cli("frobnicate", code=2)


def test_relay_status_as_json_lines(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    proc = subprocess.Popen(
        [MELLAN, "relay", "--json", "--port", "0", "--database", f"sqlite://{tmp_path / 'r.db'}"],
        stdout=subprocess.PIPE,
        text=True,
        env=cli.env,
    )
    try:
        assert proc.stdout is not None
        events = []
        while not events or events[-1]["event"] != "ready":
            line = proc.stdout.readline()
            assert line, events
            events.append(json.loads(line))
        by = {e["event"]: e for e in events}
        token_file = Path(by["owner-credential"]["token_file"])
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert token_file.read_text().strip() not in json.dumps(events)
        assert by["listening"]["url"].startswith("http://127.0.0.1:")
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_relay_says_what_its_migrations_did(tmp_path: Path) -> None:
    """First start creates the schema, a database of the first released schema is
    upgraded in place, and a current one is left alone; each start says which."""
    from melchior.mellan.relay.store import migrations
    from melchior.mellan.relay.store.sqlite import SQLiteStore

    db = tmp_path / "r.db"
    old = SQLiteStore(db)
    old.migrate(target=1)
    old.close()
    cli = Cli(tmp_path)

    def schema_line(db: Path) -> str:
        proc = subprocess.Popen(
            [MELLAN, "relay", "--json", "--port", "0", "--database", f"sqlite://{db}"],
            stdout=subprocess.PIPE,
            text=True,
            env=cli.env,
        )
        try:
            assert proc.stdout is not None
            events: list[dict[str, Any]] = []
            while not events or events[-1]["event"] != "ready":
                line = proc.stdout.readline()
                assert line, events
                events.append(json.loads(line))
            return next(e["message"] for e in events if e["message"].startswith("schema "))
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0

    latest = migrations.LATEST_SQLITE
    assert schema_line(db) == f"schema upgraded from version 1 to {latest}"
    assert schema_line(db) == f"schema up to date (version {latest})"
    assert schema_line(tmp_path / "new.db") == f"schema created (version {latest})"
