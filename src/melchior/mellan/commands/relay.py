"""Run a mellan relay replica: control API, receiver API and A2A entry, on SQLite or PostgreSQL.

The first start on an empty database creates workspace 'default' and writes an owner
credential to a private file (its path is printed, the token never is). Several replicas
may share one PostgreSQL database; SQLite is for one machine.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from melchior import __version__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from melchior.mellan.relay.serve import DEFAULT_HOST, DEFAULT_PORT

    parser.add_argument("--version", action="version", version=f"mellan {__version__}")
    parser.add_argument(
        "--database",
        metavar="URL",
        help="sqlite:///PATH or postgresql://… (default: SQLite at $XDG_DATA_HOME/mellan/relay.db)",
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"bind address ({DEFAULT_HOST})")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"bind port ({DEFAULT_PORT}; 0 = any free)"
    )
    parser.add_argument(
        "--public-url", metavar="URL", help="the URL agents use to reach this relay"
    )
    parser.add_argument(
        "--owner-token-file",
        metavar="PATH",
        type=Path,
        help="where a minted owner token is written (default $XDG_DATA_HOME/mellan/owner.token)",
    )
    parser.add_argument(
        "--mint-owner-token",
        action="store_true",
        help="mint another owner credential at start (e.g. the first token file was lost)",
    )
    parser.add_argument(
        "--json", action="store_true", help="status lines as JSON objects, one per line"
    )
    parser.add_argument(
        "--max-body",
        type=int,
        default=16 * 1024 * 1024,
        metavar="BYTES",
        help="largest request body accepted (default 16 MiB)",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long a client has to send a whole request body (default 30; then 408)",
    )
    parser.add_argument(
        "--retain-days",
        type=float,
        metavar="DAYS",
        help="delete tasks this many days after they finished, with their events and turns"
        " (the audit log is kept; default: keep every task)",
    )


def run(ns: argparse.Namespace) -> int:
    from melchior.mellan.relay.serve import RelayOptions, serve

    if not 0 <= ns.port <= 65535:
        print(f"mellan relay: --port {ns.port} is not a port number (0-65535)")
        return 2
    if not 0 < ns.body_timeout <= 3600:
        print(f"mellan relay: --body-timeout {ns.body_timeout} must be in (0, 3600] seconds")
        return 2
    if ns.retain_days is not None and not 0 < ns.retain_days <= 36500:
        print(f"mellan relay: --retain-days {ns.retain_days:g} must be in (0, 36500] days")
        return 2
    return serve(
        RelayOptions(
            database=ns.database,
            host=ns.host,
            port=ns.port,
            public_url=ns.public_url,
            owner_token_file=ns.owner_token_file,
            mint_owner_token=ns.mint_owner_token,
            max_body=ns.max_body,
            body_deadline=ns.body_timeout,
            json=ns.json,
            retain_days=ns.retain_days,
        )
    )
