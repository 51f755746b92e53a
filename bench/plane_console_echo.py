"""How long a keystroke takes to echo at the plane console after a big output.

A plane of one command agent that prints ``--lines`` numbered lines (the default is
about 4 MiB, just under the command runtime's cap) runs under ``melchior plane run``
in tmux (200x50). Once the output's tail is on the screen, one key at a time is typed
and the screen polled until it shows; the time from send-keys to the echo is printed
(median and max of ``--keys`` keys), with the console's resident memory before and
after. Numbers, not a threshold: they go to docs/benchmarks.md.

    .venv/bin/python bench/plane_console_echo.py [--lines 85000] [--keys 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MELCHIOR = str(Path(sys.executable).with_name("melchior"))
AGENT = (
    "import sys\n"
    "sys.stdin.read()\n"
    "n = int(sys.argv[1])\n"
    "sys.stdout.write(''.join(f'output line {i} ' + '.' * 30 + '\\n' for i in range(1, n + 1)))\n"
)


def tmux(sock: str, *args: str) -> str:
    return subprocess.run(
        ["tmux", "-L", sock, *args], capture_output=True, text=True, check=True
    ).stdout


def rss_mb(sock: str) -> float:
    pane_pid = tmux(sock, "display-message", "-p", "-t", "plane", "#{pane_pid}").strip()
    out = subprocess.run(  # env execs melchior: the pane's process is the console
        ["ps", "-o", "pid=,rss=,args=", "-p", pane_pid], capture_output=True, text=True
    ).stdout
    for line in out.splitlines():
        if "plane run" in line:
            return int(line.split()[1]) / 1024
    return float("nan")


def wait(sock: str, needle: str, timeout: float = 120.0) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if needle in tmux(sock, "capture-pane", "-p", "-t", "plane"):
            return time.perf_counter() - start
        time.sleep(0.002)
    screen = tmux(sock, "capture-pane", "-p", "-t", "plane")
    raise SystemExit(f"never saw {needle!r}; the screen:\n{screen}")


def echo(sock: str, keys: int, typed: str) -> list[float]:
    """Type ``keys`` keys one at a time; for each, ms from send-keys to its echo."""
    times = []
    for i in range(keys):
        key = "qwertyuiopasdfghjklzxcvbnm"[i % 26]
        typed += key
        start = time.perf_counter()
        tmux(sock, "send-keys", "-t", "plane", "-l", key)
        wait(sock, typed)
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=85000)
    parser.add_argument("--keys", type=int, default=20)
    ns = parser.parse_args()
    if shutil.which("tmux") is None:
        raise SystemExit("tmux is needed")
    root = Path(tempfile.mkdtemp(prefix="plane-echo-"))
    (root / "agent.py").write_text(AGENT, encoding="utf-8")
    argv = [sys.executable, str(root / "agent.py"), str(ns.lines)]
    (root / "PLANE.toml").write_text(
        '[[agents]]\nid = "planner"\nruntime = "command"\n'
        f"options = {{ argv = {json.dumps(argv)} }}\n",
        encoding="utf-8",
    )
    sock = f"plane-echo-{os.getpid()}"
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    tmux(
        sock,
        "new-session",
        "-d",
        "-s",
        "plane",
        "-x",
        "200",
        "-y",
        "50",
        f"env -u COLUMNS -u LINES PATH={path} {MELCHIOR} plane run {root}/PLANE.toml",
    )
    try:
        wait(sock, "planner · idle")
        before = rss_mb(sock)
        idle = echo(sock, ns.keys, "")
        tmux(sock, "send-keys", "-t", "plane", "C-u")  # empty the prompt again
        tmux(sock, "send-keys", "-t", "plane", "-l", "go")
        tmux(sock, "send-keys", "-t", "plane", "Enter")
        drawn = wait(sock, f"output line {ns.lines} ")
        after = rss_mb(sock)
        times = echo(sock, ns.keys, "")
        size = ns.lines * (len("output line  ") + 30 + 1) + sum(
            len(str(i)) for i in range(1, ns.lines + 1)
        )
        print(
            f"output: {ns.lines} lines, {size / 1048576:.2f} MiB; drawn {drawn:.2f} s after Enter"
        )
        print(
            f"echo before the output (tmux's own cost): median {statistics.median(idle):.1f} ms, "
            f"max {max(idle):.1f} ms"
        )
        print(
            f"echo over {ns.keys} keys: median {statistics.median(times):.1f} ms, "
            f"max {max(times):.1f} ms (includes tmux send-keys and capture-pane polling)"
        )
        print(f"console RSS: {before:.0f} MB before, {after:.0f} MB after the output")
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
