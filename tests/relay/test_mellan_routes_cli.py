"""``mellan connect``, ``mellan route`` and ``mellan agent wake`` as a user runs them: the
real executable against a real ``mellan relay`` on both backends, the agent on its own
machine (its own XDG dirs) and the owner on theirs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from relay_proc import MELLAN, Cli, RelayProc, db_url_fixture, relay_env, relay_fixture

__all__ = ["db_url_fixture", "relay_fixture"]


class AgentCli(Cli):
    """``mellan`` on the agent's machine, run from a working directory of its own."""

    def __init__(self, home: Path, cwd: Path) -> None:
        super().__init__(home)
        self.cwd = cwd

    def __call__(self, *args: str, stdin: str | None = None, code: int = 0) -> str:
        proc = subprocess.run(
            [MELLAN, *args], input=stdin, capture_output=True, text=True, env=self.env,
            timeout=120, cwd=self.cwd,
        )  # fmt: skip
        assert proc.returncode == code, (args, proc.returncode, proc.stdout, proc.stderr)
        return proc.stdout if code == 0 else proc.stderr


@pytest.fixture
def machines(relay: RelayProc, tmp_path: Path) -> tuple[Cli, AgentCli, Path]:
    owner = Cli(tmp_path / "owner-machine")
    owner("login", "--relay", relay.url, "--token-file", str(relay.token_file))
    owner(
        "agent", "add", "private/ops", "--capability", "repo.review", "--capability",
        "incident.inspect",
    )  # fmt: skip
    code = owner.json("enroll", "private/ops")["code"]
    repo = tmp_path / "agent-machine" / "src" / "repo"
    repo.mkdir(parents=True)
    agent = AgentCli(tmp_path / "agent-machine", repo.parent)
    agent("join", code, "--relay", relay.url)
    return owner, agent, repo


def test_connect_approve_supersede_revoke(machines: tuple[Cli, AgentCli, Path]) -> None:
    owner, agent, repo = machines
    out = agent(
        "connect", "claude-code", "--capability", "repo.review", "--session", "4f1c-9",
        "--cwd", "repo", "--profile", "queue", "--option", "max_turns=40",
        "--option", "permission_mode=acceptEdits", "--option", 'allowed_tools=["Edit"]',
    )  # fmt: skip
    first = out.split()[1]
    assert first.startswith("rt_")
    assert f"mellan route approve {first}" in out  # what the owner runs
    listed: list[dict[str, Any]] = owner.json("route", "list")["routes"]
    (route,) = listed
    assert route["cwd"] == str(repo.resolve())  # made absolute on the agent's machine
    assert route["options"] == {
        "max_turns": 40,
        "permission_mode": "acceptEdits",
        "allowed_tools": ["Edit"],
    }
    assert (route["adapter"], route["session"], route["profile"], route["state"]) == (
        "claude-code", "4f1c-9", "queue", "pending",
    )  # fmt: skip
    table = owner("route", "list")
    assert "PENDING" not in table  # states are values, headers are upper case
    assert "pending" in table
    assert first in table
    assert f"route {first} approved" in owner("route", "approve", first)
    assert "already approved" in owner("route", "approve", first)

    cmd = json.loads(
        agent("connect", "command", "--json", "--capability", "repo.review", "--", "/bin/cat", "-n")
    )
    assert cmd["options"] == {"argv": ["/bin/cat", "-n"]}
    assert cmd["adapter"] == "command"
    out = owner("route", "approve", cmd["id"])
    assert f"route {first} revoked (superseded)" in out
    approved = owner.json("route", "list", "--state", "approved")["routes"]
    assert [r["id"] for r in approved] == [cmd["id"]]
    assert "revoked" in owner("route", "revoke", cmd["id"])
    assert "already revoked" in owner("route", "revoke", cmd["id"])
    assert owner.json("route", "list", "--state", "approved")["routes"] == []

    hermes = agent.json("connect", "hermes", "--capability", "incident.inspect")
    assert hermes["adapter"] == "a2a"
    assert hermes["options"]["card_url"] == "http://127.0.0.1:8645/.well-known/agent-card.json"
    # the agent sees its own routes
    mine = agent.json("route", "list", "--as", "private/ops")["routes"]
    assert {r["id"] for r in mine} == {first, cmd["id"], hermes["id"]}
    # the audit log has every step
    actions = [
        r["action"] for r in owner.json("audit")["records"] if r["action"].startswith("route.")
    ]
    assert actions.count("route.propose") == 3
    assert actions.count("route.approve") == 2
    assert actions.count("route.revoke") == 2


def test_connect_refusals_say_why(
    machines: tuple[Cli, AgentCli, Path], relay: RelayProc, tmp_path: Path
) -> None:
    owner, agent, _ = machines
    err = agent("connect", "provider", "--capability", "repo.review", "--session", "x", code=1)
    assert "field 'session'" in err
    err = agent("connect", "codex", "--capability", "nothing.here", code=1)
    assert "declares no capability 'nothing.here'" in err
    assert "not a directory" in agent(
        "connect", "codex", "--capability", "repo.review", "--cwd", "missing", code=2
    )
    assert "'--'" in agent("connect", "command", "--capability", "repo.review", code=1)
    assert "KEY=VALUE" in agent(
        "connect", "codex", "--capability", "repo.review", "--option", "novalue", code=2
    )
    assert "invalid choice" in agent("connect", "shell", "--capability", "repo.review", code=2)
    # the owner's credential proposes nothing, agents approve nothing
    assert "no agent credential" in owner("connect", "codex", "-c", "repo.review", code=2)
    as_owner = Cli(tmp_path / "owner-env", MELLAN_RELAY=relay.url, MELLAN_TOKEN=relay.owner_token)
    assert "agent-only" in as_owner("connect", "codex", "-c", "repo.review", code=1)
    rid = agent.json("connect", "codex", "--capability", "repo.review")["id"]
    assert "owner" in agent("route", "approve", rid, "--as", "private/ops", code=1)
    assert "bad-request" in owner("route", "list", "--state", "sideways", code=1)


def test_agent_list_shows_receivers_and_wake(
    machines: tuple[Cli, AgentCli, Path], relay: RelayProc
) -> None:
    owner, _, _ = machines
    assert "never seen" in owner("agent", "list")
    assert "RECEIVER" in owner("agent", "list")
    got = owner.json("agent", "get", "private/ops")
    assert got["receiver"]["online"] is False
    hook = "http://127.0.0.1:9/wake"
    assert "private" in owner("agent", "wake", "private/ops", hook, code=1)
    owner("push", "private", "on")
    out = owner("agent", "wake", "private/ops", hook)
    assert f"wake-ups go to {hook}" in out
    assert "shown once" in out
    secret = out.rsplit(": ", 1)[1].strip()
    assert secret.startswith("mws_")
    assert "secret" not in owner("agent", "wake", "private/ops")
    assert secret in owner("agent", "wake", "private/ops", "--show-secret")
    rotated = owner.json("agent", "wake", "private/ops", "--rotate")
    assert rotated["secret"] not in (None, secret)
    assert "no wake-ups" in owner("agent", "wake", "private/ops", "--off")
    env = relay_env(Path(relay.env["XDG_CONFIG_HOME"]).parent)
    assert env  # the relay's own environment is not the owner's


NEW = [["connect"], ["route"], ["route", "list"], ["route", "approve"], ["route", "revoke"],
       ["agent", "wake"]]  # fmt: skip


@pytest.mark.parametrize("words", NEW, ids=lambda w: "-".join(w))
def test_help_and_version(words: list[str], tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    assert "usage: mellan" in cli(*words, "--help")
    assert cli(*words, "--version").strip().startswith("mellan ")
    if words != ["route"]:
        assert "--json" in cli(*words, "--help")
