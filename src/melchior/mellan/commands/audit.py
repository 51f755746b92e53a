"""Read the workspace's append-only audit log; --follow keeps printing new records.

Every decision is there: agents, grants, enrollments, tasks accepted or refused (with the
policy rule and reason), claims, completions, cancels and lost leases. Owner only.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from melchior.mellan.commands._common import (
    EXIT_UNREACHABLE,
    CliError,
    add_common,
    call,
    guarded,
    print_json,
    table,
    target,
)

FOLLOW_WAIT = 25


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new records")
    parser.add_argument("--after", type=int, default=0, metavar="SEQ", help="start after SEQ")
    parser.add_argument("--limit", type=int, default=100, metavar="N", help="records per page")


def _row(r: dict[str, Any]) -> list[Any]:
    return [
        r["seq"],
        r["at"],
        r["actor"],
        r["action"],
        r["subject"],
        "allow" if r["allowed"] else "REFUSE",
        f"{r['rule']}: {r['reason']}",
    ]


HEADERS = ["seq", "at", "actor", "action", "subject", "decision", "why"]


@guarded
def run(ns: argparse.Namespace) -> int:
    t = target(ns)
    after = ns.after
    if not ns.follow:
        data = call(t, "GET", "/api/audit", params={"after": after, "limit": ns.limit})
        if ns.json:
            print_json(data)
        else:
            rows = [_row(r) for r in data["records"]]
            print(table(HEADERS, rows) if rows else "no audit records")
        return 0
    while True:  # --follow: long-poll; on a relay outage, say so and keep trying
        try:
            data = call(
                t,
                "GET",
                "/api/audit",
                params={"after": after, "limit": ns.limit, "wait": FOLLOW_WAIT},
                timeout=FOLLOW_WAIT + 10,
            )
        except CliError as exc:
            if exc.status != EXIT_UNREACHABLE:
                raise
            print(f"mellan: {exc}; retrying in 2 s", flush=True)
            time.sleep(2)
            continue
        for r in data["records"]:
            if ns.json:
                print_json(r)
            else:
                print("  ".join(str(v) for v in _row(r)))
        after = data["next"]
        sys.stdout.flush()
