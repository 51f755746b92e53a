"""Store a relay URL and a credential for later commands (checked against the relay first).

The token is read from --token-file, else $MELLAN_TOKEN, else standard input, never from
the command line. The login is written to $XDG_CONFIG_HOME/mellan/login.json (0600).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path

from melchior.mellan.commands._common import (
    EXIT_USAGE,
    CliError,
    Target,
    add_common,
    call,
    client_tls,
    guarded,
    login_file,
    print_json,
    write_private_json,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser, relay=False)
    parser.add_argument("--relay", metavar="URL", required=True, help="the relay's URL")
    parser.add_argument(
        "--token-file", metavar="PATH", type=Path, help="file holding the token (e.g. owner.token)"
    )


def _token(ns: argparse.Namespace) -> str:
    if ns.token_file is not None:
        try:
            return str(ns.token_file.read_text(encoding="utf-8")).strip()
        except OSError as exc:
            raise CliError(f"cannot read {ns.token_file}: {exc.strerror}", EXIT_USAGE) from exc
    if os.environ.get("MELLAN_TOKEN"):
        return os.environ["MELLAN_TOKEN"].strip()
    if sys.stdin.isatty():
        return getpass.getpass("mellan token: ").strip()
    return sys.stdin.readline().strip()


@guarded
def run(ns: argparse.Namespace) -> int:
    token = _token(ns)
    if not token:
        raise CliError("no token given (use --token-file PATH or $MELLAN_TOKEN)", EXIT_USAGE)
    relay = ns.relay.rstrip("/")
    tls = client_tls(ns)
    me = call(Target(relay, token, tls), "GET", "/api/whoami")
    path = login_file()
    write_private_json(
        path,
        {
            "relay": relay,
            "token": token,
            "workspace": me["workspace"],
            "kind": me["kind"],
            "subject": me["subject"],
            **tls.stored(),
        },
    )
    if ns.json:
        print_json({**me, "stored": str(path)})
    else:
        print(
            f"logged in to {relay} as {me['kind']} {me['subject']!r} in workspace "
            f"{me['workspace']!r}; stored in {path} (0600)"
        )
    return 0
