"""Show which workspace and identity the current credential acts as."""

from __future__ import annotations

import argparse

from melchior.mellan.commands._common import add_common, call, guarded, print_json, target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)


@guarded
def run(ns: argparse.Namespace) -> int:
    t = target(ns)
    me = call(t, "GET", "/api/whoami")
    if ns.json:
        print_json(me)
    else:
        print(
            f"{me['kind']} {me['subject']!r} in workspace {me['workspace']!r} at {t.relay} "
            f"(credential {me['credential_id']})"
        )
    return 0
