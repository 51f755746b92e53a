"""Inspect and cancel tasks. Owners see the workspace; an agent sees tasks it sent or received.

Cancelling a queued task removes it from the queue at once; cancelling a running task
revokes its lease, and the receiver learns on its next renew.
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


def _list_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", help="comma-separated: queued,leased,succeeded,failed,…")
    p.add_argument("--caller")
    p.add_argument("--receiver")
    p.add_argument("--limit", type=int, default=50)


def _list(ns: argparse.Namespace) -> int:
    data = call(
        target(ns),
        "GET",
        "/api/tasks",
        params={
            "state": ns.state,
            "caller": ns.caller,
            "receiver": ns.receiver,
            "limit": ns.limit,
        },
    )
    if ns.json:
        print_json(data)
        return 0
    rows = [
        [
            t["id"],
            t["state"],
            t["caller"],
            t["receiver"],
            t["capability"],
            f"{t['attempt']}/{t['max_attempts']}",
            t["updated_at"],
        ]
        for t in data["tasks"]
    ]
    headers = ["id", "state", "caller", "receiver", "capability", "attempt", "updated"]
    print(table(headers, rows) if rows else "no tasks")
    return 0


def _id_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="TASK_ID")


def _show(t: dict[str, Any]) -> None:
    for key in ("id", "state", "caller", "receiver", "capability", "context_id", "attempt",
                "max_attempts", "lease_epoch", "lease_expires_at", "error", "created_at",
                "updated_at"):  # fmt: skip
        if t.get(key) is not None:
            print(f"{key:<17}{t[key]}")
    for e in t.get("events", []):
        print(f"event {e['seq']:<6}{e['at']}  {e['kind']}")


def _get(ns: argparse.Namespace) -> int:
    data = call(target(ns), "GET", f"/api/tasks/{ns.id}")
    if ns.json:
        print_json(data)
    else:
        _show(data)
    return 0


def _cancel(ns: argparse.Namespace) -> int:
    data = call(target(ns), "POST", f"/api/tasks/{ns.id}/cancel")
    if ns.json:
        print_json(data)
    elif data["outcome"] == "duplicate":
        print(f"task {ns.id} was already cancelled")
    else:
        print(f"task {ns.id} cancelled")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subcommands(
        parser,
        {
            "list": ("list tasks, newest first", _list_args, _list),
            "get": ("show one task with its events", _id_args, _get),
            "cancel": ("cancel a queued or running task", _id_args, _cancel),
        },
    )


run = guarded(dispatch)
