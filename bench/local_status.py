"""The local layer's costs, each against a baseline measured in the same run.

    .venv/bin/python bench/local_status.py [--n 2000] [--execs 10] [--sessions 1000]

1. status round trip over a live `melchior serve` session's socket (persistent
   connection, melchior.wire.frames client; and the Lua client under lupa), against
   the raw length-prefixed echo baseline driven by the same client;
2. `melchior tool --verb=status` as a whole process, against `python -c pass` on the
   same interpreter (start-up is a product feature: the tool is exec'd per request);
3. `melchior tool --verb=who` with 1,000 live sessions in one project, against `who`
   in a project holding only the caller. The 1,000 sessions run the real serve code
   (melchior.session.serve.Serve: real sockets published by rename, real notes, each
   answering its own socket) hosted in one process, because 1,000 Python processes do
   not fit on a 2-core machine; `who` reads the directory and notes and probes each
   reachable socket with one connect, which those sessions answer exactly as 1,000
   serve processes would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
from melchior.wire import frames
from melchior.wire.calls import call, unwrap

PROJECT = "demo"


def host_sessions(n: int) -> None:
    """Publish ``n`` sessions with the real serve code: a tree of mains with 4 subs each."""
    from melchior import names
    from melchior.session.identity import Identity
    from melchior.session.registry import Registry
    from melchior.session.serve import Output, Serve

    async def main() -> None:
        reg = Registry.open(os.environ["MAGI_MELCHIOR_PROJECT"])
        out = Output(None)
        serves: list[Serve] = []
        mains: list[str] = []
        for i in range(n):
            sid = names.mint_id(reg.dir)
            me = (
                Identity(reg.project, sid, "main", None, None)
                if i % 5 == 0
                else Identity(reg.project, sid, "sub", mains[-1], None)
            )
            s = Serve(me, reg, "instance", out)
            await s.publish()
            if me.role == "main":
                mains.append(sid)
            serves.append(s)
        print(json.dumps({"ready": n, "caller": mains[0]}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        for s in serves:
            s.unpublish()

    asyncio.run(main())


class HostStream:
    """host.stream for the Lua client: a blocking unix socket."""

    def __init__(self, path: bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)

    def read(self, n: int) -> bytes:
        return self.sock.recv(n)

    def write(self, data: bytes) -> bool:
        self.sock.sendall(data)
        return True

    def close(self) -> None:
        self.sock.close()


def lua_status(path: Path) -> Any:
    """A Lua client's handle on ``path``, or None when lupa is not installed."""
    try:
        import lupa.lua54 as lua54
    except ImportError:
        return None
    from melchior.commands.lua_api import source

    rt = lua54.LuaRuntime(encoding=None)
    m = rt.execute(source(), HostStream, None)
    return rt.execute(
        b"local m, path = ...; m.configure{getenv = function() return nil end}"
        b"; return m.connect(path)",
        m,
        str(path).encode(),
    )


def exec_times(cases: dict[str, tuple[list[str], dict[str, str]]], n: int) -> dict[str, Any]:
    """Whole-process wall time per case, cases interleaved so load drift hits all alike."""
    got: dict[str, list[float]] = {name: [] for name in cases}
    for cmd, env in cases.values():  # warm-up: bytecode written, page cache filled
        subprocess.run(cmd, env=env, capture_output=True)
    for _ in range(n):
        for name, (cmd, env) in cases.items():
            t0 = time.perf_counter_ns()
            done = subprocess.run(cmd, env=env, capture_output=True)
            got[name].append((time.perf_counter_ns() - t0) / 1e6)
            if done.returncode != 0:
                why = f"{done.stdout!r} {done.stderr!r}"
                raise SystemExit(f"{cmd} failed ({done.returncode}): {why}")
    return {name: _common.Timing(name, t) for name, t in got.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="round trips per case per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--execs", type=int, default=10, help="process runs per case")
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--host-sessions", type=int, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.host_sessions:
        host_sessions(ns.host_sessions)
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="mb-", dir="/tmp"))
    tmp.chmod(0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAGI_MELCHIOR_")}
    # An installed melchior has its bytecode compiled (pip does it); a shell that sets
    # PYTHONDONTWRITEBYTECODE would make every exec compile the sources again (~40 ms
    # here) and measure that instead. Bytecode goes to a private prefix, warmed below.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    env.update(
        XDG_RUNTIME_DIR=str(tmp),
        XDG_CONFIG_HOME=str(tmp / "config"),
        MAGI_MELCHIOR_PROJECT=PROJECT,
    )
    bindir = Path(sys.executable).parent
    melchior = (
        [str(bindir / "melchior")]
        if (bindir / "melchior").exists()
        else [
            sys.executable,
            "-m",
            "melchior.cli",
        ]
    )
    procs: list[subprocess.Popen[bytes]] = []
    echo: subprocess.Popen[bytes] | None = None
    print(f"local_status: {_common.machine()}")
    try:
        echo = _common.spawn_echo(tmp / "echo")
        procs.append(echo)
        serve, line = _common.spawn([*melchior, "serve"], env)
        procs.append(serve)
        listening = json.loads(line)
        at, sid = Path(listening["at"]), listening["at"].rsplit("/", 1)[1]

        # 1. status round trip -------------------------------------------------------------
        msg = call("status", [])
        conns = {}
        for name, path in (("echo", tmp / "echo"), ("serve", at)):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(path))
            conns[name] = s

        def roundtrip(sock: socket.socket) -> Any:
            def once() -> Any:
                frames.send(sock, msg)
                return frames.recv(sock)

            return once

        status = unwrap(roundtrip(conns["serve"])() or {})
        assert status[0]["id"] == sid, status
        cases = {
            "echo, frames client (baseline)": roundtrip(conns["echo"]),
            "serve status, frames client": roundtrip(conns["serve"]),
        }
        lua = lua_status(at)
        if lua is not None:
            cases["serve status, Lua client (lupa 5.4)"] = lua.status
        print(f"\n1. status round trip, {ns.rounds} rounds x {ns.n} per case")
        timings = _common.interleave(cases, ns.n, ns.rounds, warmup=300)
        _common.report(timings, "echo, frames client (baseline)")
        for s in conns.values():
            s.close()
        if lua is not None:
            lua.close()

        # 2. tool --verb=status as a process ------------------------------------------------
        tool_env = dict(env, MAGI_MELCHIOR_ID=sid)
        execs = exec_times(
            {
                "python -c pass (baseline)": ([sys.executable, "-c", "pass"], tool_env),
                "melchior tool --verb=status": ([*melchior, "tool", "--verb=status"], tool_env),
            },
            ns.execs,
        )
        print(f"\n2. whole-process time, {ns.execs} runs each, interleaved")
        _common.report(execs, "python -c pass (baseline)", unit="ms")

        # 3. who with many live sessions ----------------------------------------------------
        many_env = dict(env, MAGI_MELCHIOR_PROJECT="many")
        t0 = time.perf_counter()
        host, line = _common.spawn(
            [sys.executable, __file__, "--host-sessions", str(ns.sessions)], many_env
        )
        procs.append(host)
        up = time.perf_counter() - t0
        caller = json.loads(line)["caller"]
        listed = [p for p in os.listdir(tmp / "melchior" / "many") if "." not in p]
        who = [*melchior, "tool", "--verb=who"]
        as_many, as_solo = dict(many_env, MAGI_MELCHIOR_ID=caller), dict(env, MAGI_MELCHIOR_ID=sid)
        reach = json.loads(subprocess.run(who, env=as_many, capture_output=True).stdout)
        solo = json.loads(subprocess.run(who, env=as_solo, capture_output=True).stdout)
        whos = exec_times(
            {
                "who, 1 session (baseline)": (who, as_solo),
                f"who, {len(listed)} sessions": (who, as_many),
            },
            ns.execs,
        )
        print(
            f"\n3. who: {len(listed)} live sessions in one project ({ns.sessions // 5} mains "
            "x 4 subs each; "
            f"published in {up:.1f}s); caller reaches n={reach['n']} of them; "
            f"solo project reaches n={solo['n']}"
        )
        _common.report(whos, "who, 1 session (baseline)", unit="ms")
    finally:
        for p in procs:
            _common.stop(p, graceful=p is not echo)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
