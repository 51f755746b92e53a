"""Which release of a coding agent's CLI is installed, and whether its adapter can drive it.

The claude-code, codex and pi adapters build command lines for CLIs that gain flags
from one release to the next. A flag the installed release does not know fails a turn
with the CLI's own usage error, long after the receiver started, and says nothing about
which release would work (Claude Code 2.1.197 and ``--permission-prompts``, issue 24).
So each adapter declares what it supports (:class:`Support`): the oldest release it
drives, and the first release of each optional flag newer than that. The installed
release is read once, and a release outside the range is refused, when the receiver or
the plane starts, with one line that says what is needed::

    claude-code needs Claude Code >= 2.1.259 (found 2.1.197 at /usr/local/bin/claude)

Newer releases than the newest one tested are accepted: refusing them would stop every
user on the day of a release for a break that may never come, and the real-CLI tests
catch a removed flag when the pins are bumped (``make bump-clis``).

A reading is cached by the binary's resolved path, size and modification time: an
upgrade in place (npm, a package manager) changes them, so it is read again, and a
receiver running a thousand turns asks once.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version

from melchior.runtimes.base import RuntimeConfigError

__all__ = ["Since", "Support", "Version", "VersionRefused", "forget", "installed", "shape"]

VERSION_TIMEOUT = 30.0
"""Seconds ``--version`` may take (a Node CLI on a loaded machine takes a few)."""
MAX_OUTPUT = 64 * 1024
"""What is read of ``--version``'s output; the version is on its first lines."""

_VERSION = r"(?P<v>\d+\.\d+\.\d+(?:[-+.][0-9A-Za-z][0-9A-Za-z.+-]*)?)"


class VersionRefused(RuntimeConfigError):
    """The installed CLI cannot be driven: out of range, or no version could be read."""


@dataclass(frozen=True)
class Since:
    """An option whose flag is newer than the adapter's oldest release: setting ``option``
    makes the adapter pass ``flag``, which ``version`` introduced."""

    option: str
    flag: str
    version: Version


@dataclass(frozen=True)
class Support:
    """The releases of one CLI an adapter drives.

    ``oldest`` is the oldest supported release (tested on CI beside the newest), and
    ``reason`` says which flag the adapter always passes made it the floor. ``shape``
    finds the version in what ``--version`` prints (group ``v``); anything else there
    is someone else's program, and is refused as such.
    """

    adapter: str
    product: str
    oldest: Version
    reason: str
    shape: re.Pattern[str]
    since: tuple[Since, ...] = ()
    args: tuple[str, ...] = ("--version",)

    def parse(self, output: str, program: str = "the binary") -> Version:
        """The release named in ``output`` (what ``program --version`` printed)."""
        found = self.shape.search(output)
        if found is not None:
            with contextlib.suppress(InvalidVersion):
                return Version(found.group("v"))
        said = " ".join(output.split())
        said = said if len(said) <= 80 else said[:79] + "…"
        raise VersionRefused(
            f"{self.adapter}: {program} {' '.join(self.args)} printed {said!r}, which names "
            f"no {self.product} release; is {program} {self.product}?"
        )

    def refusal(self, found: Version, program: str, options: Iterable[str] = ()) -> str | None:
        """Why ``found`` cannot run with ``options`` set, in one line; None if it can."""
        if found < self.oldest:
            return (
                f"{self.adapter} needs {self.product} >= {self.oldest} (found {found} at {program})"
            )
        given = set(options)
        for need in self.since:
            if need.option in given and found < need.version:
                return (
                    f"{self.adapter} option {need.option} needs {self.product} >= "
                    f"{need.version} for {need.flag} (found {found} at {program})"
                )
        return None

    def check(
        self, program: str, options: Iterable[str] = (), env: Mapping[str, str] | None = None
    ) -> Version:
        """The installed release of ``program``, or :class:`VersionRefused` saying why it
        cannot be driven (with ``options`` set)."""
        found = installed(program, self, env)
        why = self.refusal(found, program, options)
        if why is not None:
            raise VersionRefused(why)
        return found


@dataclass
class _Cache:
    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: dict[tuple[str, int, int, str], Version] = field(default_factory=dict)


_CACHE = _Cache()


def _key(program: str, adapter: str) -> tuple[str, int, int, str] | None:
    try:
        real = os.path.realpath(program)
        st = os.stat(real)
    except OSError:
        return None
    return (real, st.st_mtime_ns, st.st_size, adapter)


def installed(program: str, support: Support, env: Mapping[str, str] | None = None) -> Version:
    """What ``program --version`` says, read once per binary (path, size, mtime)."""
    key = _key(program, support.adapter)
    if key is not None:
        with _CACHE.lock:
            hit = _CACHE.seen.get(key)
        if hit is not None:
            return hit
    found = support.parse(_ask(program, support, env), program)
    if key is not None:
        with _CACHE.lock:
            _CACHE.seen[key] = found
    return found


def _ask(program: str, support: Support, env: Mapping[str, str] | None) -> str:
    """``program --version``'s output (stdout, then stderr), bounded in time and size."""
    argv = [program, *support.args]
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(os.environ if env is None else env),
                start_new_session=True,  # so a hung one is stopped with whatever it started
            )
        except OSError as exc:
            raise VersionRefused(
                f"{support.adapter}: cannot run {program} {' '.join(support.args)}: "
                f"{exc.strerror or exc}"
            ) from None
        try:
            code = proc.wait(VERSION_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise VersionRefused(
                f"{support.adapter}: {program} {' '.join(support.args)} did not answer within "
                f"{VERSION_TIMEOUT:g} s"
            ) from None
        out.seek(0)
        text = out.read(MAX_OUTPUT).decode("utf-8", "replace")
    if code != 0:
        tail = " ".join(text.split())[-300:]
        raise VersionRefused(
            f"{support.adapter}: {program} {' '.join(support.args)} exited with status {code}"
            + (f": {tail}" if tail else "")
        )
    return text


def shape(pattern: str) -> re.Pattern[str]:
    """A :attr:`Support.shape` from ``pattern`` with ``{v}`` where the version goes."""
    return re.compile(pattern.replace("{v}", _VERSION), re.MULTILINE)


def forget() -> None:
    """Drop every cached reading (tests that swap a binary in place within one mtime tick)."""
    with _CACHE.lock:
        _CACHE.seen.clear()
