"""Keys for sealed tasks: see an agent's key as the relay gives it and as this machine
pinned it, and accept a changed one.

The first time this machine sees an agent's key (here, or sealing to it) the key is
pinned; a different key offered later is refused until you have checked the new
fingerprint with the agent's owner (out of band: not through the relay) and run
'mellan key trust AGENT FINGERPRINT'. docs/security.md says why.
"""

from __future__ import annotations

import argparse

from melchior.mellan.commands._common import (
    CliError,
    call,
    dispatch,
    guarded,
    print_json,
    subcommands,
    target,
)
from melchior.mellan.credentials import config_dir
from melchior.mellan.keys import KeyChanged, KeyProblem, Pins
from melchior.mellan.sealing import PublicKey


def pins() -> Pins:
    return Pins(config_dir())


def fetch_pinned(ns: argparse.Namespace, agent: str) -> PublicKey:
    """``agent``'s key from the relay, checked against (or pinned as) this machine's pin."""
    data = call(target(ns), "GET", f"/api/keys/{agent}")
    try:
        offered = PublicKey.parse(data.get("public_key") if isinstance(data, dict) else None)
    except ValueError as exc:
        raise CliError(f"the relay's answer for {agent}'s key: {exc}") from None
    try:
        return pins().check(agent, offered)
    except (KeyChanged, KeyProblem) as exc:
        raise CliError(str(exc)) from None


def _agent_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("agent", metavar="AGENT", help="the agent's id, e.g. private/ops")


def _show(ns: argparse.Namespace) -> int:
    key = fetch_pinned(ns, ns.agent)
    if ns.json:
        print_json({"agent": ns.agent, "fingerprint": key.fingerprint, "pinned": True})
    else:
        print(f"{ns.agent}  {key.fingerprint}  (pinned on this machine)")
    return 0


def _trust_args(p: argparse.ArgumentParser) -> None:
    _agent_arg(p)
    p.add_argument("fingerprint", metavar="FINGERPRINT", help="as 'mellan agent get' prints it")


def _trust(ns: argparse.Namespace) -> int:
    try:
        pin = pins().trust(ns.agent, ns.fingerprint)
    except KeyProblem as exc:
        raise CliError(str(exc)) from None
    if ns.json:
        print_json({"agent": ns.agent, "trusted": ns.fingerprint.strip().lower()})
    elif pin.trusted:
        print(f"{ns.agent}: key {pin.trusted} trusted; it is pinned the next time it is seen")
    else:
        print(f"{ns.agent}: key {ns.fingerprint.strip().lower()} is already the pinned one")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subcommands(
        parser,
        {
            "show": ("an agent's key as the relay gives it, pinned here", _agent_arg, _show),
            "trust": ("accept a changed key for an agent by its fingerprint", _trust_args, _trust),
        },
    )


run = guarded(dispatch)
