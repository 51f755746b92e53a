"""The ``melchior`` command: the local layer's subcommands (see :mod:`melchior.dispatch`)."""

from __future__ import annotations

import sys

from melchior import __version__
from melchior.dispatch import TYPE_CHECKING, Program, run

if TYPE_CHECKING:
    from collections.abc import Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("melchior.commands.serve", "bind this session's socket and answer for it"),
    "tool": ("melchior.commands.tool", "the vocabulary a model calls, one exec per request"),
    "fork": ("melchior.commands.fork", "a name and a secret for a session about to start"),
    "lua-api": ("melchior.commands.lua_api", "print the plain-Lua client library"),
    "verbs": ("melchior.commands.verbs", "what a session answers over its socket"),
    "gate-wire": ("melchior.commands.gate_wire", "refuse wire messages tagged other than 'event'"),
    "models": ("melchior.commands.models", "list the models your configured providers offer"),
    "plane": ("melchior.commands.plane", "run a team of agents turn by turn; read its log"),
    "mcp": ("melchior.commands.mcp", "be a coding agent's session, as an MCP server on stdio"),
    "hook": ("melchior.commands.hook", "answer a coding agent's turn hook from its bridge"),
    "integrate": ("melchior.commands.integrate", "write the config that puts melchior in an agent"),
}


PROGRAM = Program(
    prog="melchior",
    version=__version__,
    description="One agent talking to another: naming, finding, reaching and refusing.",
    commands=COMMANDS,
)


def main(argv: Sequence[str] | None = None) -> int:
    return run(PROGRAM, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
