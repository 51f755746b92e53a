"""Answer one of the coding agent's hooks from its melchior bridge.

  melchior hook UserPromptSubmit|PostToolUse|PreToolUse|Stop [--agent=claude-code|codex]
  melchior hook notify --agent=codex JSON          (Codex's notify program)

Run by the agent's hook system with the hook's JSON on stdin. Finds the 'melchior mcp'
bridge this agent started and prints what the agent should read: waiting messages
(fenced as peer data) as additional context, a PreToolUse ask/deny for a call not known
to be harmless after peer text or a send over the turn's quota, or a Stop answer that
keeps the turn going for a waiting message. Prints nothing and exits 0 when there is nothing to say
or no bridge: a hook must never stop the agent's own work. See docs/integrations.md."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

AGENTS = ("claude-code", "codex")


def parse_fast(args: list[str]) -> SimpleNamespace | None:
    """``EVENT [--agent=A] [--server=S] [JSON]`` without argparse: this runs on every
    tool call of the agent, so its start-up is the agent's latency."""
    ns = SimpleNamespace(event=None, agent="claude-code", server="melchior", payload=None)
    for arg in args:
        if arg.startswith("--agent=") and arg[8:] in AGENTS:
            ns.agent = arg[8:]
        elif arg.startswith("--server=") and arg[9:]:
            ns.server = arg[9:]
        elif arg.startswith("-"):
            return None
        elif ns.event is None:
            ns.event = arg
        elif ns.payload is None:
            ns.payload = arg
        else:
            return None
    return ns if ns.event is not None else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("event", metavar="EVENT", help="the hook event (its name in the agent)")
    parser.add_argument(
        "payload", nargs="?", metavar="JSON", help="the event's JSON (Codex notify passes it here)"
    )
    parser.add_argument("--agent", choices=AGENTS, default="claude-code", help="whose hook this is")
    parser.add_argument(
        "--server", default="melchior", metavar="NAME", help="the bridge's MCP server name"
    )


def run(ns: argparse.Namespace | SimpleNamespace) -> int:
    import os

    from melchior.integrations.hooks import run as answer

    return answer(
        ns.event,
        agent=ns.agent,
        server=ns.server,
        payload=ns.payload,
        env=os.environ,
        stdin=sys.stdin.buffer,
        stdout=sys.stdout,
        stderr=sys.stderr,
    )
