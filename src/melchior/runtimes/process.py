"""The one place a runtime runs a program: its own process group, bounded reading, and a
stop that leaves nothing behind.

Why each rule:

* **Own process group** (``start_new_session=True``). A coding agent starts shells, test
  runners and servers; killing only the agent would orphan them, still editing files and
  holding ports. Signals go to the whole group.
* **Stop = SIGTERM, a grace period, then SIGKILL**, then wait. SIGTERM lets Claude Code
  and Codex end their session files cleanly; SIGKILL is for whatever ignores it.
* **Leftovers are stopped when the program exits**, too: a background process the agent
  forgot is still the agent's work, and it would otherwise hold our pipes open.
* **It dies with us**: the program's whole group gets SIGKILL when the process that
  started it dies, even by SIGKILL (:mod:`melchior.runtimes.guard`, one small process
  per runner that holds the list). A receiver killed mid-task must not leave its agent
  working on: the task is claimed again after the lease, and a second run on the same
  session would overlap the orphan. (Not a ``PR_SET_PDEATHSIG`` in each child: the
  ``preexec_fn`` it needs makes every start a full ``fork()``, several times the cost
  of the ``vfork()`` Python uses without one.)
* **Bounded reading.** stdout is read line by line and a line longer than the cap is an
  error (the program is stopped), never an unbounded buffer; stderr keeps only its tail,
  which is what a failure reason needs.
* **Structured concurrency.** The readers, the stdin writer and the exit watch are tasks
  of one :class:`asyncio.TaskGroup`, so none outlives the call.

Liveness of a group is read from ``/proc`` on Linux, ignoring zombies: where PID 1 does
not reap orphans (some containers), a dead grandchild stays a zombie in the group
forever and ``killpg(pgid, 0)`` would keep saying "alive".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from melchior.policy import route_options as ro
from melchior.runtimes import guard
from melchior.runtimes.base import RuntimeConfigError
from melchior.runtimes.options import OptionReader

_PR_SET_PDEATHSIG = 1


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGKILL the child when its parent dies; None
    where there is no ``prctl``. libc is looked up here, before any fork: the child only
    makes one call."""
    import sys

    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the request was made
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


DEFAULT_GRACE = 5.0
DEFAULT_LINE_LIMIT = 8 * 1024 * 1024
DEFAULT_STDERR_TAIL = 8 * 1024

PROCESS_OPTIONS = ("grace", "timeout", "line_limit", "stderr_tail", "env")
"""Options every program-running adapter takes (see :func:`read_limits`)."""

PROCESS_RULES: dict[str, ro.RouteOption] = {
    "grace": ro.limit(DEFAULT_GRACE),
    "timeout": ro.limit(),
    "line_limit": ro.limit(DEFAULT_LINE_LIMIT),
    "stderr_tail": ro.free(),
    "env": ro.ENV_OPTION,
}
"""What a relay route may do with each of them (:mod:`melchior.policy.route_options`)."""

_POLL = 0.02
_READ_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Limits:
    """How long and how much: the grace between SIGTERM and SIGKILL, an optional deadline
    for the whole run, the longest stdout line, and how much of stderr to keep."""

    grace: float = DEFAULT_GRACE
    timeout: float | None = None
    line_limit: int = DEFAULT_LINE_LIMIT
    stderr_tail: int = DEFAULT_STDERR_TAIL


def read_limits(r: OptionReader) -> Limits:
    return Limits(
        grace=r.number("grace", DEFAULT_GRACE, low=0.0, high=600.0),
        timeout=r.opt_number("timeout", low=0.001, high=7 * 24 * 3600.0),
        line_limit=r.integer("line_limit", DEFAULT_LINE_LIMIT, low=1024, high=1 << 30),
        stderr_tail=r.integer("stderr_tail", DEFAULT_STDERR_TAIL, low=0, high=1 << 20),
    )


class SpawnError(Exception):
    """The program could not be started at all (not found, not executable, bad cwd)."""


class LineTooLong(Exception):
    """A line of stdout was longer than the cap; the program was stopped."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a line of output was longer than the limit of {limit} bytes")
        self.limit = limit


@dataclass(frozen=True)
class Exit:
    """How the program ended: its return code (negative = killed by that signal), the
    tail of its stderr, and whether our deadline stopped it."""

    returncode: int
    stderr: str
    pid: int
    timed_out: bool = False

    @property
    def signal(self) -> int | None:
        """The signal that ended it, counting a shell-style ``128 + n`` exit as ``n``."""
        if self.returncode < 0:
            return -self.returncode
        if self.returncode in (128 + signal.SIGTERM, 128 + signal.SIGINT, 128 + signal.SIGKILL):
            return self.returncode - 128
        return None

    def describe(self) -> str:
        sig = self.signal
        if self.returncode < 0 and sig is not None:
            return f"was killed by {signal.Signals(sig).name}"
        if sig is not None:
            return f"exited with status {self.returncode} ({signal.Signals(sig).name})"
        return f"exited with status {self.returncode}"

    def with_stderr(self, sentence: str) -> str:
        """``sentence`` followed by the stderr tail, for a failure reason."""
        tail = self.stderr.strip()
        return f"{sentence}; stderr: {tail}" if tail else sentence


# -- process groups -------------------------------------------------------------------------------


def _group_of(pid_dir: str) -> tuple[int, str] | None:
    try:
        with open(f"/proc/{pid_dir}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses.
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 3:
        return None
    try:
        return int(fields[2]), fields[0]
    except ValueError:
        return None


def group_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` is still running (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc/self"):
        return True
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _group_of(entry)
            if found is not None and found[0] == pgid and found[1] not in ("Z", "X"):
                return True
    return False


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def stop_group(pgid: int, grace: float) -> None:
    """SIGTERM the group, wait up to ``grace`` seconds, SIGKILL what is left, and wait
    until nothing of it runs (a SIGKILLed process can take a moment to go)."""
    if not group_alive(pgid):
        return
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while group_alive(pgid):
        if time.monotonic() >= deadline:
            _signal_group(pgid, signal.SIGKILL)
            break
        await asyncio.sleep(_POLL)
    # After SIGKILL the kernel needs a moment; a process in uninterruptible sleep may
    # need longer, and waiting for it forever would hang the caller, so bound it.
    deadline = time.monotonic() + 10.0
    # No event says a process group has died: polling /proc is the only way to know.
    while group_alive(pgid) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(_POLL)


async def finish_despite_cancel(coro: Coroutine[Any, Any, None]) -> None:
    """Run cleanup to its end even if our task is cancelled again meanwhile; a repeated
    cancellation is re-raised once the cleanup is done."""
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                break
            cancelled = True
    task.result()
    if cancelled:
        raise asyncio.CancelledError


# -- running one program ---------------------------------------------------------------------------


def compose_env(*layers: Mapping[str, str], drop_prefix: str | None = None) -> dict[str, str]:
    """The program's environment: ours, then each layer on top (configuration, then the
    turn). Variables of ours starting with ``drop_prefix`` are left out, so a stale value
    inherited from the caller's own environment is never mistaken for this turn's."""
    env = {k: v for k, v in os.environ.items() if not (drop_prefix and k.startswith(drop_prefix))}
    for layer in layers:
        env.update(layer)
    return env


def check_session_id(session: str) -> str | None:
    """Why ``session`` cannot be passed to a CLI as a session id, or None if it can."""
    if session.startswith("-"):
        return f"session id {session!r} starts with '-', which a command line reads as a flag"
    if any(ord(c) < 32 or ord(c) == 127 for c in session) or len(session) > 256:
        return f"session id {session!r} is not a plausible session id"
    return None


class ProgramNotFound(ValueError):
    """A program name that resolves to no runnable file here; the message says why."""


def resolve_program(name: str, path: str | None = None) -> str:
    """The one file ``name`` runs as: an absolute path, or a bare name looked up on
    ``path`` (this process's ``PATH`` when None), with every symlink resolved.

    What a receiver judges against its allow-list and what it then executes are the same
    file: the real path this returns. A relative path with a slash is refused rather than
    resolved, since it would mean one file where it is judged and another in the working
    directory it runs in.
    """
    if not name or "\0" in name:
        raise ProgramNotFound("a program is named by non-empty text without NUL")
    if os.sep not in name:
        found = shutil.which(name, path=path if path is not None else os.environ.get("PATH"))
        if found is None:
            raise ProgramNotFound(f"no {name} on this machine's PATH")
    elif os.path.isabs(name):
        found = name
    else:
        raise ProgramNotFound(
            "a relative path names a different file in each directory; give an absolute "
            "path, or a bare name looked up on this machine's PATH"
        )
    real = os.path.realpath(found)
    if not os.path.isfile(real) or not os.access(real, os.X_OK):
        raise ProgramNotFound(f"{found} is not an executable file")
    return real


def find_program(program: str, env: Mapping[str, str]) -> str | None:
    """``program`` resolved on the PATH the program itself will see (not ours)."""
    if os.sep in program:
        return program if os.access(program, os.X_OK) and os.path.isfile(program) else None
    return shutil.which(program, path=env.get("PATH", os.defpath))


def require_program(
    program: str, env: Mapping[str, str], install: str = "", *, runtime: str = ""
) -> str:
    """``program`` found as :func:`find_program` finds it, or :class:`RuntimeConfigError`
    with the one sentence every adapter says, at start-up (``runtime`` names it there) and
    at a turn: what was looked for, on which PATH, and how to install it."""
    found = find_program(program, env)
    if found is None:
        named = f"{runtime}: " if runtime else ""
        hint = f"; {install}" if install else ""
        raise RuntimeConfigError(
            f"{named}{program} was not found (PATH={env.get('PATH', '')}){hint}"
        )
    return found


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """The stock stream protocol, plus an event for "the program itself has exited".

    ``Process.wait()`` waits until every pipe is closed as well, which a leftover
    grandchild holding stdout can delay forever; the exit event lets us stop leftovers
    first and only then wait for the pipes.
    """

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


async def _read_lines(
    reader: asyncio.StreamReader, on_line: Callable[[bytes], Awaitable[None]], limit: int
) -> None:
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                await on_line(exc.partial)
            return
        except asyncio.LimitOverrunError:
            raise LineTooLong(limit) from None
        await on_line(line)


async def _read_tail(reader: asyncio.StreamReader, keep: int, into: bytearray) -> None:
    while chunk := await reader.read(_READ_CHUNK):
        into.extend(chunk)
        if len(into) > keep:
            del into[: len(into) - keep]


async def _feed(writer: asyncio.StreamWriter, data: bytes) -> None:
    # A program may exit without reading its input; that is its business, not an error.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        writer.write(data)
        await writer.drain()
    writer.close()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        await writer.wait_closed()


def _first(exc: BaseException) -> BaseException:
    """The one exception inside a task group's exception group, else the group itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    on_line: Callable[[bytes], Awaitable[None]],
    stdin: bytes | None = None,
    limits: Limits = Limits(),
    on_start: Callable[[int], Awaitable[None]] | None = None,
) -> Exit:
    """Run ``argv`` in its own process group and return how it ended.

    Each stdout line (with its newline) goes to ``on_line`` as it arrives. ``stdin`` is
    written and closed, or stdin is /dev/null. ``on_start`` gets the pid (which is also
    the process group id) once the program runs.

    Raises :class:`SpawnError` when it cannot start, :class:`LineTooLong` when a line
    exceeds the cap, and whatever ``on_line``/``on_start`` raise; on any of those, and
    on cancellation, the whole group is stopped (TERM → grace → KILL) and waited for
    before the exception leaves. On the deadline the group is stopped the same way and
    the returned :class:`Exit` says ``timed_out``.
    """
    loop = asyncio.get_running_loop()
    try:
        transport, protocol = await loop.subprocess_exec(
            lambda: _Protocol(limits.line_limit, loop),
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=str(cwd),
            env=dict(env),
            start_new_session=True,
        )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        raise SpawnError(f"cannot start {argv[0]}: {exc}") from None
    pgid = transport.get_pid()
    guard.watch(pgid)  # first, before anything else can be awaited
    proc = asyncio.subprocess.Process(transport, protocol, loop)
    err_tail = bytearray()
    deadline = asyncio.timeout(limits.timeout)

    async def supervise() -> None:
        assert proc.stdout is not None
        assert proc.stderr is not None
        async with asyncio.TaskGroup() as tg:
            readers = [
                tg.create_task(_read_lines(proc.stdout, on_line, limits.line_limit)),
                tg.create_task(_read_tail(proc.stderr, limits.stderr_tail, err_tail)),
            ]
            if stdin is not None:
                assert proc.stdin is not None
                tg.create_task(_feed(proc.stdin, stdin))
            if on_start is not None:
                await on_start(pgid)
            await protocol.exited.wait()
            await stop_group(pgid, limits.grace)
            # Every process of the group is gone, so the pipes close, unless something
            # that left the group (setsid) holds them; don't wait on that forever.
            _, pending = await asyncio.wait(readers, timeout=max(limits.grace, 0.5))
            if pending:
                transport.close()

    async def shutdown() -> None:
        await stop_group(pgid, limits.grace)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(limits.grace, 1.0)):
                await protocol.exited.wait()

    try:
        try:
            async with deadline:
                await supervise()
        except BaseException as exc:
            await finish_despite_cancel(shutdown())
            if isinstance(exc, TimeoutError) and deadline.expired():
                return Exit(_returncode(transport), _decode(err_tail), pgid, timed_out=True)
            inner = _first(exc)
            if inner is not exc and not isinstance(inner, asyncio.CancelledError):
                raise inner from None
            raise
        return Exit(_returncode(transport), _decode(err_tail), pgid)
    finally:
        transport.close()
        guard.release(pgid)


def _returncode(transport: asyncio.SubprocessTransport) -> int:
    rc = transport.get_returncode()
    return -signal.SIGKILL if rc is None else rc


def _decode(data: bytearray) -> str:
    return bytes(data).decode("utf-8", "replace")
