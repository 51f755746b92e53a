"""Push notifications: the secret deliveries are signed with, and where they may go.

A caller that gives a task a push config (A2A ``taskPushNotificationConfig``) gets every
change of the task POSTed to its URL, signed with its agent's push secret
(``X-Mellan-Signature``, see docs/a2a.md "Push notifications"). Deliveries go to public
addresses only, over https, unless the workspace owner allows private ones.
"""

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


def _secret_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--agent", metavar="AGENT", help="whose secret (an owner must name one; an agent: itself)"
    )
    p.add_argument(
        "--rotate", action="store_true", help="replace it (the old one stops signing at once)"
    )


def _secret(ns: argparse.Namespace) -> int:
    t = target(ns)
    if ns.rotate:
        data = call(t, "POST", "/api/push/secret/rotate", {"agent": ns.agent})
    else:
        data = call(t, "GET", "/api/push/secret", params={"agent": ns.agent})
    if ns.json:
        print_json(data)
    else:
        print(data["secret"])
    return 0


def _private_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "setting", metavar="on|off", nargs="?", choices=["on", "off"],
        help="allow (on) or forbid (off) deliveries to private addresses; omit to show",
    )  # fmt: skip


def _private(ns: argparse.Namespace) -> int:
    t = target(ns)
    if ns.setting is None:
        data = call(t, "GET", "/api/push/settings")
    else:
        data = call(t, "PUT", "/api/push/settings", {"allow_private": ns.setting == "on"})
    if ns.json:
        print_json(data)
    elif data["allow_private"]:
        print(f"{data['workspace']}: pushes may go to private addresses (and plain http)")
    else:
        print(f"{data['workspace']}: pushes go to public https addresses only")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subcommands(
        parser,
        {
            "secret": ("print (or --rotate) an agent's push signing secret", _secret_args, _secret),
            "private": (
                "show, or (owner) allow or forbid, pushes to private addresses",
                _private_args,
                _private,
            ),
        },
    )


run = guarded(dispatch)
