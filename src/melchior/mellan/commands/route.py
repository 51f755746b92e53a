"""Task routes: how each receiving agent runs each capability, approved by the owner.

An agent proposes a route from its own machine ('mellan connect …'); it applies only once
the workspace owner approves it here. Approving a route for an (agent, capability) that
already has one revokes the old one. Every change is in the audit log ('route.*').
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


def _list_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agent", metavar="AGENT", help="only this receiving agent's routes")
    p.add_argument(
        "--state", metavar="STATE", help="pending, approved or revoked (comma-separated)"
    )
    p.add_argument("--capability", metavar="CAP", help="only routes for this capability")


def _list(ns: argparse.Namespace) -> int:
    data = call(
        target(ns),
        "GET",
        "/api/routes",
        params={"agent": ns.agent, "state": ns.state, "capability": ns.capability},
    )
    if ns.json:
        print_json(data)
        return 0
    rows = [
        [
            r["id"],
            r["state"],
            r["agent"],
            r["capability"],
            r["adapter"],
            r["session"] or "-",
            r["cwd"] or "-",
            r["profile"] or "-",
        ]
        for r in data["routes"]
    ]
    headers = ["id", "state", "agent", "capability", "adapter", "session", "cwd", "profile"]
    print(table(headers, rows) if rows else "no routes")
    return 0


def _id_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="ID", help="route id (see 'mellan route list')")


def _approve(ns: argparse.Namespace) -> int:
    data = call(target(ns), "POST", f"/api/routes/{ns.id}/approve")
    if ns.json:
        print_json(data)
        return 0
    r = data["route"]
    if data["outcome"] == "duplicate":
        print(f"route {r['id']} was already approved")
        return 0
    print(f"route {r['id']} approved: {r['agent']} runs {r['capability']} with {r['adapter']}")
    for old in data["superseded"]:
        print(f"route {old} revoked (superseded)")
    return 0


def _revoke(ns: argparse.Namespace) -> int:
    data = call(target(ns), "POST", f"/api/routes/{ns.id}/revoke")
    if ns.json:
        print_json(data)
    elif data["outcome"] == "duplicate":
        print(f"route {ns.id} was already revoked")
    else:
        r = data["route"]
        print(f"route {r['id']} revoked: {r['agent']} has no route for {r['capability']} now")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subcommands(
        parser,
        {
            "list": ("list routes (an agent: its own)", _list_args, _list),
            "approve": ("approve a proposed route (owner)", _id_args, _approve),
            "revoke": ("revoke a route (owner)", _id_args, _revoke),
        },
    )


run = guarded(dispatch)
