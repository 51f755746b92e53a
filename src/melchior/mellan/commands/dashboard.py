"""The owner's dashboard in the relay (``/ui/``): a one-time sign-in link.

``mellan dashboard link`` asks the relay, with the owner credential, for a link that signs
one browser in to the dashboard, once, within ten minutes — instead of pasting the owner
token into the sign-in page. Print it, open it; the page it shows has one button.
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


def _link_args(p: argparse.ArgumentParser) -> None:
    """No options of its own beyond the common ones (--relay, --json, …)."""


def _link(ns: argparse.Namespace) -> int:
    data = call(target(ns), "POST", "/api/dashboard/links", {})
    if ns.json:
        print_json(data)
    else:
        print(data["url"])
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subcommands(
        parser,
        {"link": ("print a one-time sign-in link to the dashboard (owner)", _link_args, _link)},
    )


run = guarded(dispatch)
