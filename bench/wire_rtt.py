"""Round trip of a small call over the socket transport, against a raw echo baseline.

    .venv/bin/python bench/wire_rtt.py [--n 4000] [--rounds 3]

Three peers, each in its own process, one blocking Python client:

- echo:              a raw length-prefixed echo server (the baseline: no JSON, no rules);
- answer (raw):      melchior.wire.server (the Answerer protocol every session socket
                     uses) serving a status call, answered at once as serve answers
                     status; client sends pre-encoded bytes and reads the reply frame
                     without decoding it;
- answer (frames):   the same server, client using melchior.wire.frames.send/recv
                     (encode the call, decode and check the reply): what a caller pays.

Prints p50/p99/mean per round trip and each p50 as a ratio of the echo baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
from melchior.wire import frames
from melchior.wire.calls import call, unwrap


def serve_answer(path: str) -> None:
    """A peer answering with every socket rule (melchior.wire.server) and a trivial handler."""
    from melchior.wire.server import Answerer

    def now(verb: str, args: list[Any], msg: dict[str, Any]) -> list[Any]:
        return [{"busy": False, "working_for": None, "waiting": 0}]

    async def on_call(verb: str, args: list[Any], msg: dict[str, Any]) -> list[Any]:
        return now(verb, args, msg)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(lambda: Answerer(on_call, now=now), path=path)
        print("ready", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4000, help="round trips per case per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve-answer", metavar="PATH", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.serve_answer:
        serve_answer(ns.serve_answer)
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="mb-", dir="/tmp"))
    echo_path, answer_path = tmp / "echo", tmp / "answer"
    echo = _common.spawn_echo(echo_path)
    server, _ = _common.spawn([sys.executable, __file__, "--serve-answer", str(answer_path)])
    try:
        msg = call("status", [], id="1")
        data = frames.pack(msg)

        def connect(path: Path) -> socket.socket:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(path))
            return s

        e, a, f = connect(echo_path), connect(answer_path), connect(answer_path)

        def raw(sock: socket.socket) -> Any:
            def once() -> bytes:
                sock.sendall(data)
                (n,) = _common.HEADER.unpack(_common.recv_exact(sock, 4))
                return _common.recv_exact(sock, n)

            return once

        def framed() -> list[Any]:
            frames.send(f, msg)
            reply = frames.recv(f)
            assert reply is not None
            return unwrap(reply)

        assert framed() == [{"busy": False, "working_for": None, "waiting": 0}]
        print(f"wire_rtt: {_common.machine()}")
        print(f"  {ns.rounds} rounds x {ns.n} round trips per case, call = {data[4:].decode()}")
        timings = _common.interleave(
            {
                "echo (baseline)": raw(e),
                "answer (raw client)": raw(a),
                "answer (frames client)": framed,
            },
            ns.n,
            ns.rounds,
            warmup=500,
        )
        _common.report(timings, "echo (baseline)")
        for s in (e, a, f):
            s.close()
    finally:
        _common.stop(echo)
        _common.stop(server)
        for p in (echo_path, answer_path):
            p.unlink(missing_ok=True)
        tmp.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
