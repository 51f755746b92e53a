"""Lazy subcommands, shared by the ``melchior`` and ``mellan`` commands.

Start-up time is a product feature (``melchior tool`` is exec'd once per request), so
only the invoked subcommand's module is imported, and argparse itself only when it is
needed: a module may offer ``parse_fast(argv)`` that reads its common argv shape and
returns a namespace (or None to fall back to argparse). Every module offers
``add_arguments(parser)`` and ``run(namespace) -> int``; its docstring is its ``--help``
description. The top-level help is built from the table and imports nothing.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up, above)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import NoReturn


class Program:
    """One command's name, version and subcommand table.

    A plain class rather than a NamedTuple or a dataclass: typing (for NamedTuple) is
    ~3 ms of every exec and dataclasses (with the inspect module it pulls in) ~15-25 ms,
    and ``melchior tool`` is exec'd once per request.
    """

    __slots__ = ("commands", "description", "footer", "prog", "version")

    def __init__(
        self,
        prog: str,
        version: str,
        description: str,
        commands: Mapping[str, tuple[str, str]],  # name -> (module, one-line help)
        footer: str = "",
    ) -> None:
        self.prog = prog
        self.version = version
        self.description = description
        self.commands = commands
        self.footer = footer


def run(program: Program, argv: Sequence[str]) -> int:
    args = list(argv)
    if args and args[0] in program.commands:
        name = args[0]
        __import__(program.commands[name][0])  # importlib itself is one more import
        module = sys.modules[program.commands[name][0]]
        fast = getattr(module, "parse_fast", None)
        quick = fast(args[1:]) if fast is not None else None
        if quick is not None:
            fast_code: int = module.run(quick)
            return fast_code
        import argparse

        parser = parser_class()(
            prog=f"{program.prog} {name}",
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(parser)
        code: int = module.run(parser.parse_args(args[1:]))
        return code
    return _top_level(program, args)


def parser_class() -> type:
    """``argparse.ArgumentParser`` that names an unknown command as one at every level
    (subparsers inherit their parent's class), with the closest known one."""
    import argparse
    import difflib
    import re

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            found = re.match(r"argument ([^:]+): invalid choice: '(.*)' \(choose from (.*)\)$",
                             message)  # fmt: skip
            if found is not None:
                name, wrong = found.group(1), found.group(2)
                known = [c.strip().strip("'") for c in found.group(3).split(",")]
                close = difflib.get_close_matches(wrong, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                commands = {
                    argparse._get_action_name(a)
                    for a in self._actions
                    if isinstance(a, argparse._SubParsersAction)
                }
                if name in commands:
                    message = f"unknown command {wrong!r}{hint} (the commands: {', '.join(known)})"
                else:
                    message += hint
            super().error(message)

    return Parser


def _top_level(program: Program, args: list[str]) -> int:
    import argparse
    import difflib

    width = max((len(n) for n in program.commands), default=0) + 1
    lines = "\n".join(f"  {name:<{width}} {text}" for name, (_, text) in program.commands.items())
    footer = f" {program.footer}" if program.footer else ""
    parser = parser_class()(
        prog=program.prog,
        description=program.description,
        epilog=f"commands:\n{lines}\n\nRun '{program.prog} COMMAND --help' for a command's "
        f"options.{footer}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{program.prog} {program.version}")
    parser.add_argument("command", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns = parser.parse_args(args)
    if ns.command is not None:
        close = difflib.get_close_matches(ns.command, list(program.commands), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        parser.error(f"unknown command {ns.command!r}{hint} (see '{program.prog} --help')")
    parser.print_help()
    return 0
