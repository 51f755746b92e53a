"""The ``melchior`` command.

Start-up time is a product feature (``melchior tool`` is exec'd once per request),
so only the invoked subcommand's module is imported; the top-level help comes
from this table and imports nothing.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from melchior import __version__

if TYPE_CHECKING:
    import argparse

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("melchior.commands.serve", "bind this session's socket and answer for it"),
    "tool": ("melchior.commands.tool", "the vocabulary a model calls, one exec per request"),
    "fork": ("melchior.commands.fork", "a name and a secret for a session about to start"),
    "lua-api": ("melchior.commands.lua_api", "print the plain-Lua client library"),
    "verbs": ("melchior.commands.verbs", "what a session answers over its socket"),
    "gate-wire": ("melchior.commands.gate_wire", "refuse wire messages tagged other than 'event'"),
}


def _top_parser(available: dict[str, tuple[str, str]]) -> argparse.ArgumentParser:
    import argparse

    lines = "\n".join(f"  {name:<10} {text}" for name, (_, text) in available.items())
    parser = argparse.ArgumentParser(
        prog="melchior",
        description="One agent talking to another: naming, finding, reaching and refusing.",
        epilog=f"commands:\n{lines}\n\nRun 'melchior COMMAND --help' for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"melchior {__version__}")
    parser.add_argument("command", nargs="?", help=argparse.SUPPRESS)
    return parser


def _available() -> dict[str, tuple[str, str]]:
    import importlib.util

    out = {}
    for name, (module, text) in COMMANDS.items():
        if importlib.util.find_spec(module) is not None:
            out[name] = (module, text)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in COMMANDS:
        name = args[0]
        module = importlib.import_module(COMMANDS[name][0])
        # A command may read its common argv shape itself: argparse is a start-up cost.
        fast = getattr(module, "parse_fast", None)
        quick = fast(args[1:]) if fast is not None else None
        if quick is not None:
            fast_code: int = module.run(quick)
            return fast_code
        import argparse

        parser = argparse.ArgumentParser(
            prog=f"melchior {name}",
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(parser)
        ns = parser.parse_args(args[1:])
        code: int = module.run(ns)
        return code
    parser = _top_parser(_available())
    ns = parser.parse_args(args)
    if ns.command is not None:
        parser.error(f"unknown command {ns.command!r}; see 'melchior --help'")
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
