"""Mint a name and a secret for a session this one is about to start.

Prints one JSON object: project, role, id, parent, token, and the environment
(MAGI_MELCHIOR_PROJECT/ID/PARENT/TOKEN) to start the child with. melchior names; the
harness spawns. Only the session that minted the token can end the child."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--role",
        choices=("sub", "main"),
        default="sub",
        help="sub (default): private to this instance; main: a new instance's front door",
    )
    parser.add_argument(
        "--parent",
        metavar="ID",
        help="the parent session (default: $MAGI_MELCHIOR_ID, the session running this)",
    )


def run(ns: argparse.Namespace) -> int:
    import secrets

    from melchior import names
    from melchior.session.identity import IdentityError
    from melchior.session.registry import Minted, Registry
    from melchior.wire import argv
    from melchior.wire.calls import refused

    try:
        project = names.project_from(os.environ, Path.cwd())
        parent = ns.parent or os.environ.get(names.ENV_ID) or None
        if parent is None:
            raise IdentityError(
                f"who is the parent? run fork as a session ({names.ENV_ID} set) or pass --parent"
            )
        names.check_id(parent)
        reg = Registry.open(project)
        if not reg.is_listed(parent):
            raise IdentityError(f"no session {parent} is listening in project {project!r}")
        child = names.mint_id(reg.dir)
        token = secrets.token_urlsafe(32)
        reg.record_minted(Minted(child, parent, ns.role, token))
    except (names.NamingError, IdentityError, OSError) as exc:
        argv.emit(refused(f"melchior fork: {exc}", code="refused"))
        print(f"melchior fork: {exc}", file=sys.stderr)
        return 1
    argv.emit(
        {
            "project": project,
            "role": ns.role,
            "id": child,
            "parent": parent,
            "token": token,
            "environment": {
                names.ENV_PROJECT: project,
                names.ENV_ID: child,
                names.ENV_PARENT: parent,
                names.ENV_TOKEN: token,
            },
        }
    )
    return 0
