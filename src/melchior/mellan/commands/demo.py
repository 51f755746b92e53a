"""Watch the whole system work, on a throwaway relay, in under half a minute.

A relay on a free port with its state in a temporary directory; two agents and a
directional grant; a route proposed and approved; a receiver running a tiny program; a
task sent and its answer printed; two agents on a plane, a held note answered; the
dashboard's address with a one-time sign-in link. Each step prints the command a person
would type. Everything keeps running until Ctrl-C (or SIGTERM), then stops in order and
the temporary directory is removed: nothing is read from or left in your own state.
"""

from __future__ import annotations

import argparse
import sys

from melchior import __version__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"mellan {__version__}")
    parser.add_argument("--port", type=int, default=0, metavar="PORT",
                        help="the relay's port (default: any free one)")  # fmt: skip
    parser.add_argument("--exit", action="store_true",
                        help="stop as soon as every step has run (for scripts and CI)")  # fmt: skip
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (its path is printed)")  # fmt: skip


def run(ns: argparse.Namespace) -> int:
    from melchior.mellan.demo import run_demo

    return run_demo(sys.stdout, port=ns.port, keep=ns.keep, stay=not ns.exit)
