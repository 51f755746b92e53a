"""Directional grants: CALLER may invoke these CAPabilities on RECEIVER, and nothing else.

The reverse direction and other capabilities are not implied. Both agents must exist and
the receiver must declare every capability granted. ``--sealed`` makes the grant require
sealed sends (``mellan send --seal``): an unsealed one is refused at the relay's door
(docs/security.md).
"""

from __future__ import annotations

import argparse

from melchior.mellan.commands._common import (
    call,
    dispatch,
    guarded,
    print_json,
    subcommands,
    table,
    target,
)


def _add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("caller", metavar="CALLER")
    p.add_argument("receiver", metavar="RECEIVER")
    p.add_argument("capabilities", metavar="CAP", nargs="+")
    p.add_argument("--sealed", action="store_true", help="every send on this grant must be sealed")


def _add(ns: argparse.Namespace) -> int:
    grant = call(
        target(ns),
        "POST",
        "/api/grants",
        {
            "caller": ns.caller,
            "receiver": ns.receiver,
            "capabilities": ns.capabilities,
            "sealed": ns.sealed,
        },
    )
    if ns.json:
        print_json(grant)
    else:
        print(
            f"grant {grant['id']}: {grant['caller']} may invoke "
            f"{', '.join(grant['capabilities'])} on {grant['receiver']} (this direction only"
            + ("; sealed sends only)" if grant.get("sealed") else ")")
        )
    return 0


def _list_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--caller")
    p.add_argument("--receiver")
    p.add_argument("--all", action="store_true", help="include revoked grants")


def _list(ns: argparse.Namespace) -> int:
    data = call(
        target(ns),
        "GET",
        "/api/grants",
        params={
            "caller": ns.caller,
            "receiver": ns.receiver,
            "include_revoked": "true" if ns.all else None,
        },
    )
    if ns.json:
        print_json(data)
        return 0
    rows = [
        [
            g["id"],
            g["caller"],
            g["receiver"],
            ", ".join(g["capabilities"]),
            "revoked " + g["revoked_at"] if g["revoked_at"] else "active",
            "sealed" if g.get("sealed") else "",
        ]
        for g in data["grants"]
    ]
    print(
        table(["id", "caller", "receiver", "capabilities", "state", "sealing"], rows)
        if rows
        else "no grants"
    )
    return 0


def _revoke_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="ID", help="grant id (see 'mellan grant list')")


def _revoke(ns: argparse.Namespace) -> int:
    data = call(target(ns), "DELETE", f"/api/grants/{ns.id}")
    if ns.json:
        print_json(data)
    else:
        print(f"grant {ns.id} revoked; new tasks on that route are refused")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subcommands(
        parser,
        {
            "add": ("grant CALLER the capabilities CAP… on RECEIVER", _add_args, _add),
            "list": ("list grants", _list_args, _list),
            "revoke": ("revoke a grant", _revoke_args, _revoke),
        },
    )


run = guarded(dispatch)
