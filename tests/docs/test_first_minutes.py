"""A newcomer's first minutes: the README's "Next" block runs as written on a fresh
machine (the demo straight through, a relay of one's own, a login, a one-time dashboard
link); the relay's start-up says where the dashboard is and how to run ``mellan`` from
this shell; a port in use is one line naming the port and the way to change it."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from doc_kit import run_bash, script_bin, sh_blocks
from receiver_kit import wait_for
from relay_proc import ok, relay_env, setup_pair, start_relay

MELLAN = str(Path(sys.executable).parent / "mellan")


def test_the_readme_next_block_runs_as_written(tmp_path: Path) -> None:
    bindir = script_bin("mellan")
    blocks = sh_blocks("../README.md", "Next")
    assert blocks[0].strip() == "make demo"  # the same demo; the block below runs it too
    home = {f"XDG_{k}_HOME": str(tmp_path / k.lower()) for k in ("DATA", "CONFIG", "STATE")}
    script = f'cd "{tmp_path}"\n' + blocks[1].replace('export PATH="$PWD/.venv/bin:$PATH"', ":")
    ran = run_bash(script, bindir=bindir, drop=("MELLAN_",), env=home, timeout=300)
    assert ran.returncode == 0, (ran.stdout[-3000:], ran.stderr[-3000:])
    assert "completed: inspected (incident.inspect for local/codex)" in ran.stdout
    assert re.search(r"^http://127\.0\.0\.1:\d+/ui/signin/link\?code=\S+$", ran.stdout, re.M)


def test_the_relay_says_where_its_dashboard_is_and_how_to_reach_mellan(tmp_path: Path) -> None:
    env = relay_env(tmp_path)
    env["PATH"] = "/usr/bin:/bin"  # as on a fresh machine: .venv/bin is not on PATH
    relay = start_relay(f"sqlite://{tmp_path / 'r.db'}", tmp_path, extra_env=env)
    try:
        wait_for(lambda: any("ready" in line for line in relay.lines), "the relay's ready line")
        text = "\n".join(relay.lines)
        assert f"dashboard: {relay.url}/ui/" in text
        # the hints name this mellan by its path, since `mellan` is not on this PATH
        assert f"log in with: {MELLAN} login --relay {relay.url}" in text
        assert f"{MELLAN} dashboard link" in text
    finally:
        relay.stop()


def test_a_port_in_use_is_one_line_naming_it_and_the_flag(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [MELLAN, "relay", "--port", str(port), "--database", f"sqlite://{tmp_path / 'r.db'}",
             "--owner-token-file", str(tmp_path / "t")],
            capture_output=True, text=True, env={**os.environ, **relay_env(tmp_path)}, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1
    said = [line for line in done.stderr.splitlines() if line]
    assert said == [
        f"mellan relay: cannot listen on 127.0.0.1:{port}: Address already in use (is another "
        "relay running? choose another port with --port or $MELLAN_PORT)"
    ], done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_an_unknown_command_is_named_as_one_at_every_level(tmp_path: Path) -> None:
    for argv, said in (
        (["agnet", "list"], "mellan: error: unknown command 'agnet'; did you mean 'agent'?"),
        (["agnet"], "mellan: error: unknown command 'agnet'; did you mean 'agent'?"),
        (["agent", "lst"], "mellan agent: error: unknown command 'lst'; did you mean 'list'?"),
        (["route", "aprove", "x"], "mellan route: error: unknown command 'aprove'; did you mean"),
    ):
        done = subprocess.run([MELLAN, *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        assert done.stdout == ""
        assert said in done.stderr, done.stderr


def test_a_refused_send_says_why_in_the_words_of_the_api_that_refused(tmp_path: Path) -> None:
    relay = start_relay(f"sqlite://{tmp_path / 'r.db'}", tmp_path)
    try:
        env = {**relay_env(tmp_path), "MELLAN_TOKEN": "mln_bogus", "MELLAN_RELAY": relay.url}
        done = subprocess.run([MELLAN, "send", "private/ops", "hi"], capture_output=True,
                              text=True, env=env, timeout=60)  # fmt: skip
        assert done.returncode == 1
        assert "None" not in done.stderr
        assert "(bad-credential, HTTP 401)" in done.stderr, done.stderr
    finally:
        relay.stop()


def test_send_wait_says_what_it_waits_for_and_that_nobody_took_it(tmp_path: Path) -> None:
    """No receiver runs: --wait says the task is queued, then plainly that no receiver has
    taken it; a cancel ends the wait with the task's end on stdout."""
    relay = start_relay(f"sqlite://{tmp_path / 'r.db'}", tmp_path)
    try:
        caller, _ = setup_pair(relay)
        env = {**relay_env(tmp_path), "MELLAN_TOKEN": caller, "MELLAN_RELAY": relay.url}
        proc = subprocess.Popen(
            [MELLAN, "send", "private/ops", "anyone there?", "--capability",
             "incident.inspect", "--wait"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        try:
            assert proc.stderr is not None
            said = [proc.stderr.readline(), proc.stderr.readline()]
            assert said[0] == "mellan send: queued for private/ops\n", said
            assert said[1].startswith("mellan send: still queued after 5 s: no receiver has "
                                      "taken it yet"), said  # fmt: skip
            with relay.owner() as c:
                (task,) = ok(c.get("/api/tasks"))["tasks"]
                ok(c.post(f"/api/tasks/{task['id']}/cancel"))
            out, rest = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 1
        assert out.startswith(f"task {task['id']} canceled"), (out, rest)
        assert "mellan send: canceled" in rest
    finally:
        relay.stop()


def _stops(argv: list[str], env: dict[str, str], ready: str, sig: int, **popen: object) -> str:
    """Start a long-running command, wait for ``ready`` on its output, send ``sig``:
    it must exit 0 on its own (a deadline for something broken)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, **popen)  # type: ignore[call-overload]  # fmt: skip
    seen = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if ready in line:
                break
        assert any(ready in line for line in seen), seen
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (sig, seen, rest)
    return "".join(seen) + rest


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_long_running_commands_stop_on_sigterm_and_sigint(tmp_path: Path, sig: int) -> None:
    """The relay, a receiver, a session (melchior serve) and the MCP bridge each end
    cleanly, exit status 0, on either signal."""
    env = {**relay_env(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    (tmp_path / "run").mkdir(mode=0o700)
    db = f"sqlite://{tmp_path / 'r.db'}"
    said = _stops([MELLAN, "relay", "--port", "0", "--database", db, "--owner-token-file",
                   str(tmp_path / "owner.token")], env, "ready", sig)  # fmt: skip
    assert "stopped" in said
    relay = start_relay(db, tmp_path)
    try:
        _, receiver_token = setup_pair(relay)
        config = tmp_path / "receiver.toml"
        config.write_text(
            f'relay = "{relay.url}"\ntoken_env = "RT"\nstate_dir = "{tmp_path / "state"}"\n'
            f'[allow]\nadapters = ["command"]\ncwd = ["{tmp_path}"]\n'
        )
        said = _stops([MELLAN, "receiver", "run", "--config", str(config)],
                      {**env, "RT": receiver_token}, "receiver for private/ops", sig)  # fmt: skip
        assert "stopping: signal" in said
    finally:
        relay.stop()
    melchior = str(Path(sys.executable).parent / "melchior")
    feed = subprocess.Popen(["sleep", "60"], stdout=subprocess.PIPE)
    try:  # serve reads its harness's pipe; it stays open while the signal comes
        _stops([melchior, "serve"], env, '"event":"listening"', sig, stdin=feed.stdout)
    finally:
        feed.kill()
        feed.wait()
    bridge = subprocess.Popen(
        [melchior, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:  # the MCP handshake first: the signal then reaches a bridge at work
        assert bridge.stdin is not None
        assert bridge.stdout is not None
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}}}  # fmt: skip
        bridge.stdin.write(json.dumps(hello) + "\n")
        bridge.stdin.flush()
        assert '"result"' in bridge.stdout.readline()
        bridge.send_signal(sig)
        _, err = bridge.communicate(timeout=30)
    finally:
        if bridge.poll() is None:
            bridge.kill()
            bridge.wait()
    assert "Traceback" not in err
    assert bridge.returncode == 128 + sig, bridge.returncode  # stopped by it, as a shell says
