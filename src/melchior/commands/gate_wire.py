"""Check wire messages: every message must be a call, a reply or an event, and the
only tag key is 'event'. Reads newline-delimited JSON from FILEs (or '-' for stdin),
or captures of length-prefixed frames with --frames. Exits 1 and prints one line per
offence (source:line: key: reason) when anything is refused; 0 when all is clean."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files",
        nargs="*",
        default=["-"],
        metavar="FILE",
        help="NDJSON files to check ('-' or nothing: standard input)",
    )
    parser.add_argument(
        "--frames", action="store_true", help="inputs are captures of 4-byte-length-prefixed frames"
    )
    parser.add_argument("--json", action="store_true", help="print offences as one JSON object")


def run(ns: argparse.Namespace) -> int:
    from melchior.wire.gate import scan_frames, scan_lines

    offences = []
    for name in ns.files:
        if name == "-":
            data, source = sys.stdin.buffer.read(), "<stdin>"
        else:
            try:
                data, source = Path(name).read_bytes(), name
            except OSError as exc:
                print(f"gate-wire: cannot read {name}: {exc.strerror}", file=sys.stderr)
                return 2
        offences.extend(scan_frames(source, data) if ns.frames else scan_lines(source, data))
    if ns.json:
        print(
            json.dumps(
                {
                    "ok": not offences,
                    "offences": [
                        {"source": o.source, "line": o.line, "key": o.key, "reason": o.reason}
                        for o in offences
                    ],
                }
            )
        )
    else:
        for o in offences:
            print(o)
    return 1 if offences else 0
