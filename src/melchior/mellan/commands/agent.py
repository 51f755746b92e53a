"""Manage the workspace's agents: add one with its declared capabilities, list, show one,
see and change its send limits.

A capability is given as ID or ID=DESCRIPTION, e.g. --capability 'incident.inspect=Read
the incident log'. Agent ids are stable and workspace-scoped ('local/codex').

The RECEIVER column says whether the agent's receiver is online (it claimed work
recently: within twice its long-poll wait and a margin) and when it was last seen.
'agent wake' sets where the relay POSTs a signed wake-up when work is queued for the
agent (docs/mellan.md, "Wake-ups").

``mellan agent limits '*' …`` changes the workspace defaults every agent starts from.

``mellan agent rotate-key AGENT`` runs on the agent's own machine (it needs the agent's
credential and key pair, as 'mellan join' stored them): a new key pair is made here and
registered; the old pair is kept for 30 days to open what was sealed to it meanwhile.
Callers that pinned the old key refuse the new one until their operator accepts its
fingerprint (``mellan key trust AGENT FINGERPRINT``) — tell them, out of band.
"""

from __future__ import annotations

import argparse
from typing import Any

from melchior.mellan.commands._common import (
    EXIT_USAGE,
    CliError,
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


def receiver_cell(agent: dict[str, Any]) -> str:
    """``online``/``offline`` and the last sighting, as the list shows it."""
    rx = agent.get("receiver")
    if not isinstance(rx, dict):
        return "-"
    if rx.get("last_seen") is None:
        return "never seen"
    return f"{'online' if rx.get('online') else 'offline'} (seen {rx['last_seen']})"


def _list(ns: argparse.Namespace) -> int:
    data = call(target(ns), "GET", "/api/agents")
    if ns.json:
        print_json(data)
        return 0
    rows = [
        [
            a["id"],
            ", ".join(c["id"] for c in a["capabilities"]) or "-",
            receiver_cell(a),
            a["description"],
        ]
        for a in data["agents"]
    ]
    headers = ["agent", "capabilities", "receiver", "description"]
    print(table(headers, rows) if rows else "no agents yet")
    return 0


def _get_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="ID")


def _get(ns: argparse.Namespace) -> int:
    t = target(ns)
    agent = call(t, "GET", f"/api/agents/{ns.id}")
    try:  # its key for sealed tasks, if it registered one (mellan join)
        fingerprint = call(t, "GET", f"/api/keys/{ns.id}").get("fingerprint")
    except CliError:
        fingerprint = None
    if ns.json:
        print_json(agent | {"key_fingerprint": fingerprint})
    else:
        _show(agent)
        print(f"  receiver: {receiver_cell(agent)}")
        print(f"  key: {fingerprint or 'none (cannot receive sealed tasks)'}")
    return 0


def _wake_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="AGENT")
    p.add_argument("url", metavar="URL", nargs="?", help="where to POST wake-ups")
    p.add_argument("--off", action="store_true", help="stop waking this agent's receiver")
    p.add_argument("--rotate", action="store_true", help="replace the signing secret (shown once)")
    p.add_argument("--show-secret", action="store_true", help="print the signing secret")


def _wake(ns: argparse.Namespace) -> int:
    t = target(ns)
    if ns.off and ns.url:
        raise CliError("give a URL or --off, not both", EXIT_USAGE)
    if ns.url or ns.off or ns.rotate:
        url = None if ns.off else ns.url
        if url is None and not ns.off:
            current = call(t, "GET", "/api/wake", params={"agent": ns.id})
            url = current["url"]
            if url is None:
                raise CliError(f"{ns.id} has no wake URL to rotate the secret of", EXIT_USAGE)
        data = call(t, "PUT", "/api/wake", {"agent": ns.id, "url": url, "rotate": ns.rotate})
    else:
        params = {"agent": ns.id, "show_secret": "true" if ns.show_secret else None}
        data = call(t, "GET", "/api/wake", params=params)
    if ns.json:
        print_json(data)
        return 0
    if data["url"] is None:
        print(f"{ns.id}: no wake-ups (its receiver finds work by polling)")
    else:
        print(f"{ns.id}: wake-ups go to {data['url']}")
    if data.get("secret"):
        shown = "signing secret" if ns.show_secret else "signing secret (shown once)"
        print(f"{shown}: {data['secret']}")
    return 0


def _rate(text: str) -> float:
    """``5``, ``5/s`` or ``0.5/s``: sends per second."""
    number = text.strip().removesuffix("/s")
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rate like 5/s") from None
    if not 0 < value <= 100_000 or value != value:
        raise argparse.ArgumentTypeError("the rate must be above 0 and at most 100000/s")
    return value


def _limits_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="AGENT", help="agent id, or '*' for the workspace defaults")
    p.add_argument("--send-rate", type=_rate, metavar="N/s", help="sends per second it may make")
    p.add_argument("--burst", type=int, metavar="N", help="sends in a row before the rate applies")
    p.add_argument(
        "--max-unfinished-per-receiver",
        type=int,
        metavar="N",
        help="its queued, running or input-waiting tasks at any one receiver",
    )
    p.add_argument("--max-queued", type=int, metavar="N", help="tasks waiting for it, all callers")
    p.add_argument(
        "--reset", action="store_true", help="forget its stored limits first (defaults apply)"
    )


_LIMITS = ("send_rate", "burst", "max_unfinished_per_receiver", "max_queued")


def _limits(ns: argparse.Namespace) -> int:
    values = {k: getattr(ns, k) for k in _LIMITS if getattr(ns, k) is not None}
    path = f"/api/limits/{ns.id}"
    if values or ns.reset:
        data = call(target(ns), "PUT", path, {**values, "reset": ns.reset})
    else:
        data = call(target(ns), "GET", path)
    if ns.json:
        print_json(data)
        return 0
    who = "workspace defaults" if data["agent"] == "*" else data["agent"]
    rows = []
    for k in _LIMITS:
        stored, ws = data["stored"][k], data["workspace_defaults"][k]
        source = "agent" if stored is not None else "workspace" if ws is not None else "relay"
        if data["agent"] == "*":
            source = "workspace" if stored is not None else "relay"
        unit = "/s" if k == "send_rate" else ""
        rows.append([k, f"{float(data['effective'][k]):g}{unit}", source])
    print(f"send limits of {who}")
    print(table(["limit", "in force", "set by"], rows))
    return 0


def _rotate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="AGENT", help="the agent whose key pair is on this machine")


def _rotate(ns: argparse.Namespace) -> int:
    """A new key pair for the agent, its public half registered with the agent's own
    credential; the old pair retired (kept to open tasks and results sealed to it)."""
    from melchior.mellan import credentials
    from melchior.mellan.keys import RETIRED_KEEP_SECONDS, KeyProblem, begin_rotation

    t = target(argparse.Namespace(as_agent=ns.id, relay=ns.relay, ca_file=ns.ca_file))
    try:
        rotation = begin_rotation(credentials.config_dir() / "agents", ns.id)
    except KeyProblem as exc:
        raise CliError(str(exc)) from None
    try:
        call(t, "PUT", f"/api/keys/{ns.id}", {"public_key": rotation.new.public.text()})
    except CliError as exc:
        raise CliError(
            f"the relay did not take the new key ({exc}); the agent keeps its key "
            f"{rotation.old.public.fingerprint}; run the command again to retry",
            exc.status,
        ) from None
    try:
        rotation.commit()
    except (OSError, KeyProblem) as exc:  # the relay holds the new key: keep the pending pair
        raise CliError(
            f"the relay holds the new key but it could not be made the agent's here ({exc}); "
            f"its private half is in {rotation.pending}: run the command again to finish"
        ) from None
    old, new = rotation.old.public.fingerprint, rotation.new.public.fingerprint
    days = int(RETIRED_KEEP_SECONDS // 86400)
    if ns.json:
        print_json({"agent": ns.id, "fingerprint": new, "retired": old, "retired_days": days})
    else:
        print(f"{ns.id}: key {new} registered; {old} retired (kept {days} days to open what "
              "was sealed to it)")  # fmt: skip
        print(f"callers that pinned {old} refuse the new key until they run:")
        print(f"  mellan key trust {ns.id} {new}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subcommands(
        parser,
        {
            "add": ("add an agent with its capabilities", _add_args, _add),
            "list": ("list the agents you may see", lambda p: None, _list),
            "get": ("show one agent (and its key's fingerprint)", _get_args, _get),
            "show": ("the same as get", _get_args, _get),
            "wake": (
                "show or set (URL, --off) where its receiver is woken (owner)",
                _wake_args,
                _wake,
            ),
            "limits": ("show or change an agent's send limits (owner)", _limits_args, _limits),
            "rotate-key": (
                "replace this machine's key pair for sealed tasks (the agent itself)",
                _rotate_args,
                _rotate,
            ),
        },
    )


run = guarded(dispatch)
