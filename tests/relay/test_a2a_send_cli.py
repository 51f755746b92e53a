"""``mellan send``: a person or script acting as a calling agent, against a real relay."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from a2a_kit import CAPS, RECEIVER, WS, Receiver, Server, World, running
from melchior.mellan.commands import send


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, World, Receiver]]:
    db = tmp_path_factory.mktemp("a2a-cli") / "relay.db"
    with running(f"sqlite://{db}") as (server, world, rx):
        assert rx is not None
        yield server, world, rx


def mellan_send(
    server: Server, token: str, *args: str, monkeypatch: pytest.MonkeyPatch, tmp: Any
) -> int:
    monkeypatch.setenv("MELLAN_TOKEN", token)
    monkeypatch.setenv("MELLAN_RELAY", server.url)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp))
    parser = argparse.ArgumentParser()
    send.add_arguments(parser)
    return int(send.run(parser.parse_args(list(args))))


def test_send_default_returns_at_once_with_the_task_id(
    relay: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: Any
) -> None:
    server, world, _ = relay
    code = mellan_send(
        server, world.tokens["caller"], RECEIVER, "echo hi",
        monkeypatch=monkeypatch, tmp=tmp_path,
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("task ")
    assert "(context " in out


def test_send_wait_prints_the_answer(
    relay: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: Any
) -> None:
    server, world, _ = relay
    code = mellan_send(
        server, world.tokens["caller"], RECEIVER, "echo there", "--wait",
        "--capability", CAPS[0], monkeypatch=monkeypatch, tmp=tmp_path,
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "completed: echo: there" in out
    assert "artifact echo: echo: there" in out


def test_send_stream_json_prints_events(
    relay: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: Any
) -> None:
    server, world, _ = relay
    code = mellan_send(
        server, world.tokens["caller"], RECEIVER, "steps 2", "--stream", "--json",
        monkeypatch=monkeypatch, tmp=tmp_path,
    )  # fmt: skip
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    assert "task" in events[0]
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"


def test_send_failure_and_refusal_exit_nonzero(
    relay: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: Any
) -> None:
    server, world, _ = relay
    code = mellan_send(
        server, world.tokens["caller"], RECEIVER, "fail", "--wait",
        monkeypatch=monkeypatch, tmp=tmp_path,
    )  # fmt: skip
    assert code == 1
    assert "failed: it broke" in capsys.readouterr().out
    code = mellan_send(
        server, world.tokens["other"], RECEIVER, "echo no", monkeypatch=monkeypatch, tmp=tmp_path
    )
    err = capsys.readouterr().err
    assert code == 1
    assert "no such capability is available to you" in err


def test_send_uses_the_stored_agent_credential(
    relay: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: Any
) -> None:
    server, world, _ = relay
    stored = tmp_path / "mellan" / "agents" / "local" / "codex.json"
    stored.parent.mkdir(parents=True)
    stored.write_text(
        json.dumps({"relay": server.url, "workspace": WS, "token": world.tokens["caller"]})
    )
    monkeypatch.delenv("MELLAN_TOKEN", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    parser = argparse.ArgumentParser()
    send.add_arguments(parser)
    code = send.run(parser.parse_args([RECEIVER, "echo stored", "--wait", "--as", "local/codex"]))
    assert code == 0
    assert "echo: stored" in capsys.readouterr().out
    assert "MELLAN_TOKEN" not in os.environ
