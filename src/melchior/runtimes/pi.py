"""The ``pi`` runtime: one turn of a pi session (``@mariozechner/pi-coding-agent``), unattended.

::

    pi -p --mode json --session FILE [--offline] [--provider P] [--model M] \\
        [--thinking L] [--tools T,...] [--no-builtin-tools] [--no-extensions] \\
        [-e EXT...] [--no-context-files] [--append-system-prompt T] [extra_args...]
                                                            < PROMPT on stdin

The prompt goes on stdin, which pi's print mode reads as the whole first message: not
in argv, for the reasons the other adapters give (argument size, ``/proc``), and
because pi reads a message starting with ``@`` as a file to attach and one starting
with ``-`` as a flag.

**Sessions are files.** A pi session is one JSONL file, and pi's own session ids are
not used to find one: given an id, pi looks it up and, when the session began in
another directory, asks on stdin whether to fork it — and stdin is the prompt here, so
its first line would answer. A new turn picks the file itself, ``SESSION_DIR/ID.jsonl``
with a fresh UUID as ``ID`` (under ``session_dir``, default pi's sessions directory's
``melchior/``), and binds the task to ``ID``: known before the first event, as with
Claude Code's ``--session-id``, and of the alphabet a relay route's session takes. A
bound session is that ``ID``, or the absolute path of any session file (local
configuration), and its file must exist: pi would otherwise quietly start a new
session at that path. pi continues a session in the directory it started in (its
header's ``cwd``), whatever the turn's directory.

**Unattended.** Print mode never asks anything (extensions cannot prompt there). pi
has no permission system and no sandbox of its own: its ``bash``, ``edit`` and
``write`` tools act as the user running it, so ``tools`` (``["read", "grep", "find",
"ls"]`` for a reviewer) or an outer sandbox is how a route is kept in bounds.
``--offline`` (on by default) skips pi's start-up network calls (update checks).

``--mode json`` prints one event per line: the session header names the session,
each assistant ``message_end`` carries the text, tool calls, ``stopReason`` and usage
with cost (summed over the turn), ``tool_execution_start`` is a tool call, and
``auto_retry_start`` a model call being retried. pi exits 0 even when the model call
failed, so the last assistant message's ``stopReason`` decides: ``error`` failed,
``aborted`` cancelled. SIGTERM ends pi with status 143 after it has saved the session.

``message_update`` events repeat the whole message so far with every token; they are
recognised by their first bytes and dropped unparsed, so a long answer costs reading,
not quadratic JSON decoding. ``agent_end`` and ``turn_end`` repeat a turn's messages,
tool output included, which is why lines may be longer here (``line_limit``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import signal
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
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

NAME = "pi"
INSTALL = "install pi (npm i -g @mariozechner/pi-coding-agent) or set the binary option"
"""How to get the program, said when it is not found."""
THINKING = ("off", "minimal", "low", "medium", "high", "xhigh")
"""The levels pi 0.73 accepts for ``--thinking``."""
DEFAULT_LINE_LIMIT = 64 * 1024 * 1024
"""``agent_end`` holds every message of the turn, tool output included, on one line."""

OPTIONS = (
    *PROCESS_OPTIONS,
    "binary",
    "provider",
    "model",
    "thinking",
    "tools",
    "builtin_tools",
    "extensions",
    "discover_extensions",
    "context_files",
    "append_system_prompt",
    "session_dir",
    "offline",
    "extra_args",
)
ROUTE_RULES: dict[str, ro.RouteOption] = {
    **PROCESS_RULES,
    "binary": ro.program("pi"),
    "provider": ro.free(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z"),  # one of pi's own config
    "model": ro.free(ro.MODEL_NAME),
    "thinking": ro.free(),
    "tools": ro.subset(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}\Z"),
    "builtin_tools": ro.ordered((False, True), True),
    "extensions": ro.listed(items=True),
    "discover_extensions": ro.ordered((False, True), True),
    "context_files": ro.ordered((False, True), True),
    "append_system_prompt": ro.listed(),
    "session_dir": ro.listed(),
    "offline": ro.ordered((True, False), True),
    "extra_args": ro.listed(),
}
"""What a relay route may do with each option (:mod:`melchior.policy.route_options`): pi
has no permission system, so its tools are its guard rail — a route may choose among
this machine's ``tools`` (any of pi's when none are set), never switch built-in tools,
a working tree's own extensions or context files back on, nor go online; extensions,
the system prompt, the session directory and flags only as this machine lists them."""

SUPPORT = Support(
    adapter=NAME,
    product="pi",
    oldest=Version("0.55.1"),
    reason="the first release with --offline, which this adapter passes by default (older "
    "releases take an unknown flag without a word, so it would quietly do nothing)",
    shape=shape(r"^\s*{v}\s*$"),
    since=(
        Since("context_files", "--no-context-files", Version("0.67.4")),
        Since("builtin_tools", "--no-builtin-tools", Version("0.70.0")),
    ),
)
"""The releases this adapter drives (checked against the real CLIs, oldest and newest, by
tests/runtimes/test_runtimes_real_clis.py). ``context_files = false`` needs ``--no-context-files``
(0.67.4) and ``builtin_tools = false`` needs ``--no-builtin-tools`` as 0.70.0 made it
(earlier it was missing, then it disabled extension tools too, send_to included)."""

_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}\Z")
_TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}\Z")
_REFUSALS = re.compile(
    r"Unknown option|Unknown provider|No session found|session working directory does not "
    r"exist|not supported in RPC mode|Invalid session"
)
_SUMMARY_KEYS = ("command", "path", "file_path", "pattern", "to", "query")
_SKIPPED = tuple(
    f'{{"type":"{kind}"'.encode()
    for kind in (
        "message_update",
        "message_start",
        "turn_start",
        "turn_end",
        "tool_execution_update",
        "agent_start",
        "agent_end",
    )
)


@dataclass(frozen=True)
class PiOptions:
    binary: str
    provider: str | None
    model: str | None
    thinking: str | None
    tools: tuple[str, ...]
    builtin_tools: bool
    extensions: tuple[str, ...]
    discover_extensions: bool
    context_files: bool
    append_system_prompt: str | None
    session_dir: str | None
    offline: bool
    extra_args: tuple[str, ...]
    limits: Limits
    env: Mapping[str, str]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> PiOptions:
        r = OptionReader(NAME, raw, OPTIONS)
        limits = read_limits(r)
        if "line_limit" not in raw:
            limits = dataclasses.replace(limits, line_limit=DEFAULT_LINE_LIMIT)
        opts = cls(
            binary=r.text("binary", "pi"),
            provider=r.opt_text("provider"),
            model=r.opt_text("model"),
            thinking=r.opt_text("thinking", choices=THINKING),
            tools=r.texts("tools"),
            builtin_tools=r.flag("builtin_tools", True),
            extensions=r.texts("extensions"),
            discover_extensions=r.flag("discover_extensions", True),
            context_files=r.flag("context_files", True),
            append_system_prompt=r.opt_text("append_system_prompt"),
            session_dir=r.opt_text("session_dir"),
            offline=r.flag("offline", True),
            extra_args=r.texts("extra_args"),
            limits=limits,
            env=r.env_map("env"),
        )
        if raw.get("tools") is not None and not opts.tools:
            raise RuntimeConfigError(
                f"{NAME}: option tools lists no tool, which would leave pi all of its own; "
                "for none of pi's own, set builtin_tools = false"
            )
        for tool in opts.tools:
            if not _TOOL_NAME.match(tool):
                raise RuntimeConfigError(
                    f"{NAME}: option tools has {tool!r}; a tool name is letters, digits, '_' "
                    "and '-' (pi's own: read, bash, edit, write, grep, find, ls)"
                )
        for key, value in (
            ("provider", opts.provider),
            ("model", opts.model),
            *(("extensions", e) for e in opts.extensions),
        ):
            if value is not None and (not value or value.startswith("-")):
                raise RuntimeConfigError(
                    f"{NAME}: option {key} has {value!r}, which a command line reads as a flag"
                )
        if opts.session_dir is not None and not os.path.isabs(opts.session_dir):
            raise RuntimeConfigError(
                f"{NAME}: option session_dir must be an absolute path, got {opts.session_dir!r}"
            )
        if opts.extra_args and not opts.extra_args[0].startswith("-"):
            raise RuntimeConfigError(f"{NAME}: option extra_args must start with a flag")
        return opts


def _in_use(opts: PiOptions) -> tuple[str, ...]:
    """The options set whose flags some supported releases lack (see SUPPORT.since)."""
    return (
        *(("context_files",) if not opts.context_files else ()),
        *(("builtin_tools",) if not opts.builtin_tools else ()),
    )


def session_dir(opts: PiOptions, env: Mapping[str, str]) -> Path:
    """Where a new session's file goes: ``session_dir``, else pi's own session directory
    (``PI_CODING_AGENT_SESSION_DIR``, else ``$PI_CODING_AGENT_DIR/sessions``, else
    ``~/.pi/agent/sessions``), in a ``melchior`` folder of its own there."""
    if opts.session_dir is not None:
        return Path(opts.session_dir)
    if env.get("PI_CODING_AGENT_SESSION_DIR"):
        return Path(env["PI_CODING_AGENT_SESSION_DIR"]).expanduser() / "melchior"
    agent = env.get("PI_CODING_AGENT_DIR") or os.path.join(env.get("HOME") or "~", ".pi", "agent")
    return Path(agent).expanduser() / "sessions" / "melchior"


def session_file(session: str, folder: Path) -> tuple[str | None, str | None]:
    """(the file a bound ``session`` resumes, None) or (None, why it cannot be): an id
    names ``folder/ID.jsonl``, an absolute path ending in ``.jsonl`` names itself."""
    if why := check_session_id(session):
        return None, why
    if os.path.isabs(session) and session.endswith(".jsonl"):
        path = session
    elif _SESSION_ID.match(session):
        path = str(folder / f"{session}.jsonl")
    else:
        return None, (
            f"pi session {session!r} is neither a session id (letters, digits, '.', '_', "
            "'-') nor the absolute path of a session file (.jsonl)"
        )
    if not os.path.isfile(path):
        return None, f"there is no pi session file at {path}"
    return path, None


def build_argv(program: str, opts: PiOptions, session_file: str) -> list[str]:
    """The command line for one turn (the prompt goes on stdin)."""
    argv = [program, "-p", "--mode", "json", "--session", session_file]
    if opts.offline:
        argv.append("--offline")
    for flag, value in (
        ("--provider", opts.provider),
        ("--model", opts.model),
        ("--thinking", opts.thinking),
    ):
        if value is not None:
            argv += [flag, value]
    if opts.tools:
        argv += ["--tools", ",".join(opts.tools)]
    if not opts.builtin_tools:
        argv.append("--no-builtin-tools")
    if not opts.discover_extensions:
        argv.append("--no-extensions")
    for extension in opts.extensions:
        argv += ["-e", extension]
    if not opts.context_files:
        argv.append("--no-context-files")
    if opts.append_system_prompt is not None:
        argv += ["--append-system-prompt", opts.append_system_prompt]
    argv += opts.extra_args
    return argv


def _clip(text: str, n: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class _Events:
    """Turns ``--mode json`` lines into progress and remembers how the turn ended."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.session_id: str | None = None
        self.last: dict[str, Any] | None = None
        self.last_text = ""
        self.tokens_in = 0
        self.tokens_out = 0
        self.cost: float | None = None
        self.noise: list[str] = []

    async def line(self, raw: bytes) -> None:
        if raw.startswith(_SKIPPED):
            return
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
        if kind == "session":
            await self._session(ev)
        elif kind == "message_end":
            message = ev.get("message")
            if isinstance(message, dict) and message.get("role") == "assistant":
                await self._assistant(message)
        elif kind == "tool_execution_start":
            name = str(ev.get("toolName"))
            detail = _summary(ev.get("args"))
            await self.emit(
                Progress(
                    "status",
                    f"using {name}" + (f": {detail}" if detail else ""),
                    {"tool": name, "tool_call_id": ev.get("toolCallId")},
                )
            )
        elif kind == "tool_execution_end" and ev.get("isError") is True:
            await self.emit(Progress("status", f"{ev.get('toolName')} failed"))
        elif kind == "auto_retry_start":
            await self.emit(
                Progress(
                    "status",
                    f"model call failed ({_clip(str(ev.get('errorMessage')))}); retry "
                    f"{ev.get('attempt')} of {ev.get('maxAttempts')}",
                )
            )

    async def _session(self, ev: dict[str, Any]) -> None:
        sid = ev.get("id")
        if isinstance(sid, str):
            self.session_id = sid
        await self.emit(
            Progress(
                "status",
                f"pi session {sid} in {ev.get('cwd')}",
                {"session_id": sid, "cwd": ev.get("cwd")},
            )
        )

    async def _assistant(self, message: dict[str, Any]) -> None:
        self.last = message
        usage = message.get("usage")
        if isinstance(usage, dict):
            for key, attr in (("input", "tokens_in"), ("output", "tokens_out")):
                value = usage.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    setattr(self, attr, getattr(self, attr) + value)
            cost = usage.get("cost")
            total = _number(cost.get("total")) if isinstance(cost, dict) else None
            if total is not None:
                self.cost = (self.cost or 0.0) + total
        content = message.get("content")
        said = []
        for block in content if isinstance(content, list) else ():
            if (
                isinstance(block, dict)
                and block.get("type") == "text"
                and isinstance(block.get("text"), str)
                and block["text"].strip()
            ):
                said.append(block["text"])
                await self.emit(Progress("message", block["text"]))
        if said:
            self.last_text = "".join(said)

    @property
    def usage(self) -> dict[str, int | float]:
        if self.last is None:
            return {}
        usage: dict[str, int | float] = {
            "input_tokens": self.tokens_in,
            "output_tokens": self.tokens_out,
        }
        if self.cost is not None:
            usage["cost_usd"] = self.cost
        return usage

    def answer(self) -> str:
        """The last assistant message's text; else the last text of the turn (a turn that
        ended on a tool call)."""
        content = self.last.get("content") if self.last is not None else None
        blocks = content if isinstance(content, list) else []
        text = "".join(
            b["text"]
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        )
        return text if text.strip() else self.last_text


def _summary(value: Any) -> str:
    if isinstance(value, Mapping):
        for key in _SUMMARY_KEYS:
            if isinstance(value.get(key), str) and value[key]:
                return _clip(value[key])
    return ""


class PiRuntime:
    """pi, one print-mode run per turn, resuming the bound session's file."""

    name = NAME

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        PiOptions.parse(self.config)

    def preflight(self) -> str:
        """What the first turn would find, checked at start-up: the configured binary is
        there and a release this adapter drives (else :class:`RuntimeConfigError`)."""
        opts = PiOptions.parse(self.config)
        env = compose_env(opts.env)
        program = require_program(opts.binary, env, INSTALL, runtime=NAME)
        return f"pi {SUPPORT.check(program, _in_use(opts), env)} at {program}"

    async def run(self, turn: Turn, emit: Emit) -> TurnResult:
        path = "resumed" if turn.session else "new"
        try:
            opts = PiOptions.parse(layered(self.config, turn.options))
        except RuntimeConfigError as exc:
            return failed(str(exc), path=path)
        env = compose_env(opts.env, turn.env)
        folder = session_dir(opts, env)
        if turn.session is not None:
            file, why = await asyncio.to_thread(session_file, turn.session, folder)
            if file is None:
                return failed(why or "no session file", path=path)
            session = turn.session
        else:
            session = str(uuid.uuid4())
            file = str(folder / f"{session}.jsonl")
        try:
            program = require_program(opts.binary, env, INSTALL)
            await asyncio.to_thread(SUPPORT.check, program, _in_use(opts), env)
        except RuntimeConfigError as exc:
            return failed(str(exc), path=path)
        try:
            await asyncio.to_thread(folder.mkdir, mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            return failed(f"cannot make pi's session directory {folder}: {exc}", path=path)
        await emit(
            Progress(
                "status",
                f"resuming pi session {session} ({file})"
                if turn.session
                else f"starting a new pi session {session} in {turn.cwd}",
                {"path": path, "session": session, "file": file},
            )
        )
        events = _Events(emit)

        async def on_start(pid: int) -> None:
            await emit(Progress("status", f"started pi (pid {pid})", {"pid": pid}))

        try:
            ex = await run_process(
                build_argv(program, opts, file),
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
            return failed(f"pi was stopped: {exc}", path=path)
        # pi writes the file once the model has answered; before that there is nothing
        # a next turn could resume.
        kept = session if await asyncio.to_thread(os.path.isfile, file) else None
        if events.usage:
            await emit(Progress("usage", "", events.usage))
        return _outcome(ex, events, opts, kept, path)


def _outcome(
    ex: Exit, events: _Events, opts: PiOptions, session: str | None, path: str
) -> TurnResult:
    usage = events.usage
    last = events.last
    if ex.timed_out:
        return failed(
            ex.with_stderr(f"pi did not finish within {opts.limits.timeout:g} s"),
            session=session,
            usage=usage,
            path=path,
        )
    stop = last.get("stopReason") if last is not None else None
    if ex.signal in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL, signal.SIGHUP) or (
        stop == "aborted"
    ):
        return TurnResult(
            CANCELED,
            text=f"pi {ex.describe()} before finishing the turn"
            + (f"; resuming session {session} continues it" if session else ""),
            retryable=True,
            session=session,
            usage=usage,
            path=path,
        )
    if last is None:
        noise = f"; output: {' | '.join(events.noise)}" if events.noise else ""
        return failed(
            ex.with_stderr(f"pi {ex.describe()} without an answer{noise}"),
            retryable=not _REFUSALS.search(ex.stderr),
            session=session,
            path=path,
        )
    text = events.answer()
    if stop == "error":
        return failed(
            ex.with_stderr(f"pi reported an error: {last.get('errorMessage') or 'no reason'}"),
            text=text,
            session=session,
            usage=usage,
            path=path,
        )
    if ex.returncode != 0:
        return failed(
            ex.with_stderr(f"pi {ex.describe()} after answering"),
            text=text,
            session=session,
            usage=usage,
            path=path,
        )
    return TurnResult(COMPLETED, text=text, session=session, usage=usage, path=path)
