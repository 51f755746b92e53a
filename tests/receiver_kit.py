"""Real receivers for tests: ``mellan receiver run`` as a subprocess beside a real relay.

The relay is ``mellan relay`` (``relay_proc``); the caller sends through the A2A entry;
routes are proposed with the receiving agent's credential and approved by the owner over
the control API; the receiver reads a TOML file the test writes. Work is a small Python
script (``WORKER``) that appends one line per execution to a count file, so a test can
tell how often the work really ran.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from relay_proc import MELLAN, RelayProc, ok, setup_pair

CALLER = "local/codex"
RECEIVER = "private/ops"
CAPABILITY = "incident.inspect"
DEADLINE = 60.0  # a deadline for something broken, not a measured threshold

WORKER = r"""
import os, sys, time
text = sys.stdin.read()
count = os.environ.get("COUNT_FILE")
if count:
    with open(count, "a") as f:
        f.write(os.environ.get("MELLAN_TASK_ID", "?") + " " + str(os.getpid()) + " start\n")
word, _, rest = text.partition(" ")
if word == "sleep":
    time.sleep(float(rest.split()[0]))
elif word == "wait-for":  # until the test creates the file
    while not os.path.exists(rest.strip()):
        time.sleep(0.05)
elif word == "first-sleep":  # only the first attempt takes long
    if os.environ.get("MELLAN_TASK_ATTEMPT") == "1":
        time.sleep(float(rest.split()[0]))
elif word == "child":  # a grandchild that would outlive a careless kill; TERM ignored
    import signal, subprocess
    kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.environ["PID_FILE"], "a") as f:
        f.write(f"{os.getpid()} {kid.pid}\n")
    time.sleep(600)
elif word == "meet":  # wait until N tasks are running at once (or give up after 60 s)
    n, where = rest.split()
    open(os.path.join(where, os.environ["MELLAN_TASK_ID"]), "w").close()
    end = time.monotonic() + 60
    while len(os.listdir(where)) < int(n):
        if time.monotonic() > end:
            sys.exit(4)
        time.sleep(0.05)
elif word == "ask":
    print("which one?")
    sys.exit(3)
elif word == "history":  # the earlier turns as the receiver handed them over
    print(os.environ.get("MELLAN_TASK_HISTORY", ""))
elif word == "fail":
    print("it broke", file=sys.stderr)
    sys.exit(4)
elif word == "parts":  # a file and data, where the route says stdout = "parts"
    import json
    print(json.dumps([{"raw": "dGNr", "filename": "output.txt", "mediaType": "text/plain"},
                      {"data": {"key": rest.strip(), "count": 42}}]))
    sys.exit(0)
elif word == "reply":  # a direct reply, where the route says reply_exit = 5
    print(f"reply: {rest.strip()}")
    sys.exit(5)
if count:
    with open(count, "a") as f:
        f.write(os.environ.get("MELLAN_TASK_ID", "?") + " " + str(os.getpid()) + " end\n")
turn = os.environ.get("MELLAN_TASK_TURN", "1")
print(f"done: {text.strip().upper()} (turn {turn})")
"""


def wait_for(check: Callable[[], Any], what: str, deadline: float = DEADLINE) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after the deadline."""
    end = time.monotonic() + deadline
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class Net:
    """A relay with two agents, a grant, tokens, and helpers over its real HTTP API."""

    relay: RelayProc
    caller_token: str
    receiver_token: str
    home: Path

    def owner(self) -> httpx.Client:
        return self.relay.owner()

    def propose(self, **body: Any) -> str:
        body.setdefault("capability", CAPABILITY)
        body.setdefault("adapter", "command")
        with self.relay.client(self.receiver_token) as c:
            route: dict[str, Any] = ok(c.post("/api/routes", json=body), 201)
        return str(route["id"])

    def approve(self, route_id: str) -> None:
        with self.owner() as c:
            ok(c.post(f"/api/routes/{route_id}/approve"))

    def route(self, **body: Any) -> str:
        rid = self.propose(**body)
        self.approve(rid)
        return rid

    def send(self, text: str, *, task: str | None = None, context: str | None = None) -> str:
        message: dict[str, Any] = {
            "messageId": secrets.token_hex(8),
            "role": "ROLE_USER",
            "parts": [{"text": text}],
        }
        if task:
            message["taskId"] = task
        if context:
            message["contextId"] = context
        body = {
            "message": message,
            "metadata": {"capability": CAPABILITY},
            "configuration": {"returnImmediately": True},
        }
        with self.relay.client(self.caller_token) as c:
            r = c.post(
                f"/a2a/default/{RECEIVER}/message:send",
                json=body,
                headers={"A2A-Version": "1.0"},
            )
        assert r.status_code == 200, r.text
        return str(r.json()["task"]["id"])

    def task(self, task_id: str) -> dict[str, Any]:
        with self.owner() as c:
            view: dict[str, Any] = ok(c.get(f"/api/tasks/{task_id}"))
        return view

    def settled(self, task_id: str, deadline: float = DEADLINE) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            view = self.task(task_id)
            return view if view["state"] not in ("queued", "leased") else None

        found: dict[str, Any] = wait_for(done, f"task {task_id} to settle", deadline)
        return found

    def audit(self) -> list[dict[str, Any]]:
        with self.owner() as c:
            records: list[dict[str, Any]] = ok(c.get("/api/audit", params={"limit": 1000}))[
                "records"
            ]
        return records


def make_net(relay: RelayProc, home: Path) -> Net:
    caller, receiver = setup_pair(relay)
    return Net(relay, caller, receiver, home)


def result_text(view: dict[str, Any]) -> str:
    result = view.get("result") or {}
    parts = (result.get("message") or {}).get("parts") or []
    return " ".join(str(p.get("text", "")) for p in parts)


@dataclass
class ReceiverProc:
    proc: subprocess.Popen[str]
    config: Path
    lines: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None

    def finish(self, timeout: float = DEADLINE) -> int:
        """Wait for the receiver to exit on its own and for all its output."""
        code = self.proc.wait(timeout=timeout)
        if self.pump is not None:
            self.pump.join(timeout=timeout)
        return code

    def wait_line(self, needle: str, deadline: float = DEADLINE) -> str:
        def seen() -> str | None:
            for line in list(self.lines):
                if needle in line:
                    return line
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"receiver exited ({self.proc.returncode}) before {needle!r}: {self.lines}"
                )
            return None

        found: str = wait_for(seen, f"receiver line {needle!r}", deadline)
        return found

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        return int(self.proc.returncode)


def write_config(
    path: Path,
    net: Net,
    work: Path,
    *,
    concurrency: int = 2,
    lease_seconds: float = 6,
    adapters: tuple[str, ...] = ("command",),
    extra: str = "",
    wait: float = 5,
    credential: Path | None = None,
) -> Path:
    """The receiver's TOML: the token from $RECEIVER_TOKEN, or ``credential``, the file
    'mellan join' wrote (its key pair beside it: what a sealed task needs)."""
    who = f'credential = "{credential}"' if credential else 'token_env = "RECEIVER_TOKEN"'
    path.write_text(
        f"""
relay = "{net.relay.url}"
{who}
concurrency = {concurrency}
lease_seconds = {lease_seconds}
wait = {wait}
state_dir = "{path.parent / "state"}"

[allow]
adapters = {list(adapters)!r}
cwd = ["{work}"]
programs = ["{sys.executable}"]
{extra}
""".replace("'", '"'),
        encoding="utf-8",
    )
    return path


def start_receiver(
    net: Net, config: Path, *, env: dict[str, str] | None = None, token: str | None = None
) -> ReceiverProc:
    full = dict(net.relay.env)
    full["RECEIVER_TOKEN"] = token or net.receiver_token
    full.update(env or {})
    return spawn_receiver(config, full)


def spawn_receiver(config: Path, env: dict[str, str], cwd: Path | None = None) -> ReceiverProc:
    """``mellan receiver run --config CONFIG`` with exactly ``env``, its output kept."""
    proc = subprocess.Popen(
        [MELLAN, "receiver", "run", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,  # its own process group: SIGKILL takes it alone
    )
    rp = ReceiverProc(proc, config)

    def pump() -> None:
        assert proc.stdout is not None
        with contextlib.suppress(ValueError, OSError):
            for line in iter(proc.stdout.readline, ""):
                rp.lines.append(line.rstrip("\n"))

    rp.pump = threading.Thread(target=pump, daemon=True)
    rp.pump.start()
    return rp


@contextlib.contextmanager
def receiving(net: Net, config: Path, **kw: Any) -> Iterator[ReceiverProc]:
    rp = start_receiver(net, config, **kw)
    try:
        yield rp
    finally:
        rp.stop()


def worker_route(net: Net, work: Path, script: Path, **options: Any) -> str:
    """Approve a command route running ``script`` with this Python in ``work``."""
    script.write_text(WORKER, encoding="utf-8")
    return net.route(
        adapter="command",
        cwd=str(work),
        options={"argv": [sys.executable, str(script)], **options},
    )


def executions(count_file: Path, task_id: str, what: str = "start") -> int:
    if not count_file.exists():
        return 0
    return sum(
        1
        for line in count_file.read_text().splitlines()
        if line.split()[0] == task_id and line.split()[-1] == what
    )
