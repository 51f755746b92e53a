"""The ``mellan`` command: run a relay, and manage agents, grants and tasks over its HTTP API.

Only the invoked command's module is imported, so ``mellan --help`` and client commands
start fast and never load the server stack they do not use.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from melchior import __version__

COMMANDS: dict[str, tuple[str, str]] = {
    "relay": ("melchior.mellan.commands.relay", "run a relay replica (SQLite or PostgreSQL)"),
    "login": ("melchior.mellan.commands.login", "store a relay URL and credential"),
    "whoami": ("melchior.mellan.commands.whoami", "show the identity of the credential"),
    "agent": ("melchior.mellan.commands.agent", "add, list and show agents"),
    "enroll": ("melchior.mellan.commands.enroll", "mint a one-time enrollment code"),
    "join": ("melchior.mellan.commands.join", "exchange a code for an agent credential"),
    "grant": ("melchior.mellan.commands.grant", "add, list and revoke directional grants"),
    "audit": ("melchior.mellan.commands.audit", "read (or --follow) the audit log"),
    "task": ("melchior.mellan.commands.task", "list, show and cancel tasks"),
    "send": ("melchior.mellan.commands.send", "send an A2A task as a calling agent"),
    "credential": ("melchior.mellan.commands.credential", "revoke a credential"),
}


def _available() -> dict[str, tuple[str, str]]:
    """Commands whose module is installed (parts of mellan land independently)."""
    return {
        name: entry
        for name, entry in COMMANDS.items()
        if importlib.util.find_spec(entry[0]) is not None
    }


def _top_parser() -> argparse.ArgumentParser:
    lines = "\n".join(f"  {name:<11} {text}" for name, (_, text) in _available().items())
    parser = argparse.ArgumentParser(
        prog="mellan",
        description="Identity, directional capability grants and durable delivery for agents.",
        epilog=f"commands:\n{lines}\n\nRun 'mellan COMMAND --help' for a command's options. "
        "Client commands read the relay from --relay/$MELLAN_RELAY and the credential from "
        "$MELLAN_TOKEN, else from 'mellan login'.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mellan {__version__}")
    parser.add_argument("command", nargs="?", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in _available():
        name = args[0]
        module = importlib.import_module(COMMANDS[name][0])
        parser = argparse.ArgumentParser(
            prog=f"mellan {name}",
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(parser)
        ns = parser.parse_args(args[1:])
        code: int = module.run(ns)
        return code
    parser = _top_parser()
    ns = parser.parse_args(args)
    if ns.command is not None:
        parser.error(f"unknown command {ns.command!r}; see 'mellan --help'")
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
