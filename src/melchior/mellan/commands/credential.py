"""Revoke a credential (owner: any in the workspace; an agent: its own). Refused at once."""

from __future__ import annotations

import argparse

from melchior.mellan.commands._common import (
    call,
    dispatch,
    guarded,
    print_json,
    subcommands,
    target,
)


def _revoke_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="ID", help="credential id (printed at join / relay start)")


def _revoke(ns: argparse.Namespace) -> int:
    data = call(target(ns), "DELETE", f"/api/credentials/{ns.id}")
    if ns.json:
        print_json(data)
    else:
        print(f"credential {ns.id} revoked")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subcommands(parser, {"revoke": ("revoke a credential", _revoke_args, _revoke)})


run = guarded(dispatch)
