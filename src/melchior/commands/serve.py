"""Bind this session's socket and answer for it, for as long as stdin stays open.

Run by a harness as its child with pipes on stdin and stdout. Without MAGI_MELCHIOR_*
in the environment the session is a root main with a fresh id; with the environment
'melchior fork' printed it comes up as that child. Prints {"event":"listening","at":…}
once bound, reads {"event":"doing",…} lines, forwards messages as {"event":"message",…},
and removes its socket and exits when stdin closes."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options: everything comes from the environment the harness set


def run(ns: argparse.Namespace) -> int:
    import asyncio

    from melchior.names import NamingError
    from melchior.session import serve
    from melchior.session.config import ConfigError, read_talk
    from melchior.session.identity import IdentityError, for_serve

    try:
        me, reg = for_serve(os.environ, Path.cwd())
        talk = read_talk(me.project)
    except (NamingError, IdentityError, ConfigError) as exc:
        print(f"melchior serve: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(serve.run(me, reg, talk))
