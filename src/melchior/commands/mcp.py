"""Be this coding agent's melchior session, as an MCP server on stdio.

Started by the agent (Claude Code, Codex, any MCP client) as one of its MCP servers; the
session lives exactly as long as the agent keeps it open. Without MAGI_MELCHIOR_* in the
environment it is a new root session; with the environment 'melchior fork' printed it is
that child. Its tools are the vocabulary ('melchior tool --schema'), 'inbox', and, with a
mellan agent credential (--as, $MELLAN_TOKEN, or the one stored), the relay_* tools.

The per-turn quota and the taint window come from [melchior.mcp] in the melchior config
file; the flags below override it. Needs the MCP SDK: pip install 'melchior[mcp]'.
See docs/integrations.md."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a count is not negative")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sends-per-turn", type=_count, metavar="N", help="messages one turn may send (default 3)"
    )
    parser.add_argument(
        "--taint-calls",
        type=_count,
        metavar="K",
        help="calls one taint window asks about before it stops the turn (default 10; 0: off)",
    )
    parser.add_argument(
        "--risky",
        action="append",
        default=[],
        metavar="PATTERN",
        help="a call always asked about after peer text, Tool or Tool(glob), e.g. "
        "'Bash(terraform *)'",
    )
    parser.add_argument(
        "--harmless",
        action="append",
        default=[],
        metavar="PATTERN",
        help="a call that may run unasked after peer text, e.g. 'Bash(make test)'",
    )
    parser.add_argument(
        "--channel",
        action="store_true",
        help="push messages as Claude Code channel notifications (the session must enable them)",
    )
    parser.add_argument("--as", dest="as_agent", metavar="AGENT", help="mellan agent to call as")
    parser.add_argument("--relay", metavar="URL", help="mellan relay URL (default: stored or env)")
    parser.add_argument(
        "--no-relay", action="store_true", help="no relay tools even if a credential is found"
    )


def run(ns: argparse.Namespace) -> int:
    try:
        import mcp  # noqa: F401  (the optional extra; said plainly when it is missing)
    except ImportError:
        print(
            "melchior mcp: the MCP SDK is not installed; install it with "
            "pip install 'melchior[mcp]' (or pip install 'mcp>=2.3,<3')",
            file=sys.stderr,
        )
        return 2
    import asyncio

    from melchior.integrations import settings as bridge_settings
    from melchior.integrations.bridge import Bridge
    from melchior.integrations.relay_caller import RelayCaller, find_credential
    from melchior.mellan.credentials import CredentialError
    from melchior.mellan.transport import TransportError
    from melchior.names import NamingError
    from melchior.session.config import ConfigError, read_talk
    from melchior.session.identity import IdentityError, for_serve

    try:
        me, reg = for_serve(os.environ, Path.cwd())
        talk = read_talk(me.project)
        settings = bridge_settings.read(
            me.project,
            os.environ,
            sends_per_turn=ns.sends_per_turn,
            taint_calls=ns.taint_calls,
            patterns=ns.risky,
            harmless=ns.harmless,
            channel=ns.channel,
        )
        cred = None if ns.no_relay else find_credential(ns.as_agent, ns.relay)
    except (NamingError, IdentityError, ConfigError, CredentialError) as exc:
        print(f"melchior mcp: {exc}", file=sys.stderr)
        return 2
    try:
        relay = RelayCaller(cred) if cred is not None else None
    except TransportError as exc:  # e.g. a token over plain HTTP to another machine
        print(f"melchior mcp: {exc}", file=sys.stderr)
        return 2
    bridge = Bridge(me, reg, talk, settings, os.environ)

    async def main() -> int:
        await bridge.start()  # first: the agent's first hook may already be looking for us
        from melchior.integrations.mcp_server import run as serve  # the SDK: ~1 s to import

        return await serve(bridge, relay)

    return asyncio.run(main())
