"""Print the plain-Lua client library: framing, JSON, discovery and the socket verbs.

Load it in a Lua host as ``local melchior = load(src)(host.stream)``; the file's
header states the one function the host must provide. With --output FILE the
library is written there atomically, for redirecting into a config directory."""

from __future__ import annotations

import argparse
import sys
from importlib.resources import files
from pathlib import Path


def source() -> bytes:
    """The client's bytes, exactly as shipped: siblings copy it, so we never rewrite it."""
    return files("melchior").joinpath("lua/client.lua").read_bytes()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output",
        metavar="FILE",
        help="write the library to FILE (atomically) instead of standard output",
    )


def _write_atomically(path: Path, data: bytes) -> None:
    # A Lua host that loads the file while we write it must see the old one or the new
    # one, never half. The library is no secret: readable like any installed file.
    from melchior.files import atomic_write

    atomic_write(path, data, mode=0o644)


def run(ns: argparse.Namespace) -> int:
    data = source()
    if ns.output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    path = Path(ns.output)
    if path.is_dir():
        print(f"lua-api: {path} is a directory; name the file to write", file=sys.stderr)
        return 2
    if not path.parent.is_dir():
        print(f"lua-api: directory {path.parent} does not exist", file=sys.stderr)
        return 2
    try:
        _write_atomically(path, data)
    except OSError as exc:
        print(f"lua-api: cannot write {path}: {exc.strerror}", file=sys.stderr)
        return 2
    return 0
