"""Where the test suite's CPU goes, by the kind of Python process that spent it.

Usage: ``.venv/bin/python bench/suite_cpu.py [-- COMMAND ...]`` (default ``make test``).

The suite starts two thousand Python processes or so — relays, receivers, ``mellan``
commands, MCP bridges, plane agents — besides its pytest workers, and on a 2-core machine
its wall time follows its CPU. To see which kind costs what, this installs a ``.pth``
hook in the venv for the length of the run: every Python process started with
``$SUITE_CPU_DIR`` set records its command line when it starts and its own CPU (user +
system) when it exits normally. The hook is removed afterwards, whatever happened. A
process killed with SIGKILL records no CPU (counted as "unended"); the database server's
CPU is not counted at all.

Prints one row per kind (pytest workers, ``mellan relay``, ``mellan agent add``, ...):
processes, CPU seconds, CPU per process. Compare two checkouts by running it on each in
the same session (docs/benchmarks.md, "The test suite's wall time").
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HOOK = """\
import os
_dir = os.environ.get("SUITE_CPU_DIR")
if _dir:
    import atexit

    def _record_start():
        try:
            with open("/proc/self/cmdline", "rb") as f:
                cmd = f.read().split(b"\\0")
            with open(os.path.join(_dir, "%d.start" % os.getpid()), "wb") as f:
                f.write(b" ".join(cmd[:5]))
        except OSError:
            pass

    def _record_end():
        try:
            t = os.times()
            with open(os.path.join(_dir, "%d.end" % os.getpid()), "w") as f:
                f.write("%.3f" % (t.user + t.system))
        except OSError:
            pass

    _record_start()
    atexit.register(_record_end)
"""


def kind(cmd: str) -> str:
    """A process's kind from its first five arguments: the pytest workers, a ``mellan``
    subcommand, a ``python -m`` module and its first argument, or a script's name."""
    parts = cmd.split(" ")
    exe = os.path.basename(parts[0])
    rest = [p for p in parts[1:] if not p.startswith("-")]
    if not exe.startswith("python"):
        return exe
    if parts[1:2] == ["-c"]:
        return "pytest worker" if "exec(eval(" in cmd or "import sys" in cmd else "python -c"
    if parts[1:2] == ["-m"]:
        return "python -m " + " ".join(parts[2:4])
    if rest and os.path.basename(rest[0]) == "mellan":
        words = [w for w in rest[1:3] if "/" not in w and ":" not in w and not w.isdigit()]
        return "mellan " + " ".join(words)
    return "python " + (os.path.basename(rest[0]) if rest else "")


def report(where: Path) -> None:
    started: dict[str, str] = {}
    spent: dict[str, float] = {}
    for path in where.iterdir():
        pid, _, what = path.name.partition(".")
        text = path.read_bytes().decode(errors="replace")
        if what == "start":
            started[pid] = text
        else:
            spent[pid] = float(text)
    count: collections.Counter[str] = collections.Counter()
    cpu: dict[str, float] = collections.defaultdict(float)
    unended: collections.Counter[str] = collections.Counter()
    for pid, cmd in started.items():
        k = kind(cmd)
        count[k] += 1
        if pid in spent:
            cpu[k] += spent[pid]
        else:
            unended[k] += 1
    total = sum(cpu.values())
    print(f"{sum(count.values())} Python processes, {total:.0f} s of CPU among those that exited")
    print(f"{'processes':>9} {'CPU s':>8} {'per process':>11} {'unended':>7}  kind")
    for k in sorted(count, key=lambda k: -cpu[k])[:30]:
        ended = count[k] - unended[k]
        per = cpu[k] / ended if ended else 0.0
        print(f"{count[k]:9d} {cpu[k]:8.1f} {per:11.3f} {unended[k]:7d}  {k}")


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1 :] if "--" in argv else ["make", "test"]
    site = Path(sysconfig.get_paths()["purelib"])
    hook = site / "zz_melchior_suite_cpu.pth"
    module = site / "_melchior_suite_cpu.py"
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as where:
        module.write_text(HOOK)
        hook.write_text("import _melchior_suite_cpu\n")
        try:
            done = subprocess.run(command, env={**os.environ, "SUITE_CPU_DIR": where}, check=False)
        finally:
            hook.unlink(missing_ok=True)
            module.unlink(missing_ok=True)
        report(Path(where))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
