"""``mellan demo``: the whole system working, on a throwaway relay, in under half a minute.

What a newcomer should see before reading anything: a relay starts; two agents get
identities and one directional grant; the receiving agent's machine proposes how it runs
the capability and the owner approves it; a receiver claims the task, runs a tiny
program and reports; the caller gets the answer. Then two agents on a plane: one writes
to the other without a door, the note is held, the operator says yes, the answer comes
back. Finally the dashboard's address with a one-time sign-in link, and everything keeps
running until Ctrl-C.

It runs the same commands a person would (each printed before it runs, ``$ mellan …``),
as subprocesses of the installed ``mellan`` and ``melchior``, in an environment of its own:
every XDG directory and the runtime directory point into one temporary directory, no
``MELLAN_*`` variable is inherited, so nothing is read from or left in the user's real
state. Children run in sessions of their own (Ctrl-C reaches the demo, which stops them
in order: the receiver, then the relay) and die with the demo if it is killed outright.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

START_DEADLINE = 60.0
"""Seconds a server may take to say it is ready, at most (a deadline for something
broken, on a loaded machine)."""
STOP_GRACE = 20.0

INSPECT = """#!/bin/sh
echo "inspected ($MELLAN_CAPABILITY for $MELLAN_CALLER): $(cat)"
"""
PLANNER = """import json, os, subprocess, sys
prompt = sys.stdin.read()
if os.environ.get("MELCHIOR_TURN_SORT") == "answer":  # woken by ledger's answer
    lines = prompt.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("<<peer-message "))
    print("ledger says:", " ".join(lines[start + 1:-1]))
else:  # woken by the operator: ask ledger
    sent = subprocess.run(["melchior", "tool", "--verb=send_to", "--to=ledger",
                           "--message=How much did we spend in August?"],
                          capture_output=True, check=True)
    receipt = json.loads(sent.stdout)["result"][0]
    print(f"I asked ledger (receipt {receipt['receipt']}, door {receipt['door']}).")
"""
LEDGER = """import sys
sys.stdin.read()
print("We spent 1234 EUR in August.")
"""


class DemoError(Exception):
    """A step failed; the message says which and what the program said."""


@dataclass
class Server:
    """A long-running child (the relay, the receiver) and everything it printed."""

    name: str
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def pump(self) -> None:
        assert self.proc.stdout is not None
        with contextlib.suppress(ValueError, OSError):
            for line in iter(self.proc.stdout.readline, ""):
                self.lines.append(line.rstrip("\n"))

    def wait_for(self, needle: str) -> str:
        end = time.monotonic() + START_DEADLINE
        while time.monotonic() < end:
            for line in list(self.lines):
                if needle in line:
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = "\n".join(self.lines[-15:])
        raise DemoError(f"the {self.name} did not get ready; it said:\n{tail}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def find_bin() -> Path:
    """Where this ``mellan`` and its ``melchior`` are installed (a checkout's ``.venv/bin``)."""
    candidates = []
    if sys.argv and os.path.basename(sys.argv[0]) == "mellan":
        candidates.append(Path(os.path.abspath(sys.argv[0])).parent)
    candidates.append(Path(sys.executable).parent)
    for where in candidates:
        if (where / "mellan").exists() and (where / "melchior").exists():
            return where
    raise DemoError("cannot find the melchior and mellan commands next to this one")


class Demo:
    def __init__(self, out: TextIO, *, port: int = 0, keep: bool = False) -> None:
        self.out = out
        self.port = port
        self.keep = keep
        self.bin = find_bin()
        self.root = Path(tempfile.mkdtemp(prefix="mellan-demo-"))
        self.servers: list[Server] = []
        self.done = False
        self.env = self._environment()
        self.started = time.monotonic()
        # children get SIGKILL when the demo dies (Linux): a killed demo leaves no relay
        from melchior.runtimes.process import _parent_death_signal

        self.die_with_us = _parent_death_signal()

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MELLAN_", "MAGI_"))}
        for kind in ("DATA", "CONFIG", "STATE", "CACHE"):
            env[f"XDG_{kind}_HOME"] = str(self.root / kind.lower())
        run = self.root / "run"
        run.mkdir(mode=0o700)
        env["XDG_RUNTIME_DIR"] = str(run)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        return env

    # -- saying what happens -----------------------------------------------------------------

    def say(self, line: str = "") -> None:
        print(line, file=self.out, flush=True)

    def step(self, text: str) -> None:
        took = time.monotonic() - self.started
        self.say(f"\n==> {text}   [{took:.1f} s]")

    def run(self, *argv: str, stdin: str | None = None, show: bool = True) -> str:
        """Run one command as a person would (printed first), in the demo's environment."""
        shown = " ".join(shlex.quote(a) for a in argv)
        if show:
            self.say(f"  $ {shown}")
        done = subprocess.run(
            [str(self.bin / argv[0]), *argv[1:]],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.root,
            timeout=120,
        )
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()
            raise DemoError(f"{shown} failed (exit {done.returncode}): {said}")
        return done.stdout

    def show(self, text: str, indent: str = "    ") -> None:
        for line in text.rstrip("\n").splitlines():
            self.say(f"{indent}{line}")

    def serve(self, name: str, *argv: str) -> Server:
        self.say(f"  $ {' '.join(shlex.quote(a) for a in argv)} &")
        proc = subprocess.Popen(
            [str(self.bin / argv[0]), *argv[1:]],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=self.env,
            cwd=self.root,
            start_new_session=True,  # Ctrl-C reaches the demo only; it stops them in order
            preexec_fn=self.die_with_us,
        )
        server = Server(name, proc)
        threading.Thread(target=server.pump, daemon=True).start()
        self.servers.append(server)
        return server

    # -- the story ---------------------------------------------------------------------------

    def main(self) -> str:
        """Every step once; returns the dashboard sign-in link."""
        self.say(f"mellan demo: a throwaway relay and agents in {self.root}")
        self.say("(nothing is read from or written to your own mellan state; Ctrl-C ends it)")
        self.step("1. A relay: identities, grants and durable tasks (SQLite here)")
        db = f"sqlite://{self.root / 'relay.db'}"
        relay = self.serve("relay", "mellan", "relay", "--port", str(self.port), "--database", db)
        line = relay.wait_for("listening on ")
        url = line.split("listening on ", 1)[1].split()[0]
        relay.wait_for("ready")
        self.show(f"listening on {url}")
        token_file = self.root / "data" / "mellan" / "owner.token"
        self.run("mellan", "login", "--relay", url, "--token-file", str(token_file))

        self.step("2. Two agents and one directional grant (the workspace owner)")
        self.run("mellan", "agent", "add", "private/ops",
                 "--capability", "incident.inspect=Read the incident log")  # fmt: skip
        self.run("mellan", "agent", "add", "local/codex")
        self.show(self.run("mellan", "grant", "add", "local/codex", "private/ops",
                           "incident.inspect"))  # fmt: skip

        self.step("3. Each agent joins with a one-time code (normally on its own machine)")
        for agent in ("private/ops", "local/codex"):
            code = json.loads(self.run("mellan", "enroll", agent, "--json", show=False))["code"]
            self.say(f'  $ mellan join "$(mellan enroll {agent} | head -n 1)" --relay {url}')
            self.run("mellan", "join", code, "--relay", url, show=False)

        self.step("4. How private/ops runs incident.inspect: proposed on its machine, approved")
        work = self.root / "work"
        work.mkdir()
        inspect = work / "inspect.sh"
        inspect.write_text(INSPECT, encoding="utf-8")
        inspect.chmod(0o755)
        proposed = self.run("mellan", "connect", "command", "--as", "private/ops",
                            "--capability", "incident.inspect", "--cwd", str(work),
                            "--", str(inspect))  # fmt: skip
        self.show(proposed.splitlines()[0])
        words = proposed.split()
        if len(words) < 3 or words[0] != "route" or words[2] != "proposed:":
            raise DemoError(f"mellan connect said something else: {proposed.strip()}")
        self.show(self.run("mellan", "route", "approve", words[1]))

        self.step("5. The receiver beside private/ops; its own allow-list says what may run")
        config = self.root / "receiver.toml"
        config.write_text(
            f'agent = "private/ops"\nstate_dir = "{self.root / "receiver"}"\n\n[allow]\n'
            f'adapters = ["command"]\ncwd = ["{work}"]\nprograms = ["{inspect}"]\n',
            encoding="utf-8",
        )
        receiver = self.serve("receiver", "mellan", "receiver", "run", "--config", str(config))
        receiver.wait_for("receiver for private/ops")

        self.step("6. local/codex asks private/ops, and waits for the answer")
        began = time.monotonic()
        answer = self.run(
            "mellan", "send", "private/ops", "what broke last night?", "--as", "local/codex",
            "--capability", "incident.inspect", "--wait",
        )  # fmt: skip
        self.show(answer)
        self.show(f"(answered in {time.monotonic() - began:.1f} s; the receiver's log:)")
        for line in receiver.lines:
            if "task " in line:
                self.show(line, "      ")

        self.step("7. Two agents on a plane: planner asks ledger, with no door between them")
        plane = self.root / "plane"
        plane.mkdir()
        for name, body in (("planner.py", PLANNER), ("ledger.py", LEDGER)):
            (plane / name).write_text(body, encoding="utf-8")
        (plane / "PLANE.toml").write_text(
            "".join(
                f'[[agents]]\nid = "{who}"\ndescription = "{what}"\nruntime = "command"\n'
                f'options = {{ argv = ["{sys.executable}", "{plane / (who + ".py")}"] }}\n\n'
                for who, what in (("planner", "plans the work"), ("ledger", "keeps the books"))
            ),
            encoding="utf-8",
        )
        typed = ("planner> how much did we spend in August?", "planner? y")
        quoted = " ".join(shlex.quote(line) for line in typed)
        self.say(f"  $ printf '%s\\n' {quoted} | melchior plane run PLANE.toml --headless")
        self.show("(the operator's lines: a question at planner's prompt, then y to what the "
                  "plane asks)")  # fmt: skip
        lines = "".join(line + "\n" for line in typed)
        said = self.run("melchior", "plane", "run", str(plane / "PLANE.toml"), "--headless",
                        stdin=lines, show=False)  # fmt: skip
        for line in said.splitlines():
            if " | state: " not in line and " | progress: " not in line:
                self.show(line)

        self.step("8. The owner's dashboard: the agents, the grant, the route, the task's timeline")
        link = self.run("mellan", "dashboard", "link").strip()
        self.show(f"{url}/ui/")
        self.show(f"sign in once with: {link}")
        self.done = True
        took = time.monotonic() - self.started
        self.say(f"\nAll of it in {took:.1f} s. Next: docs/receiver.md (real agents behind a "
                 "receiver), docs/plane.md (a team in the console), docs/integrations.md "
                 "(Claude Code, Codex).")  # fmt: skip
        return link

    def stop(self) -> None:
        for server in reversed(self.servers):  # the receiver before the relay it reports to
            server.stop()
        if self.keep:
            self.say(f"kept {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _interrupted_by_signals() -> Iterator[None]:
    """SIGTERM ends the demo the way Ctrl-C does (KeyboardInterrupt, then the cleanup)."""
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_demo(out: TextIO, *, port: int = 0, keep: bool = False, stay: bool = True) -> int:
    """The demo: 0 when every step worked and, with ``stay``, Ctrl-C (or SIGTERM) ended it
    afterwards; 130 when interrupted before the end; 1 when a step failed."""
    with _interrupted_by_signals():
        try:
            demo = Demo(out, port=port, keep=keep)
        except DemoError as exc:
            print(f"mellan demo: {exc}", file=sys.stderr)
            return 1
        code = 0
        try:
            demo.main()
            if stay:
                demo.say("\nThe relay and the receiver keep running; Ctrl-C stops them.")
                while True:
                    signal.pause()
        except KeyboardInterrupt:
            code = 0 if demo.done else 130
        except (DemoError, subprocess.TimeoutExpired) as exc:
            print(f"mellan demo: {exc}", file=sys.stderr)
            code = 1
        finally:
            with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: still clean up
                demo.stop()
    demo.say("stopped; nothing of the demo is left behind" if not keep else "stopped")
    return code
