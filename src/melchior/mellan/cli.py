"""The ``mellan`` command: run a relay, and manage agents, grants and tasks over its HTTP API.

Only the invoked command's module is imported, so ``mellan --help`` and client commands
start fast and never load the server stack they do not use.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from melchior import __version__
from melchior.dispatch import Program, run

COMMANDS: dict[str, tuple[str, str]] = {
    "relay": ("melchior.mellan.commands.relay", "run a relay replica (SQLite or PostgreSQL)"),
    "login": ("melchior.mellan.commands.login", "store a relay URL and credential"),
    "whoami": ("melchior.mellan.commands.whoami", "show the identity of the credential"),
    "agent": ("melchior.mellan.commands.agent", "add, list and show agents"),
    "enroll": ("melchior.mellan.commands.enroll", "mint a one-time enrollment code"),
    "join": ("melchior.mellan.commands.join", "exchange a code for an agent credential"),
    "key": ("melchior.mellan.commands.key", "sealed tasks: show, pin and trust agents' keys"),
    "grant": ("melchior.mellan.commands.grant", "add, list and revoke directional grants"),
    "audit": ("melchior.mellan.commands.audit", "read (or --follow) the audit log"),
    "task": ("melchior.mellan.commands.task", "list, show and cancel tasks"),
    "send": ("melchior.mellan.commands.send", "send an A2A task as a calling agent"),
    "credential": ("melchior.mellan.commands.credential", "revoke a credential"),
    "push": ("melchior.mellan.commands.push", "push notifications: signing secret, private hosts"),
    "connect": ("melchior.mellan.commands.connect", "propose how this agent runs a capability"),
    "route": ("melchior.mellan.commands.route", "list, approve and revoke task routes"),
    "receiver": ("melchior.mellan.commands.receiver", "run, watch or install a receiver"),
    "dashboard": ("melchior.mellan.commands.dashboard", "a one-time sign-in link to the dashboard"),
    "demo": ("melchior.mellan.commands.demo", "watch the whole system work, on a throwaway relay"),
}


PROGRAM = Program(
    prog="mellan",
    version=__version__,
    description="Identity, directional capability grants and durable delivery for agents.",
    commands=COMMANDS,
    footer="Client commands read the relay from --relay/$MELLAN_RELAY and the credential from "
    "$MELLAN_TOKEN, else from 'mellan login'.",
)


def main(argv: Sequence[str] | None = None) -> int:
    return run(PROGRAM, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
