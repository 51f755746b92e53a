"""Real relay processes for tests: ``mellan relay`` in a subprocess on a free loopback port.

Everything goes over real HTTP; the only in-process access is the store API, used to
enqueue tasks (the A2A entry is another component) and to make leases expire now
(``expire_leases``) instead of waiting out a TTL.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import ssl
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.base import NewTask, Store
from melchior.mellan.transport import trusting_nobody

MELLAN = str(Path(sys.executable).parent / "mellan")
START_TIMEOUT = 60.0  # a deadline for a broken start, not a measured threshold


@dataclass
class RelayProc:
    url: str
    owner_token: str
    token_file: Path
    proc: subprocess.Popen[str]
    env: dict[str, str]
    lines: list[str] = field(default_factory=list)
    ca: Path | None = None
    """The CA file an HTTPS relay's certificate verifies against (tests set it)."""

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        # a plain-http relay's client trusts nobody, as the CLI's does (no roots loaded)
        verify = ssl.create_default_context(cafile=str(self.ca)) if self.ca else trusting_nobody()
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0, verify=verify)

    def owner(self) -> httpx.Client:
        return self.client(self.owner_token)

    def stop(self) -> int:
        """SIGTERM and wait; a relay still running after 20 s is asked for its threads'
        stacks (SIGUSR1) and its event loop's tasks (SIGUSR2), killed, and its last lines
        printed (shown with the failure)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGUSR1)
                self.proc.send_signal(signal.SIGUSR2)
                time.sleep(1)
                self.proc.kill()
                self.proc.wait()
                time.sleep(0.2)  # let the drain thread take the dump
                print("relay did not stop; its last lines:", *self.lines[-200:], sep="\n")
        rest = self.proc.stdout.read() if self.proc.stdout else ""
        self.lines += rest.splitlines()
        return int(self.proc.returncode)


def relay_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["XDG_DATA_HOME"] = str(home / "data")
    env["XDG_CONFIG_HOME"] = str(home / "config")
    env.pop("MELLAN_RELAY", None)
    env.pop("MELLAN_TOKEN", None)
    return env


def start_relay(
    db_url: str,
    home: Path,
    *args: str,
    token_file: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> RelayProc:
    """Start ``mellan relay`` and wait for its 'listening on' line."""
    env = relay_env(home) | (extra_env or {})
    token_file = token_file or home / "owner.token"
    proc = subprocess.Popen(
        [MELLAN, "relay", "--database", db_url, "--port", "0",
         "--owner-token-file", str(token_file), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, ""):
            lines.put(line.rstrip("\n"))
            if "listening on" in line:
                break
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    url = None
    while url is None:
        try:
            line = lines.get(timeout=START_TIMEOUT)
        except queue.Empty:
            proc.kill()
            pytest.fail(f"relay did not start: {seen}")
        if line is None:
            proc.wait()
            pytest.fail(f"relay exited during start ({proc.returncode}): {seen}")
        seen.append(line)
        if "listening on " in line:
            url = line.split("listening on ", 1)[1].split()[0]
    token = token_file.read_text().strip() if token_file.exists() else ""
    relay = RelayProc(url, token, token_file, proc, env, seen)
    # keep draining output so the relay never blocks on a full pipe
    threading.Thread(target=_drain, args=(relay,), daemon=True).start()
    return relay


def _drain(relay: RelayProc) -> None:
    out = relay.proc.stdout
    if out is None:
        return
    with contextlib.suppress(ValueError, OSError):
        for line in iter(out.readline, ""):
            relay.lines.append(line.rstrip("\n"))


@pytest.fixture(
    name="db_url",
    params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)],
)
def db_url_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL per backend: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'relay.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture(name="relay")
def relay_fixture(db_url: str, tmp_path: Path) -> Iterator[RelayProc]:
    r = start_relay(db_url, tmp_path)
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture(name="store")
def store_fixture(db_url: str, relay: RelayProc) -> Iterator[Store]:
    """The relay's database, opened in-process (after the relay migrated it)."""
    s = open_store(db_url)
    try:
        yield s
    finally:
        s.close()


# -- the mellan CLI as a user runs it ---------------------------------------------------------


class Cli:
    """Runs ``mellan`` as a user on another machine would: its own XDG dirs, env only."""

    def __init__(self, home: Path, **env: str) -> None:
        self.env = relay_env(home)
        self.env.update(env)
        self.home = home

    def __call__(self, *args: str, stdin: str | None = None, code: int = 0) -> str:
        proc = subprocess.run(
            [MELLAN, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
        )
        assert proc.returncode == code, (args, proc.returncode, proc.stdout, proc.stderr)
        return proc.stdout if code == 0 else proc.stderr

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "--json"))


@pytest.fixture(name="owner")
def owner_fixture(relay: RelayProc, tmp_path: Path) -> Cli:
    """The owner's machine, logged in to ``relay`` with the token file (never echoed)."""
    cli = Cli(tmp_path / "owner-machine")
    out = cli("login", "--relay", relay.url, "--token-file", str(relay.token_file))
    assert "logged in" in out
    assert relay.owner_token not in out
    login = tmp_path / "owner-machine" / "config" / "mellan" / "login.json"
    assert stat.S_IMODE(login.stat().st_mode) == 0o600
    return cli


def wait_line(relay: RelayProc, text: str, after: int = 0) -> str:
    """The first line of the relay's output from ``after`` on that holds ``text``."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        for line in relay.lines[after:]:
            if text in line:
                return line
        time.sleep(0.05)
    pytest.fail(f"no {text!r} in {relay.lines}")


# -- helpers over the real HTTP API --------------------------------------------------------------


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def add_agent(relay: RelayProc, agent_id: str, *caps: str) -> None:
    with relay.owner() as c:
        ok(c.post("/api/agents", json={"id": agent_id, "capabilities": list(caps)}), 201)


def enroll_and_join(relay: RelayProc, agent_id: str) -> str:
    """An agent credential for ``agent_id`` through the real enrollment flow."""
    with relay.owner() as c:
        code = ok(c.post("/api/enrollments", json={"agent": agent_id}), 201)["code"]
    with relay.client() as c:
        token: str = ok(c.post("/api/join", json={"code": code}), 201)["token"]
    return token


def setup_pair(relay: RelayProc) -> tuple[str, str]:
    """local/codex may invoke incident.inspect on private/ops; tokens (caller, receiver)."""
    add_agent(relay, "private/ops", "incident.inspect", "deploy")
    add_agent(relay, "local/codex")
    with relay.owner() as c:
        ok(
            c.post(
                "/api/grants",
                json={
                    "caller": "local/codex",
                    "receiver": "private/ops",
                    "capabilities": ["incident.inspect"],
                },
            ),
            201,
        )
    return enroll_and_join(relay, "local/codex"), enroll_and_join(relay, "private/ops")


def enqueue(store: Store, payload: str = '{"text":"hi"}', **kw: Any) -> str:
    """Accept a task at the door the way the A2A entry does: through the store API."""
    fields: dict[str, Any] = {
        "workspace": "default",
        "caller": "local/codex",
        "receiver": "private/ops",
        "capability": "incident.inspect",
        "payload": payload,
    }
    fields.update(kw)
    task, created = store.enqueue(NewTask(**fields))
    assert created
    return task.id
