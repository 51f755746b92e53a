"""Manage the workspace's agents: add one with its declared capabilities, list, show one.

A capability is given as ID or ID=DESCRIPTION, e.g. --capability 'incident.inspect=Read
the incident log'. Agent ids are stable and workspace-scoped ('local/codex').
"""

from __future__ import annotations

import argparse
from typing import Any

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
    p.add_argument("id", metavar="ID", help="workspace-scoped agent id, e.g. private/ops")
    p.add_argument(
        "--capability",
        "-c",
        action="append",
        default=[],
        metavar="CAP",
        help="a capability it offers: ID or ID=DESCRIPTION (repeatable)",
    )
    p.add_argument("--description", "-d", default="", help="what this agent is")


def _show(agent: dict[str, Any]) -> None:
    print(f"{agent['id']}  {agent['description']}".rstrip())
    for cap in agent["capabilities"]:
        print(f"  - {cap['id']}" + (f": {cap['description']}" if cap["description"] else ""))


def _add(ns: argparse.Namespace) -> int:
    caps = []
    for raw in ns.capability:
        cap_id, _, desc = raw.partition("=")
        caps.append({"id": cap_id.strip(), "description": desc.strip()})
    agent = call(
        target(ns),
        "POST",
        "/api/agents",
        {"id": ns.id, "description": ns.description, "capabilities": caps},
    )
    if ns.json:
        print_json(agent)
    else:
        print(f"added agent {agent['id']}")
        _show(agent)
    return 0


def _list(ns: argparse.Namespace) -> int:
    data = call(target(ns), "GET", "/api/agents")
    if ns.json:
        print_json(data)
        return 0
    rows = [
        [a["id"], ", ".join(c["id"] for c in a["capabilities"]) or "-", a["description"]]
        for a in data["agents"]
    ]
    print(table(["agent", "capabilities", "description"], rows) if rows else "no agents yet")
    return 0


def _get_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="ID")


def _get(ns: argparse.Namespace) -> int:
    agent = call(target(ns), "GET", f"/api/agents/{ns.id}")
    if ns.json:
        print_json(agent)
    else:
        _show(agent)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subcommands(
        parser,
        {
            "add": ("add an agent with its capabilities", _add_args, _add),
            "list": ("list the agents you may see", lambda p: None, _list),
            "get": ("show one agent", _get_args, _get),
        },
    )


run = guarded(dispatch)
