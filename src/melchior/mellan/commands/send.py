"""Send a task to another agent through the relay's A2A entry, as a calling agent.

It speaks A2A 1.0 HTTP+JSON to ``{relay}/a2a/{workspace}/{agent}`` (docs/a2a.md) through
:class:`melchior.mellan.client.caller.RelayClient`; this module only parses flags and
prints.

The credential is an *agent* credential: the one ``mellan join`` stored for ``--as AGENT``,
else ``$MELLAN_TOKEN``, else the only one stored (the rule every mellan command follows).
By default the task is accepted and its id printed at once (the receiver may be offline;
the work stays queued). ``--wait`` blocks until the task completes, fails, is cancelled
or asks for input, saying on stderr what it waits for as the task moves (queued, taken
by a receiver, its progress) and when no receiver has taken it after a few seconds;
``--stream`` prints progress as it happens. ``--seal`` (or ``$MELLAN_SEAL=1``: the mellan
CLI has no configuration file; its defaults are environment variables, as
``$MELLAN_RELAY`` is) encrypts the message to the receiver's pinned key and opens the
sealed result (docs/security.md). Exit status: 0 when
accepted/completed/input-required, 1 when refused, failed or cancelled, 3 when the relay
is unreachable.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

from melchior import __version__
from melchior.mellan.client.caller import RelayClient
from melchior.mellan.client.errors import RelayError
from melchior.mellan.client.views import (
    DONE_BAD,
    SUBMITTED,
    TaskEvent,
    TaskView,
    describe,
    short,
    text_of,
)
from melchior.mellan.commands._common import (
    EXIT_REFUSED,
    EXIT_USAGE,
    CliError,
    add_ca_file,
    agent_credential,
    cli_refusal,
    guarded,
)
from melchior.mellan.transport import ClientTls, TransportError

SEAL_ENV = "MELLAN_SEAL"
"""Set to 1 to seal every ``mellan send`` (the CLI's defaults are environment variables)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"mellan {__version__}")
    parser.add_argument("receiver", metavar="RECEIVER", help="receiving agent id, e.g. private/ops")
    parser.add_argument("text", metavar="TEXT", help="the message ('-': read stdin)")
    parser.add_argument("--capability", metavar="CAP", help="capability to invoke (metadata)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--wait", action="store_true", help="block until the task settles")
    mode.add_argument("--stream", action="store_true", help="print progress as it happens")
    parser.add_argument("--json", action="store_true", help="print the A2A JSON (one per line)")
    parser.add_argument(
        "--seal",
        action="store_true",
        default=os.environ.get(SEAL_ENV, "") in ("1", "true", "yes"),
        help=f"encrypt to the receiver's pinned key; the result comes back sealed "
        f"(default: ${SEAL_ENV}=1)",
    )
    parser.add_argument("--as", dest="as_agent", metavar="AGENT", help="stored agent to act as")
    parser.add_argument("--workspace", help="workspace of the receiver (default: the caller's)")
    parser.add_argument("--task", metavar="ID", help="answer a task that asked for input")
    parser.add_argument("--context", metavar="ID", help="continue a conversation (contextId)")
    parser.add_argument("--relay", metavar="URL", help="relay URL (default: stored or env)")
    add_ca_file(parser)


def credential(ns: argparse.Namespace) -> tuple[str, str, str | None, ClientTls | None]:
    """(relay URL, token, workspace if known, TLS) of the calling agent, by the one rule
    every command follows (:func:`melchior.mellan.credentials.agent_credential`)."""
    found = agent_credential(ns)
    return found.relay, found.token, ns.workspace or found.workspace, found.tls


def _exit_for(state: str) -> int:
    return EXIT_REFUSED if state in DONE_BAD else 0


def _report(task: TaskView) -> None:
    print(describe({"task": task.raw}))
    for art in task.artifacts:
        print(f"artifact {art.get('name') or art.get('artifactId')}: {text_of(art)}")


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
            name = short(state)
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


@guarded
def run(ns: argparse.Namespace) -> int:
    text = sys.stdin.read() if ns.text == "-" else ns.text
    relay, token, workspace, tls = credential(ns)
    try:
        client = RelayClient(relay, token, workspace=workspace, tls=tls)
    except TransportError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    watch = Watch(ns.receiver)
    try:
        with client:
            return _send(ns, client, text, watch)
    except RelayError as exc:
        raise cli_refusal(exc) from None
    finally:
        watch.stop()


def _send(ns: argparse.Namespace, client: RelayClient, text: str, watch: Watch) -> int:
    ask = {"capability": ns.capability, "task": ns.task, "context": ns.context}
    if ns.stream:
        state = ""
        try:
            for event in client.stream(ns.receiver, text, seal=ns.seal, **ask):
                print(event.text if ns.json else event.describe(), flush=True)
                state = event.state or state
                if state == SUBMITTED:
                    watch.saw(state)  # only the queued hint: the events are on stdout
                else:
                    watch.stop()
        except RelayError as exc:
            if not exc.text:
                raise
            print(exc.text if ns.json else describe(exc_body(exc)), flush=True)
            raise CliError(f"stream failed: {exc.sentence}") from None
        return _exit_for(state)
    task = client.send(ns.receiver, text, seal=ns.seal, **ask)
    raw = task.text
    if ns.wait:
        watch.saw(task.state, task.answer)

        def saw(event: TaskEvent) -> None:
            watch.saw(event.state, event.said)

        try:
            task = client.wait(ns.receiver, task, on_event=saw)
        except RelayError as exc:
            if exc.text:
                raise CliError(f"following the task failed: {exc.sentence}") from None
            raise
        watch.saw(task.state)
        raw = '{"task": ' + task.text + "}"
    if ns.json:
        print(raw)
    elif ns.wait:
        _report(task)
    else:
        sealed = f", sealed to {task.seal.receiver_key.fingerprint}" if task.seal else ""
        print(f"task {task.id} {short(task.state)} (context {task.context_id}{sealed})")
    return _exit_for(task.state)


def exc_body(exc: RelayError) -> dict[str, Any]:
    """The decoded error a stream sent, for its one line."""
    from melchior.mellan.rawjson import decode

    body = decode(exc.text)
    return body if isinstance(body, dict) else {}
