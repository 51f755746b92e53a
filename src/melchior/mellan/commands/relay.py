"""Run a mellan relay replica: control API, receiver API and A2A entry, on SQLite or PostgreSQL.

The first start on an empty database creates workspace 'default' and writes an owner
credential to a private file (its path is printed, the token never is). Several replicas
may share one PostgreSQL database; SQLite is for one machine.

Settings come from a TOML file (--config FILE or $MELLAN_CONFIG), then MELLAN_*
environment variables, then flags, each overriding the one before; every flag below names
its key and variable. --print-config shows the result and where each value came from.
A non-loopback address needs --tls-cert/--tls-key (or --insecure-http). SIGHUP reloads
the certificate and key. See docs/operations.md.

  mellan relay backup PATH       a consistent online copy of the SQLite database
  mellan relay migrate --to URL  copy everything into an empty PostgreSQL database
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from melchior import __version__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from melchior.mellan.relay.server import settings

    parser.add_argument("--version", action="version", version=f"mellan {__version__}")
    settings.add_arguments(parser)
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective configuration (secrets masked, each value's source) and exit",
    )
    subs = parser.add_subparsers(dest="action", metavar="ACTION")
    backup = subs.add_parser(
        "backup",
        help="copy the SQLite database consistently while the relay runs",
        description="A consistent online copy of the relay's SQLite database (SQLite's backup "
        "API: the relay keeps serving). PostgreSQL: use pg_dump (docs/operations.md).",
    )
    backup.add_argument("path", metavar="PATH", type=Path, help="where to write the copy")
    migrate = subs.add_parser(
        "migrate",
        help="copy every row into an empty PostgreSQL database",
        description="Copy workspaces, agents, credentials, grants, tasks, events, push "
        "state, audit and sessions from the relay's database into an empty PostgreSQL "
        "database, in one transaction, then verify the counts. Stop the relay first.",
    )
    migrate.add_argument("--to", required=True, metavar="URL", help="postgresql://… (empty)")
    migrate.add_argument(
        "--from",
        dest="source",
        metavar="URL",
        help="source database (default: the relay's --database / config)",
    )
    for sub in (backup, migrate):
        sub.add_argument("--version", action="version", version=f"mellan {__version__}")
        # also accepted after the action; SUPPRESS so an absent one keeps the relay's value
        sub.add_argument("--config", type=Path, metavar="FILE", default=argparse.SUPPRESS,
                         help="the relay's config file (for its database)")  # fmt: skip
        sub.add_argument("--database", metavar="URL", default=argparse.SUPPRESS,
                         help="the relay's database (default: config, env, XDG path)")  # fmt: skip


def run(ns: argparse.Namespace) -> int:
    from melchior.mellan.relay.server import settings

    try:
        resolved = settings.resolve(ns, os.environ)
    except settings.SettingsError as exc:
        print(f"mellan relay: {exc}", file=sys.stderr)
        return 2
    action = getattr(ns, "action", None)
    if action == "backup":
        return _backup(resolved["database"], ns.path)
    if action == "migrate":
        return _migrate(ns.source or resolved["database"], ns.to)
    if ns.print_config:
        print(settings.print_config(resolved, as_json=bool(resolved["json"])))
        return 0

    from melchior.mellan.relay.server.serve import RelayOptions, serve
    from melchior.policy.send_limits import Limits

    return serve(
        RelayOptions(
            database=resolved["database"],
            host=resolved["host"],
            port=resolved["port"],
            grpc_port=resolved["grpc_port"],
            public_url=resolved["public_url"],
            owner_token_file=resolved["owner_token_file"],
            mint_owner_token=resolved["mint_owner_token"],
            max_body=resolved["max_body"],
            max_result=resolved["max_result"],
            body_deadline=resolved["body_timeout"],
            json=resolved["json"],
            retain_days=resolved["retain_days"],
            tls_cert=resolved["tls.cert"],
            tls_key=resolved["tls.key"],
            client_ca=resolved["tls.client_ca"],
            insecure_http=resolved["insecure_http"],
            log_format=resolved["log_format"],
            metrics_token_file=resolved["metrics.token_file"],
            metrics_cache_seconds=resolved["metrics.cache_seconds"],
            gc_threshold=resolved["gc_threshold"],
            limits=Limits(
                resolved["limits.send_rate"],
                resolved["limits.burst"],
                resolved["limits.max_unfinished_per_receiver"],
                resolved["limits.max_queued"],
            ),
        )
    )


def _backup(database: str | None, target: Path) -> int:
    from melchior.mellan.relay.server.backup import BackupError, backup, sqlite_path

    try:
        source = sqlite_path(database)
        pages = backup(source, target)
    except BackupError as exc:
        print(f"mellan relay backup: {exc}", file=sys.stderr)
        return 1
    print(f"mellan relay backup: {source} copied to {target} ({pages} pages, consistent)",
          file=sys.stderr)  # fmt: skip
    return 0


def _migrate(source: str | None, target: str) -> int:
    from melchior.mellan.relay.store.dburl import redact
    from melchior.mellan.relay.store.transfer import MigrateError, migrate

    try:
        counts = migrate(source, target)
    except MigrateError as exc:
        print(f"mellan relay migrate: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a database error mid-copy: the transaction rolled back
        print(f"mellan relay migrate: failed, nothing was committed: {exc}", file=sys.stderr)
        return 1
    total = sum(counts.values())
    print(f"mellan relay migrate: {total} rows copied from {redact(source)} to {redact(target)}")
    return 0
