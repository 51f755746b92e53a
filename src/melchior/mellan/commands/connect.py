"""Propose how this agent runs a capability: a task route, pending until the owner approves.

Run it on the destination machine, beside the agent, with the agent's credential (the one
'mellan join' stored, or $MELLAN_TOKEN): only this machine knows the session ids and
directories a route names. It prints the route id and the command the workspace owner
runs to approve it; nothing runs until then.

Kinds:
  claude-code  resume the bound Claude Code session (--session, --cwd) unattended
  codex        resume the bound Codex thread (--session, --cwd) unattended
  pi           resume the bound pi session (--session: the id the adapter gave it, --cwd)
  hermes       forward to Hermes' loopback A2A server (the a2a adapter; --option card_url=…
               to change its default http://127.0.0.1:8645/.well-known/agent-card.json)
  provider     a fresh model run per task (no session)
  command      run a program: the argv after '--', the task's text on stdin

Options are adapter options (docs/runtimes.md): --option KEY=VALUE, VALUE read as JSON
when it parses (40, true, ["a","b"]) and as a string otherwise.

Examples:
  mellan connect claude-code --capability repo.review --session 4f1c… --cwd .
  mellan connect command --capability incident.inspect -- /usr/local/bin/inspect --json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from melchior.mellan.commands._common import (
    EXIT_USAGE,
    CliError,
    Target,
    add_common,
    agent_credential,
    call,
    guarded,
    print_json,
)

KINDS = {
    "claude-code": "claude-code",
    "codex": "codex",
    "pi": "pi",
    "hermes": "a2a",
    "provider": "provider",
    "command": "command",
}
"""What each kind of ``mellan connect`` proposes, by adapter."""
HERMES_CARD = "http://127.0.0.1:8645/.well-known/agent-card.json"
HERMES_TOKEN_ENV = "HERMES_A2A_TOKEN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("kind", choices=list(KINDS), metavar="KIND", help=", ".join(KINDS))
    parser.add_argument(
        "--capability", "-c", required=True, metavar="CAP", help="the capability it runs"
    )
    parser.add_argument("--session", metavar="ID", help="the coding-agent session to bind")
    parser.add_argument(
        "--cwd", metavar="DIR", help="working directory (made absolute here, must exist)"
    )
    parser.add_argument("--profile", metavar="NAME", help="the unattended profile name")
    parser.add_argument(
        "--option", "-o", action="append", default=[], metavar="KEY=VALUE",
        help="an adapter option (repeatable; VALUE is JSON when it parses)",
    )  # fmt: skip
    parser.set_defaults(argv=[])  # the words after '--' (see parse_fast)


def parse_fast(args: list[str]) -> argparse.Namespace | None:
    """``… -- PROGRAM ARGS…``: argparse cannot take a program's own flags after a
    positional, so the words after the first ``--`` are split off here, verbatim."""
    if "--" not in args:
        return None
    k = args.index("--")
    parser = argparse.ArgumentParser(
        prog="mellan connect",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    ns = parser.parse_args(args[:k])
    ns.argv = args[k + 1 :]
    return ns


def options_from(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as an options object; VALUE as JSON when it parses."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        key = key.strip()
        if not eq or not key:
            raise CliError(f"--option {pair!r}: write KEY=VALUE", EXIT_USAGE)
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def proposal(ns: argparse.Namespace) -> dict[str, Any]:
    """The route to propose, from the command line (checked here where it is cheap)."""
    adapter = KINDS[ns.kind]
    options = options_from(ns.option)
    argv = list(ns.argv or [])
    if ns.kind == "command":
        if not argv and "argv" not in options:
            raise CliError("connect command: give the program after '--', e.g. -- /bin/cat")
        if argv:
            options["argv"] = argv
    elif argv:
        raise CliError(f"connect {ns.kind}: a program after '--' is for 'command' only", EXIT_USAGE)
    if ns.kind == "hermes":
        options.setdefault("card_url", HERMES_CARD)
        options.setdefault("token_env", HERMES_TOKEN_ENV)
    body: dict[str, Any] = {"capability": ns.capability, "adapter": adapter, "options": options}
    if ns.session:
        body["session"] = ns.session
    if ns.cwd:
        cwd = Path(ns.cwd).expanduser().resolve()
        if not cwd.is_dir():
            raise CliError(f"--cwd {ns.cwd}: {cwd} is not a directory on this machine", EXIT_USAGE)
        body["cwd"] = str(cwd)
    if ns.profile:
        body["profile"] = ns.profile
    return body


def _run(ns: argparse.Namespace) -> int:
    body = proposal(ns)
    cred = agent_credential(ns)
    route = call(Target(cred.relay, cred.token), "POST", "/api/routes", body)
    if ns.json:
        print_json(route)
        return 0
    bound = f", session {route['session']}" if route.get("session") else ""
    where = f" in {route['cwd']}" if route.get("cwd") else ""
    print(
        f"route {route['id']} proposed: {route['agent']} runs {route['capability']} with the "
        f"{route['adapter']} adapter{bound}{where}"
    )
    print("it applies once the workspace owner approves it:")
    print(f"  mellan route approve {route['id']}")
    return 0


run = guarded(_run)
