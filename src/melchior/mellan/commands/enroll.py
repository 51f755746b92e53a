"""Mint a one-time, expiring enrollment code for an agent (owner only).

Give the code to whoever runs the agent; on its machine, 'mellan join CODE --relay URL'
exchanges it for the agent's own credential. The code works once.
"""

from __future__ import annotations

import argparse

from melchior.mellan.commands._common import add_common, call, guarded, print_json, target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("id", metavar="ID", help="the agent to enroll, e.g. private/ops")
    parser.add_argument(
        "--ttl", type=int, default=900, metavar="SECONDS", help="validity (default 900)"
    )


@guarded
def run(ns: argparse.Namespace) -> int:
    t = target(ns)
    data = call(t, "POST", "/api/enrollments", {"agent": ns.id, "ttl_seconds": ns.ttl})
    if ns.json:
        print_json(data)
    else:
        print(data["code"])
        print(
            f"one-time code for {data['agent']}, valid until {data['expires_at']}; on the "
            f"agent's machine run:\n  mellan join {data['code']} --relay {t.relay}"
        )
    return 0
