"""Send a task to another agent through the relay's A2A entry, as a calling agent.

It speaks A2A 1.0 HTTP+JSON to ``{relay}/a2a/{workspace}/{agent}`` (docs/a2a.md).

The credential is an *agent* credential: the one ``mellan join`` stored for ``--as AGENT``,
else ``$MELLAN_TOKEN``, else the only one stored (the rule every mellan command follows).
By default the task is accepted and its id printed at once (the receiver may be offline;
the work stays queued). ``--wait`` blocks until the task completes, fails, is cancelled
or asks for input, saying on stderr what it waits for as the task moves (queued, taken
by a receiver, its progress) and when no receiver has taken it after a few seconds;
``--stream`` prints progress as it happens. Exit status: 0 when
accepted/completed/input-required, 1 when refused, failed or cancelled, 3 when the relay
is unreachable.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx

from melchior import __version__
from melchior.mellan import transport
from melchior.mellan.commands._common import (
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
    add_ca_file,
    agent_credential,
    guarded,
)
from melchior.mellan.transport import ClientTls

DONE_BAD = ("TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"mellan {__version__}")
    parser.add_argument("receiver", metavar="RECEIVER", help="receiving agent id, e.g. private/ops")
    parser.add_argument("text", metavar="TEXT", help="the message ('-': read stdin)")
    parser.add_argument("--capability", metavar="CAP", help="capability to invoke (metadata)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--wait", action="store_true", help="block until the task settles")
    mode.add_argument("--stream", action="store_true", help="print progress as it happens")
    parser.add_argument("--json", action="store_true", help="print the A2A JSON (one per line)")
    parser.add_argument("--as", dest="as_agent", metavar="AGENT", help="stored agent to act as")
    parser.add_argument("--workspace", help="workspace of the receiver (default: the caller's)")
    parser.add_argument("--task", metavar="ID", help="answer a task that asked for input")
    parser.add_argument("--context", metavar="ID", help="continue a conversation (contextId)")
    parser.add_argument("--relay", metavar="URL", help="relay URL (default: stored or env)")
    add_ca_file(parser)


def credential(ns: argparse.Namespace) -> tuple[str, str, str | None, ClientTls | None]:
    """(relay URL, token, workspace if known, TLS) of the calling agent, by the one rule
    every command follows (``_common.agent_credential``)."""
    found = agent_credential(ns)
    return found.relay, found.token, ns.workspace or found.workspace, found.tls


class Wire:
    def __init__(self, relay: str, token: str, tls: ClientTls | None = None) -> None:
        self.relay = relay.rstrip("/")
        try:
            self.http = transport.client(
                self.relay,
                token,
                tls,
                headers={"A2A-Version": "1.0", "Content-Type": "application/json"},
                timeout=httpx.Timeout(30.0, read=None),
            )
        except transport.TransportError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None

    def _fail(self, response: httpx.Response) -> CliError:
        """The refusal as the API that made it says it: the A2A entry answers with a
        ``google.rpc.Status`` (``message``, ``status``), the control API with its own
        (``reason``, ``code``)."""
        try:
            error = json.loads(response.content).get("error", {})
            said = error.get("message") or error.get("reason")
            kind = error.get("status") or error.get("code")
            if not isinstance(said, str) or not said:
                raise ValueError("no reason in the answer")
            reason = f"{said} ({kind}, HTTP {response.status_code})"
        except (ValueError, AttributeError):
            reason = f"HTTP {response.status_code}: {response.text[:200]}"
        code = EXIT_UNREACHABLE if response.status_code == 503 else EXIT_REFUSED
        return CliError(f"refused: {reason}", code)

    def _unreachable(self, exc: Exception) -> CliError:
        untrusted = transport.untrusted(exc)
        if untrusted:
            return CliError(f"{self.relay}: {untrusted}", EXIT_UNREACHABLE)
        return CliError(f"cannot reach the relay at {self.relay}: {exc}", EXIT_UNREACHABLE)

    def workspace(self) -> str:
        try:
            r = self.http.get(self.relay + "/api/whoami")
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        if not r.is_success:
            raise self._fail(r)
        return str(json.loads(r.content)["workspace"])

    def send(self, base: str, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """The response (for display) and its exact text (for ``--json``)."""
        try:
            r = self.http.post(base + "/message:send", content=json.dumps(body).encode())
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        if not r.is_success:
            raise self._fail(r)
        data: dict[str, Any] = json.loads(r.content)
        return data, r.text

    def get(self, base: str, task_id: str) -> str:
        """``GetTask``: the task's exact JSON text."""
        try:
            r = self.http.get(f"{base}/tasks/{quote(task_id, safe='')}")
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        if not r.is_success:
            raise self._fail(r)
        return r.text

    def stream(
        self, base: str, body: dict[str, Any] | None, task_id: str | None = None
    ) -> Iterator[tuple[dict[str, Any], str]]:
        """Each event (for display) with its exact JSON text (for ``--json``): of a new
        task (``SendStreamingMessage`` with ``body``) or of ``task_id`` (``SubscribeToTask``)."""
        if task_id is not None:
            path, payload = f"{base}/tasks/{quote(task_id, safe='')}:subscribe", b"{}"
        else:
            path, payload = base + "/message:stream", json.dumps(body).encode()
        try:
            with self.http.stream("POST", path, content=payload) as r:
                if not r.is_success:
                    r.read()
                    raise self._fail(r)
                data: list[str] = []
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        data.append(line[5:].lstrip())
                    elif not line and data:
                        text = "\n".join(data)
                        yield json.loads(text), text
                        data = []
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc


def _text(message: Any) -> str:
    if not isinstance(message, dict):
        return ""
    out = []
    for part in message.get("parts", []):
        if "text" in part:
            out.append(str(part["text"]))
        elif "data" in part:
            out.append(json.dumps(part["data"], ensure_ascii=False))
        elif "url" in part:
            out.append(str(part["url"]))
        elif "raw" in part:
            out.append(f"<{part.get('filename') or 'file'}: {len(part['raw'])} base64 chars>")
    return " ".join(out)


def _short(state: str) -> str:
    return state.removeprefix("TASK_STATE_").lower().replace("_", "-")


def describe(event: dict[str, Any]) -> str:
    if "task" in event:
        t = event["task"]
        line = f"task {t['id']} {_short(t['status']['state'])}"
        said = _text(t["status"].get("message"))
        return line + (f": {said}" if said else "")
    if "statusUpdate" in event:
        st = event["statusUpdate"]["status"]
        said = _text(st.get("message"))
        return _short(st["state"]) + (f": {said}" if said else "")
    if "artifactUpdate" in event:
        art = event["artifactUpdate"]["artifact"]
        name = art.get("name") or art.get("artifactId")
        return f"artifact {name}: {_text(art)}"
    return json.dumps(event, ensure_ascii=False)


def _report(task: dict[str, Any]) -> None:
    print(describe({"task": task}))
    for art in task.get("artifacts", []):
        print(f"artifact {art.get('name') or art.get('artifactId')}: {_text(art)}")


def _exit_for(state: str) -> int:
    return EXIT_REFUSED if state in DONE_BAD else 0


ENDS = ("TASK_STATE_COMPLETED", "TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED",
        *DONE_BAD)  # fmt: skip
QUEUED_HINT = 5.0
"""Seconds a waiting task may sit queued before the waiter says nobody has taken it."""


class Watch:
    """What ``--wait`` and ``--stream`` say on stderr while a task moves: each state once,
    and — after :data:`QUEUED_HINT` seconds queued, then every minute — that no receiver
    has taken it yet (the relay keeps it; a receiver for the agent must be running)."""

    def __init__(self, receiver: str, err: Any = None) -> None:
        self.receiver = receiver
        self.err = err or sys.stderr
        self.state = ""
        self.began = time.monotonic()
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def say(self, line: str) -> None:
        with self._lock:
            print(f"mellan send: {line}", file=self.err, flush=True)

    def saw(self, state: str, said: str = "") -> None:
        if state and state != self.state:
            self.state = state
            shown = {"submitted": f"queued for {self.receiver}", "working": "a receiver took it"}
            name = _short(state)
            self.say(shown.get(name, name) + (f": {said}" if said else ""))
            if state == "TASK_STATE_SUBMITTED":
                self._arm(QUEUED_HINT)
            elif self._timer is not None:
                self._timer.cancel()
        elif said and state == "TASK_STATE_WORKING":
            self.say(f"progress: {said}")

    def _arm(self, after: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(after, self._still_queued)
        self._timer.daemon = True
        self._timer.start()

    def _still_queued(self) -> None:
        if self.state != "TASK_STATE_SUBMITTED":
            return
        waited = time.monotonic() - self.began
        self.say(
            f"still queued after {waited:.0f} s: no receiver has taken it yet; the relay keeps "
            f"it until one for {self.receiver} claims it (on that machine: mellan receiver "
            "status; mellan receiver run starts one)"
        )
        self._arm(60.0)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def _event_state(event: dict[str, Any]) -> tuple[str, str]:
    if "task" in event:
        status = event["task"]["status"]
    elif "statusUpdate" in event:
        status = event["statusUpdate"]["status"]
    else:
        return "", ""
    return str(status.get("state", "")), _text(status.get("message"))


def _wait(wire: Wire, base: str, task: dict[str, Any], watch: Watch) -> tuple[dict[str, Any], str]:
    """Follow an accepted task to its end (``SubscribeToTask``, saying what happens on
    stderr), then read it whole (``GetTask``): the final task and its exact JSON."""
    watch.saw(task["status"]["state"], _text(task["status"].get("message")))
    if task["status"]["state"] not in ENDS:
        try:
            for event, _ in wire.stream(base, None, task_id=task["id"]):
                if "error" in event:
                    raise CliError(f"following the task failed: {event['error'].get('message')}")
                state, said = _event_state(event)
                watch.saw(state, said)
                if state in ENDS:
                    break
        except CliError:  # it ended before the subscription began (nothing left to follow)?
            raw = wire.get(base, task["id"])
            if json.loads(raw)["status"]["state"] not in ENDS:
                raise
    raw = wire.get(base, task["id"])
    final: dict[str, Any] = json.loads(raw)
    watch.saw(final["status"]["state"])
    return final, raw


@guarded
def run(ns: argparse.Namespace) -> int:
    text = sys.stdin.read() if ns.text == "-" else ns.text
    relay, token, workspace, tls = credential(ns)
    wire = Wire(relay, token, tls)
    workspace = workspace or wire.workspace()
    base = f"{wire.relay}/a2a/{quote(workspace, safe='')}/{quote(ns.receiver, safe='/')}"
    message: dict[str, Any] = {
        "messageId": secrets.token_hex(16),
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    }
    if ns.task:
        message["taskId"] = ns.task
    if ns.context:
        message["contextId"] = ns.context
    body: dict[str, Any] = {"message": message}
    if ns.capability:
        body["metadata"] = {"capability": ns.capability}
    watch = Watch(ns.receiver)
    try:
        if ns.stream:
            state = ""
            for event, raw in wire.stream(base, body):
                print(raw if ns.json else describe(event), flush=True)
                if "error" in event:
                    raise CliError(f"stream failed: {event['error'].get('message')}")
                state = _event_state(event)[0] or state
                if state == "TASK_STATE_SUBMITTED":
                    watch.saw(state)  # only the queued hint: the events are on stdout
                else:
                    watch.stop()
            return _exit_for(state)
        body["configuration"] = {"returnImmediately": True}
        answer, raw = wire.send(base, body)
        task = answer["task"]
        if ns.wait:
            task, text = _wait(wire, base, task, watch)
            raw = '{"task": ' + text + "}"
    finally:
        watch.stop()
    if ns.json:
        print(raw)
    elif ns.wait:
        _report(task)
    else:
        print(f"task {task['id']} {_short(task['status']['state'])} (context {task['contextId']})")
    return _exit_for(task["status"]["state"])
