"""The guard: the programs a runner starts die with it, without slowing every start.

Why not ``PR_SET_PDEATHSIG`` in each program: the request has to be made in the child,
between fork and exec, and any ``preexec_fn`` makes Python ``fork()`` the whole runner
instead of ``vfork()``-ing it — measured under a receiver, 6.7–8 ms to run ``true``
against 1.4 ms without one (docs/benchmarks.md, issue 25). So each runner process has
one small *guard* process, started with its first program: the runner writes it a line
for each process group it starts (``+pgid``) and for each one it has stopped
(``-pgid``). When the runner dies, by SIGKILL too, the kernel closes the pipe; the guard
reads end-of-file and SIGKILLs every group still on its list — the whole group, where
the parent-death signal reached only the program itself and left what it started.

The window: a runner killed between starting a program and writing its line (inside
one call of :func:`melchior.runtimes.process.run_process`, well under a millisecond)
leaves that program to finish on its own. The guard is in a session of its own, so a
Ctrl-C at the runner's terminal or a signal to the runner's group does not end it
first; it never outlives the runner, whose pipe is its only input.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

_CODE = """
import os, signal
groups, pending = set(), b""
while chunk := os.read(0, 65536):
    *lines, pending = (pending + chunk).split(b"\\n")
    for line in lines:
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""


class _Guard:
    """This process's guard and the groups it was told of (kept here too, so a guard
    that died is replaced with the same list)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = 0
        self._groups: set[int] = set()

    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert proc.stdin is not None
        self._proc, self._owner = proc, os.getpid()
        if self._groups:
            self._send("".join(f"+{g}\n" for g in sorted(self._groups)))
        return proc

    def _send(self, text: str) -> None:
        assert self._proc is not None
        assert self._proc.stdin is not None
        os.write(self._proc.stdin.fileno(), text.encode("ascii"))

    def _tell(self, text: str) -> None:
        with self._lock:
            if self._proc is None or self._owner != os.getpid():  # first, or after a fork
                self._start()
            try:
                self._send(text)
            except OSError:  # the guard was killed: a new one, told every live group
                self._start()

    def watch(self, pgid: int) -> None:
        """SIGKILL group ``pgid`` if this process dies before :meth:`release`."""
        with self._lock:
            if self._owner and self._owner != os.getpid():
                self._groups.clear()  # a forked child's groups are its parent's to guard
            self._groups.add(pgid)
        self._tell(f"+{pgid}\n")

    def release(self, pgid: int) -> None:
        """Group ``pgid`` was stopped: nothing to do for it any more."""
        with self._lock:
            if pgid not in self._groups:
                return
            self._groups.discard(pgid)
        self._tell(f"-{pgid}\n")

    def pid(self) -> int | None:
        """The guard's pid (None before the first program): for tests."""
        return self._proc.pid if self._proc is not None else None


GUARD = _Guard()
watch = GUARD.watch
release = GUARD.release
