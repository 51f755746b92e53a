"""The ``codex`` runtime: one turn of a Codex thread, run unattended with ``codex exec``.

::

    codex exec --json -C CWD (-s SANDBOX | --dangerously-bypass-approvals-and-sandbox) \\
        [--skip-git-repo-check] [-m MODEL] [-p PROFILE] [-c KEY=VALUE...] \\
        [--add-dir D...] [extra_args...] [resume THREAD] -        < PROMPT on stdin

Everything that belongs to ``exec`` comes before ``resume``: the ``resume`` subcommand
itself refuses ``-C`` and ``-s``. The prompt is read from stdin (the ``-`` operand), for
the same reasons as with Claude Code (argument size, ``/proc`` visibility, a leading
``-``); stdin is closed after it, so Codex never waits for more.

**Unattended profile.** ``codex exec`` never asks for approval (its policy is
``never``): what a command may touch is decided by the sandbox alone. The default here
is ``-s workspace-write``: the thread may edit its working directory (and ``add_dirs``),
and nothing else; ``sandbox`` chooses ``read-only`` or ``danger-full-access``, and
``bypass_sandbox`` runs with no sandbox at all (only inside an outer sandbox). The
session's former interactive settings are never used: the sandbox is always explicit.

``--json`` events become progress: ``thread.started`` names the thread (the session to
bind next time), agent messages are ``message``s, commands, MCP calls and file changes
are ``status``es, ``turn.completed`` carries usage. Error *items* are configuration
warnings and are not fatal; ``turn.failed`` is. A stream that ends without
``turn.completed`` is an interrupted turn.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from melchior.policy import route_options as ro
from melchior.runtimes.base import (
    CANCELED,
    COMPLETED,
    Emit,
    Progress,
    RuntimeConfigError,
    Turn,
    TurnResult,
    failed,
)
from melchior.runtimes.options import OptionReader, layered
from melchior.runtimes.process import (
    PROCESS_OPTIONS,
    PROCESS_RULES,
    Exit,
    Limits,
    LineTooLong,
    SpawnError,
    check_session_id,
    compose_env,
    read_limits,
    require_program,
    run_process,
)
from melchior.runtimes.versions import Since, Support, Version, shape

NAME = "codex"
INSTALL = "install Codex or set the binary option"
"""How to get the program, said when it is not found."""
SANDBOXES = ("read-only", "workspace-write", "danger-full-access")
DEFAULT_SANDBOX = "workspace-write"
OPTIONS = (
    *PROCESS_OPTIONS,
    "binary",
    "sandbox",
    "bypass_sandbox",
    "skip_git_repo_check",
    "model",
    "profile",
    "config",
    "add_dirs",
    "extra_args",
)
ROUTE_RULES: dict[str, ro.RouteOption] = {
    **PROCESS_RULES,
    "binary": ro.program("codex"),
    "sandbox": ro.ordered(SANDBOXES, DEFAULT_SANDBOX, bypass=("danger-full-access",)),
    "bypass_sandbox": ro.ordered((False, True), False, bypass=(True,)),
    "skip_git_repo_check": ro.free(),
    "model": ro.free(ro.MODEL_NAME),
    "profile": ro.listed(),
    "config": ro.listed(items=True),
    "add_dirs": ro.DIRS_OPTION,
    "extra_args": ro.listed(),
}
"""What a relay route may do with each option (:mod:`melchior.policy.route_options`): the
sandbox only narrower; Codex profiles, ``-c`` settings (model providers, MCP servers,
sandbox modes) and flags only as this machine lists them."""
_CONFIG_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*\Z")
_REFUSALS = re.compile(
    r"no rollout found|unexpected argument|invalid value|Not inside a trusted directory|"
    r"a value is required"
)

SUPPORT = Support(
    adapter=NAME,
    product="Codex",
    oldest=Version("0.44.0"),
    reason="the first release whose exec --json prints the thread.started, item.* and "
    "turn.* events read here (0.42.0 prints an older format and no turn.completed)",
    shape=shape(r"^codex-cli {v}"),
    since=(Since("add_dirs", "--add-dir", Version("0.59.0")),),
)
"""The releases this adapter drives (checked against the real CLIs, oldest and newest, by
tests/runtimes/test_runtimes_real_clis.py); ``add_dirs`` needs ``exec --add-dir``, new in 0.59.0."""


@dataclass(frozen=True)
class CodexOptions:
    binary: str
    sandbox: str
    bypass_sandbox: bool
    skip_git_repo_check: bool
    model: str | None
    profile: str | None
    config: Mapping[str, str]
    add_dirs: tuple[str, ...]
    extra_args: tuple[str, ...]
    limits: Limits
    env: Mapping[str, str]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> CodexOptions:
        r = OptionReader(NAME, raw, OPTIONS)
        opts = cls(
            binary=r.text("binary", "codex"),
            sandbox=r.text("sandbox", DEFAULT_SANDBOX, choices=SANDBOXES),
            bypass_sandbox=r.flag("bypass_sandbox", False),
            skip_git_repo_check=r.flag("skip_git_repo_check", True),
            model=r.opt_text("model"),
            profile=r.opt_text("profile"),
            config=r.text_map("config"),
            add_dirs=r.texts("add_dirs"),
            extra_args=r.texts("extra_args"),
            limits=read_limits(r),
            env=r.env_map("env"),
        )
        for key in opts.config:
            if not _CONFIG_KEY.match(key):
                raise RuntimeConfigError(f"{NAME}: option config has a bad key {key!r}")
        for item in (*opts.add_dirs, opts.model or "x", opts.profile or "x"):
            if item.startswith("-"):
                raise RuntimeConfigError(
                    f"{NAME}: {item!r} starts with '-', which a command line reads as a flag"
                )
        if opts.extra_args and not opts.extra_args[0].startswith("-"):
            raise RuntimeConfigError(f"{NAME}: option extra_args must start with a flag")
        return opts


def _in_use(opts: CodexOptions) -> tuple[str, ...]:
    """The options set whose flags some supported releases lack (see SUPPORT.since)."""
    return ("add_dirs",) if opts.add_dirs else ()


def build_argv(program: str, opts: CodexOptions, cwd: str, thread: str | None) -> list[str]:
    """The command line for one turn (the prompt goes on stdin, read through ``-``)."""
    argv = [program, "exec", "--json", "-C", cwd]
    if opts.bypass_sandbox:
        argv.append("--dangerously-bypass-approvals-and-sandbox")
    else:
        argv += ["-s", opts.sandbox]
    if opts.skip_git_repo_check:
        argv.append("--skip-git-repo-check")
    if opts.model is not None:
        argv += ["-m", opts.model]
    if opts.profile is not None:
        argv += ["-p", opts.profile]
    for key, value in opts.config.items():
        argv += ["-c", f"{key}={value}"]
    for d in opts.add_dirs:
        argv += ["--add-dir", d]
    argv += opts.extra_args
    if thread is not None:
        argv += ["resume", thread]
    argv.append("-")
    return argv


def _clip(text: str, n: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


class _Events:
    """Turns ``--json`` lines into progress and remembers how the turn ended."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.thread_id: str | None = None
        self.completed = False
        self.usage: dict[str, int | float] = {}
        self.turn_failed: str | None = None
        self.errors: list[str] = []
        self.last_message = ""
        self.noise: list[str] = []

    async def line(self, raw: bytes) -> None:
        try:
            ev = json.loads(raw)
        except ValueError:
            text = raw.decode("utf-8", "replace").strip()
            if text:
                self.noise = [*self.noise[-4:], _clip(text)]
            return
        if not isinstance(ev, dict):
            return
        kind = ev.get("type")
        if kind == "thread.started" and isinstance(ev.get("thread_id"), str):
            self.thread_id = ev["thread_id"]
            await self.emit(
                Progress("status", f"codex thread {self.thread_id}", {"session_id": self.thread_id})
            )
        elif kind == "turn.completed":
            self.completed = True
            raw_usage = ev.get("usage")
            if isinstance(raw_usage, dict):
                for key in ("input_tokens", "output_tokens", "cached_input_tokens"):
                    value = raw_usage.get(key)
                    if isinstance(value, int) and not isinstance(value, bool):
                        self.usage[key] = value
        elif kind == "turn.failed":
            err = ev.get("error")
            message = err.get("message") if isinstance(err, dict) else None
            self.turn_failed = str(message or "the turn failed")
        elif kind == "error":
            # Reported mid-stream (a reconnect, a retry); fatal only if no turn.completed follows.
            message = str(ev.get("message") or "error")
            self.errors = [*self.errors[-4:], message]
            await self.emit(Progress("status", f"codex: {_clip(message)}"))
        elif kind in ("item.started", "item.updated", "item.completed"):
            item = ev.get("item")
            if isinstance(item, dict):
                await self._item(item, done=kind == "item.completed")

    async def _item(self, item: dict[str, Any], *, done: bool) -> None:
        kind = item.get("type")
        ref = {"item_id": item.get("id"), "item_type": kind}
        if kind == "agent_message" and done and isinstance(item.get("text"), str):
            self.last_message = item["text"]
            await self.emit(Progress("message", item["text"]))
        elif kind == "command_execution":
            command = _clip(str(item.get("command", "")))
            if done:
                text = f"command finished (exit {item.get('exit_code')}): {command}"
            else:
                text = f"running: {command}"
            await self.emit(Progress("status", text, ref))
        elif kind == "mcp_tool_call":
            name = f"{item.get('server')}.{item.get('tool')}"
            err = item.get("error")
            if done and isinstance(err, dict):
                text = f"{name} failed: {_clip(str(err.get('message')))}"
            else:
                text = f"{name} finished" if done else f"calling {name}"
            await self.emit(Progress("status", text, ref))
        elif kind == "file_change" and done:
            changes = item.get("changes")
            paths = [
                str(c.get("path")) for c in changes or [] if isinstance(c, dict) and c.get("path")
            ]
            await self.emit(Progress("status", f"changed {', '.join(paths) or 'files'}", ref))
        elif kind == "web_search" and not done:
            await self.emit(Progress("status", f"searching: {_clip(str(item.get('query')))}", ref))
        elif kind == "error" and done:
            await self.emit(Progress("status", f"warning: {_clip(str(item.get('message')))}", ref))


class CodexRuntime:
    """Codex, resumed or started per turn with ``codex exec``."""

    name = NAME

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        CodexOptions.parse(self.config)

    def preflight(self) -> str:
        """What the first turn would find, checked at start-up: the configured binary is
        there and a release this adapter drives (else :class:`RuntimeConfigError`)."""
        opts = CodexOptions.parse(self.config)
        env = compose_env(opts.env)
        program = require_program(opts.binary, env, INSTALL, runtime=NAME)
        return f"Codex {SUPPORT.check(program, _in_use(opts), env)} at {program}"

    async def run(self, turn: Turn, emit: Emit) -> TurnResult:
        path = "resumed" if turn.session else "new"
        try:
            opts = CodexOptions.parse(layered(self.config, turn.options))
        except RuntimeConfigError as exc:
            return failed(str(exc), path=path)
        if turn.session is not None and (why := check_session_id(turn.session)):
            return failed(why, path=path)
        env = compose_env(opts.env, turn.env)
        try:
            program = require_program(opts.binary, env, INSTALL)
            await asyncio.to_thread(SUPPORT.check, program, _in_use(opts), env)
        except RuntimeConfigError as exc:
            return failed(str(exc), path=path)
        await emit(
            Progress(
                "status",
                f"resuming codex thread {turn.session} in {turn.cwd}"
                if turn.session
                else f"starting a new codex thread in {turn.cwd}",
                {"path": path, "session": turn.session},
            )
        )
        events = _Events(emit)

        async def on_start(pid: int) -> None:
            await emit(Progress("status", f"started codex (pid {pid})", {"pid": pid}))

        try:
            ex = await run_process(
                build_argv(program, opts, str(turn.cwd), turn.session),
                cwd=turn.cwd,
                env=env,
                stdin=turn.prompt.encode("utf-8", "surrogatepass"),
                on_line=events.line,
                on_start=on_start,
                limits=opts.limits,
            )
        except SpawnError as exc:
            return failed(str(exc), path=path)
        except LineTooLong as exc:
            return failed(f"codex was stopped: {exc}", path=path)
        if events.usage:
            await emit(Progress("usage", "", events.usage))
        return _outcome(ex, events, opts, events.thread_id or turn.session, path)


def _outcome(
    ex: Exit, events: _Events, opts: CodexOptions, session: str | None, path: str
) -> TurnResult:
    usage = events.usage
    if events.completed and ex.returncode == 0 and not ex.timed_out:
        return TurnResult(
            COMPLETED, text=events.last_message, session=session, usage=usage, path=path
        )
    if events.turn_failed is not None:
        return failed(
            ex.with_stderr(f"codex reported the turn failed: {events.turn_failed}"),
            text=events.last_message,
            session=session,
            usage=usage,
            path=path,
        )
    if ex.timed_out:
        return failed(
            ex.with_stderr(f"codex did not finish within {opts.limits.timeout:g} s"),
            session=session,
            path=path,
        )
    if ex.signal in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL, signal.SIGHUP):
        return TurnResult(
            CANCELED,
            text=f"codex {ex.describe()} before the turn completed"
            + (f"; resuming thread {session} continues it" if session else ""),
            retryable=True,
            session=session,
            path=path,
        )
    said = f"; it said: {' | '.join(events.errors)}" if events.errors else ""
    noise = f"; output: {' | '.join(events.noise)}" if events.noise else ""
    ending = "after" if events.completed else "without"
    return failed(
        ex.with_stderr(f"codex {ex.describe()} {ending} completing the turn{said}{noise}"),
        retryable=not _REFUSALS.search(ex.stderr),
        text=events.last_message,
        session=session,
        usage=usage,
        path=path,
    )
