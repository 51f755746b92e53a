"""Exchange a one-time enrollment code for this agent's credential and store it (0600).

The credential is written to $XDG_CONFIG_HOME/mellan/agents/<agent id>.json, which the
receiver reads; the token is never printed. Beside it, in <agent id>.key (0600), a key
pair is made on this machine for sealed tasks (docs/security.md), and only its public
half is registered with the relay, bound to the agent. A second join on the same machine
keeps the key pair it has.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from melchior.mellan.commands._common import (
    EXIT_USAGE,
    CliError,
    Target,
    add_common,
    agent_file,
    call,
    client_tls,
    guarded,
    print_json,
    write_private_json,
)
from melchior.mellan.credentials import config_dir
from melchior.mellan.keys import KeyProblem, ensure_keypair
from melchior.mellan.sealing import PublicKey


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser, relay=False)
    parser.add_argument("code", metavar="CODE", help="the code from 'mellan enroll' ('-': stdin)")
    parser.add_argument("--relay", metavar="URL", required=True, help="the relay's URL")


def register_key(t: Target, agents_dir: Path, agent: str) -> PublicKey:
    """Make (or keep) this agent's key pair and register its public half with the relay."""
    try:
        pair, _ = ensure_keypair(agents_dir, agent)
    except KeyProblem as exc:
        raise CliError(str(exc)) from None
    call(t, "PUT", f"/api/keys/{agent}", {"public_key": pair.public.text()})
    return pair.public


@guarded
def run(ns: argparse.Namespace) -> int:
    code = sys.stdin.readline().strip() if ns.code == "-" else ns.code.strip()
    if not code:
        raise CliError("no enrollment code given", EXIT_USAGE)
    relay = ns.relay.rstrip("/")
    tls = client_tls(ns)
    data = call(Target(relay, None, tls), "POST", "/api/join", {"code": code}, secret=True)
    agent = str(data["agent"])
    path = agent_file(agent)
    write_private_json(
        path,
        {
            "relay": relay,
            "workspace": data["workspace"],
            "agent": agent,
            "credential_id": data["credential_id"],
            "token": data["token"],
            **tls.stored(),
        },
    )
    key = register_key(Target(relay, str(data["token"]), tls), config_dir() / "agents", agent)
    if ns.json:
        print_json(
            {k: v for k, v in data.items() if k != "token"}
            | {"stored": str(path), "key_fingerprint": key.fingerprint}
        )
    else:
        print(
            f"joined workspace {data['workspace']!r} as {agent}; credential "
            f"{data['credential_id']} stored in {path} (0600); key {key.fingerprint} "
            "registered (private key kept here, 0600)"
        )
    return 0
