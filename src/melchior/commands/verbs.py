"""Print what a session answers over its socket, as data: one JSON reply whose result
lists {name, args, summary, anonymous} per verb (the same list the 'verbs' call returns)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="accepted; the output is always JSON")


def run(ns: argparse.Namespace) -> int:
    from melchior.session.verbs import VERBS
    from melchior.wire import argv
    from melchior.wire.calls import ok

    argv.emit(ok([v.as_dict() for v in VERBS]))
    return 0
