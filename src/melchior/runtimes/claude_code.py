"""The ``claude-code`` runtime: one turn of a Claude Code session, run unattended.

A bound session is resumed in its working directory; with no session a new one is
started under an id we choose (so the caller knows it before the first event)::

    claude -p --output-format stream-json --verbose \\
        --permission-mode acceptEdits --permission-prompts none \\
        (--resume S | --session-id UUID) [--max-turns N] [--max-budget-usd X] \\
        [--model M] [--append-system-prompt T] [--settings F] [extra_args...] \\
        [--mcp-config F... [--strict-mcp-config]] [--allowedTools T...] \\
        [--disallowedTools T...] [--add-dir D...]           < PROMPT on stdin

The prompt goes on stdin, not in argv: the kernel caps one argument at 128 KiB, argv
is readable by every local user through ``/proc``, and a prompt starting with ``-``
would be read as a flag. (Both ways were checked against Claude Code 2.1.332.)

**Unattended profile.** Queued work never inherits the session's interactive approval
mode. By default it runs with ``--permission-mode acceptEdits`` (edits inside the
working directory are allowed, as a task needs) and ``--permission-prompts none``
(anything that would ask a person is denied at once, since nobody is there to answer;
the denials are reported). ``allowed_tools`` widens that on purpose; ``permission_mode``
changes it (``bypassPermissions`` only makes sense inside an outer sandbox, and as root
Claude Code refuses it unless ``IS_SANDBOX=1``).

**Live session.** When the route names the live session's inbox socket (``inbox``,
Claude Code's cross-session messaging socket) and it accepts a connection, the prompt
is written there instead of starting a second process on the same session: the person
at that session sees it arrive, and its answer stays in that session. When the socket
is absent or refuses, the turn falls back to resuming, and says so.

stream-json events become :class:`~melchior.runtimes.base.Progress`: the init event
names the session, assistant text is a ``message``, a tool call a ``status``, and the
``result`` event gives the answer, usage and cost. ``is_error`` and the exit status
decide failure (the result's ``subtype`` says "success" on API errors). SIGTERM ends
Claude Code with no result event, which is how cancellation looks from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import uuid
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
from melchior.runtimes.versions import Support, Version, shape

NAME = "claude-code"
INSTALL = "install Claude Code or set the binary option"
"""How to get the program, said when it is not found."""
PERMISSION_MODES = ("acceptEdits", "auto", "bypassPermissions", "manual", "dontAsk", "plan")
"""The choices Claude Code 2.1.332 accepts for ``--permission-mode``."""
DEFAULT_PERMISSION_MODE = "acceptEdits"
DEFAULT_PERMISSION_PROMPTS = "none"
DEFAULT_INBOX_TIMEOUT = 2.0

OPTIONS = (
    *PROCESS_OPTIONS,
    "binary",
    "permission_mode",
    "permission_prompts",
    "allowed_tools",
    "disallowed_tools",
    "max_turns",
    "max_budget_usd",
    "model",
    "append_system_prompt",
    "settings",
    "mcp_config",
    "strict_mcp_config",
    "add_dirs",
    "extra_args",
    "inbox",
    "inbox_token_env",
    "inbox_timeout",
)
ROUTE_RULES: dict[str, ro.RouteOption] = {
    **PROCESS_RULES,
    "binary": ro.program("claude"),
    "permission_mode": ro.ordered(
        ("plan", ("dontAsk", "manual"), "acceptEdits", "auto", "bypassPermissions"),
        DEFAULT_PERMISSION_MODE,
        bypass=("bypassPermissions",),
    ),
    "permission_prompts": ro.ordered(("none", "host"), DEFAULT_PERMISSION_PROMPTS),
    "allowed_tools": ro.listed(items=True),
    "disallowed_tools": ro.adds(ro.TOOL_NAME),
    "max_turns": ro.limit(),
    "max_budget_usd": ro.limit(),
    "model": ro.free(ro.MODEL_NAME),
    "append_system_prompt": ro.listed(),
    "settings": ro.listed(),
    "mcp_config": ro.listed(items=True),
    "strict_mcp_config": ro.ordered((True, False), False),
    "add_dirs": ro.DIRS_OPTION,
    "extra_args": ro.listed(),
    "inbox": ro.listed(),
    "inbox_token_env": ro.listed(),
    "inbox_timeout": ro.free(),
}
"""What a relay route may do with each option (:mod:`melchior.policy.route_options`): the
guard rails only narrower, bounds only lower, tools only denied; tools to allow, settings,
MCP servers, system prompts, flags and the live inbox only as this machine lists them."""

# Refusals of the command line itself: running the same turn again cannot help.
_REFUSALS = re.compile(
    r"No conversation found|is already in use|Invalid session ID|unknown option|"
    r"is invalid\. Allowed choices|requires --verbose|cannot be used with root|argument missing"
)
_SUMMARY_KEYS = ("description", "command", "file_path", "path", "pattern", "url", "prompt")

SUPPORT = Support(
    adapter=NAME,
    product="Claude Code",
    oldest=Version("2.1.259"),
    reason="the first release with --permission-prompts (2.1.258 refuses it as an unknown "
    "option), which the unattended profile always passes",
    shape=shape(r"^\s*{v} \(Claude Code\)"),
)
"""The releases this adapter drives: every flag and choice it passes is in 2.1.259 and
later (checked against the real CLIs, oldest and newest, by
tests/runtimes/test_runtimes_real_clis.py)."""


@dataclass(frozen=True)
class ClaudeCodeOptions:
    binary: str
    permission_mode: str
    permission_prompts: str | None
    allowed_tools: tuple[str, ...]
    disallowed_tools: tuple[str, ...]
    max_turns: int | None
    max_budget_usd: float | None
    model: str | None
    append_system_prompt: str | None
    settings: str | None
    mcp_config: tuple[str, ...]
    strict_mcp_config: bool
    add_dirs: tuple[str, ...]
    extra_args: tuple[str, ...]
    inbox: str | None
    inbox_token_env: str | None
    inbox_timeout: float
    limits: Limits
    env: Mapping[str, str]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ClaudeCodeOptions:
        r = OptionReader(NAME, raw, OPTIONS)
        prompts: str | None = DEFAULT_PERMISSION_PROMPTS
        if "permission_prompts" in raw:  # null leaves the flag out (print mode's own default)
            prompts = r.opt_text("permission_prompts", choices=("host", "none"))
        opts = cls(
            binary=r.text("binary", "claude"),
            permission_mode=r.text(
                "permission_mode", DEFAULT_PERMISSION_MODE, choices=PERMISSION_MODES
            ),
            permission_prompts=prompts,
            allowed_tools=r.texts("allowed_tools"),
            disallowed_tools=r.texts("disallowed_tools"),
            max_turns=r.opt_integer("max_turns", low=1, high=10_000),
            max_budget_usd=r.opt_number("max_budget_usd", low=0.0001, high=100_000.0),
            model=r.opt_text("model"),
            append_system_prompt=r.opt_text("append_system_prompt"),
            settings=r.opt_text("settings"),
            mcp_config=r.texts("mcp_config"),
            strict_mcp_config=r.flag("strict_mcp_config", False),
            add_dirs=r.texts("add_dirs"),
            extra_args=r.texts("extra_args"),
            inbox=r.opt_text("inbox"),
            inbox_token_env=r.opt_text("inbox_token_env"),
            inbox_timeout=r.number("inbox_timeout", DEFAULT_INBOX_TIMEOUT, low=0.01, high=60.0),
            limits=read_limits(r),
            env=r.env_map("env"),
        )
        for key in ("allowed_tools", "disallowed_tools", "mcp_config", "add_dirs"):
            for item in getattr(opts, key):
                if not item or item.startswith("-"):
                    raise RuntimeConfigError(
                        f"{NAME}: option {key} has {item!r}; an entry may not be empty or "
                        "start with '-' (it would be read as a flag)"
                    )
        if opts.extra_args and not opts.extra_args[0].startswith("-"):
            raise RuntimeConfigError(f"{NAME}: option extra_args must start with a flag")
        return opts


def build_argv(
    program: str, opts: ClaudeCodeOptions, session: str | None, new_id: str
) -> list[str]:
    """The command line for one turn (the prompt goes on stdin)."""
    argv = [program, "-p", "--output-format", "stream-json", "--verbose"]
    argv += ["--permission-mode", opts.permission_mode]
    if opts.permission_prompts is not None:
        argv += ["--permission-prompts", opts.permission_prompts]
    argv += ["--resume", session] if session else ["--session-id", new_id]
    if opts.max_turns is not None:
        argv += ["--max-turns", str(opts.max_turns)]
    if opts.max_budget_usd is not None:
        argv += ["--max-budget-usd", repr(opts.max_budget_usd)]
    for flag, value in (
        ("--model", opts.model),
        ("--append-system-prompt", opts.append_system_prompt),
        ("--settings", opts.settings),
    ):
        if value is not None:
            argv += [flag, value]
    argv += opts.extra_args
    # Variadic flags last: each list ends at the next flag, and no prompt follows.
    if opts.mcp_config:
        argv += ["--mcp-config", *opts.mcp_config]
        if opts.strict_mcp_config:
            argv.append("--strict-mcp-config")
    for flag, items in (
        ("--allowedTools", opts.allowed_tools),
        ("--disallowedTools", opts.disallowed_tools),
        ("--add-dir", opts.add_dirs),
    ):
        if items:
            argv += [flag, *items]
    return argv


# -- the live session's inbox -------------------------------------------------------------------


class InboxUnavailable(Exception):
    """Nobody is listening at the inbox: nothing was sent, so resuming is safe."""


class InboxBroken(Exception):
    """The inbox accepted a connection and then failed mid-write: delivery is uncertain."""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


async def deliver_to_inbox(path: str, text: str, token: str | None, within: float) -> None:
    """Write ``text`` to a live Claude Code session's inbox socket as one user message
    (after an auth line when ``token`` is given), then close."""
    try:
        async with asyncio.timeout(within):
            _, writer = await asyncio.open_unix_connection(path)
    except (OSError, TimeoutError, ValueError) as exc:
        raise InboxUnavailable(_reason(exc)) from None
    lines: list[dict[str, Any]] = []
    if token is not None:
        lines.append({"type": "auth", "token": token})
    lines.append({"type": "user", "message": {"role": "user", "content": text}})
    try:
        writer.write(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
        async with asyncio.timeout(within):
            await writer.drain()
    except (OSError, TimeoutError) as exc:
        raise InboxBroken(_reason(exc)) from None
    finally:
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(within):
                await writer.wait_closed()


# -- reading stream-json --------------------------------------------------------------------------


def _summary(value: Any) -> str:
    if isinstance(value, Mapping):
        for key in _SUMMARY_KEYS:
            if isinstance(value.get(key), str) and value[key]:
                return _clip(value[key])
    return ""


def _clip(text: str, n: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


class _Stream:
    """Turns stream-json lines into progress and remembers what the result needs."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.session_id: str | None = None
        self.result: dict[str, Any] | None = None
        self.last_text = ""
        self.api_error: str | None = None
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
        if kind == "system":
            await self._system(ev)
        elif kind == "assistant":
            await self._assistant(ev)
        elif kind == "result":
            self.result = ev
            if isinstance(ev.get("session_id"), str):
                self.session_id = ev["session_id"]

    async def _system(self, ev: dict[str, Any]) -> None:
        sub = ev.get("subtype")
        if sub == "init":
            sid = ev.get("session_id")
            if isinstance(sid, str):
                self.session_id = sid
            data = {
                "session_id": sid,
                "model": ev.get("model"),
                "permission_mode": ev.get("permissionMode"),
                "cwd": ev.get("cwd"),
                "version": ev.get("claude_code_version"),
            }
            await self.emit(
                Progress(
                    "status",
                    f"claude-code session {sid} started ({ev.get('model')}, "
                    f"permission mode {ev.get('permissionMode')})",
                    data,
                )
            )
        elif sub == "api_retry":
            await self.emit(
                Progress(
                    "status",
                    f"API call failed ({ev.get('error_status')}); retry "
                    f"{ev.get('attempt')} of {ev.get('max_retries')}",
                )
            )

    async def _assistant(self, ev: dict[str, Any]) -> None:
        if isinstance(ev.get("error"), str):
            self.api_error = ev["error"]
        message = ev.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            return
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                self.last_text = block["text"]
                await self.emit(Progress("message", block["text"]))
            elif block.get("type") == "tool_use":
                name = str(block.get("name"))
                detail = _summary(block.get("input"))
                await self.emit(
                    Progress(
                        "status",
                        f"using {name}" + (f": {detail}" if detail else ""),
                        {"tool": name, "tool_use_id": block.get("id")},
                    )
                )


def _usage(result: Mapping[str, Any]) -> dict[str, int | float]:
    usage: dict[str, int | float] = {}
    raw = result.get("usage")
    if isinstance(raw, dict):
        for key in ("input_tokens", "output_tokens"):
            if isinstance(raw.get(key), int) and not isinstance(raw.get(key), bool):
                usage[key] = raw[key]
    cost = result.get("total_cost_usd")
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        usage["cost_usd"] = float(cost)
    return usage


# -- the runtime ---------------------------------------------------------------------------------


class ClaudeCodeRuntime:
    """Claude Code, resumed or started per turn, or reached through a live inbox."""

    name = NAME

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        ClaudeCodeOptions.parse(self.config)

    def preflight(self) -> str:
        """What the first turn would find, checked at start-up: the configured binary is
        there and a release this adapter drives (else :class:`RuntimeConfigError`)."""
        opts = ClaudeCodeOptions.parse(self.config)
        env = compose_env(opts.env)
        program = require_program(opts.binary, env, INSTALL, runtime=NAME)
        return f"Claude Code {SUPPORT.check(program, env=env)} at {program}"

    async def run(self, turn: Turn, emit: Emit) -> TurnResult:
        try:
            opts = ClaudeCodeOptions.parse(layered(self.config, turn.options))
        except RuntimeConfigError as exc:
            return failed(str(exc))
        if turn.session is not None and (why := check_session_id(turn.session)):
            return failed(why)
        env = compose_env(opts.env, turn.env)
        if opts.inbox is not None:
            delivered = await self._via_inbox(turn, opts.inbox, opts, env, emit)
            if delivered is not None:
                return delivered
        else:
            await emit(
                Progress(
                    "status",
                    f"resuming claude-code session {turn.session} in {turn.cwd}"
                    if turn.session
                    else f"starting a new claude-code session in {turn.cwd}",
                    {"path": "resumed" if turn.session else "new", "session": turn.session},
                )
            )
        return await self._process(turn, opts, env, emit)

    async def _via_inbox(
        self, turn: Turn, inbox: str, opts: ClaudeCodeOptions, env: dict[str, str], emit: Emit
    ) -> TurnResult | None:
        """Deliver through the live session's inbox; None means nobody listens there and
        the turn should resume the session instead (after saying so)."""
        token: str | None = None
        if opts.inbox_token_env is not None:
            token = env.get(opts.inbox_token_env)
            if not token:
                return failed(
                    f"option inbox_token_env names {opts.inbox_token_env}, which is not set",
                    path="inbox",
                )
        try:
            await deliver_to_inbox(inbox, turn.prompt, token, opts.inbox_timeout)
        except InboxUnavailable as exc:
            instead = (
                f"resuming session {turn.session} in a new process instead"
                if turn.session
                else "starting a new session instead"
            )
            await emit(
                Progress(
                    "status",
                    f"the live session's inbox {inbox} is unavailable ({exc}); {instead}",
                    {"path": "resumed" if turn.session else "new", "inbox_error": str(exc)},
                )
            )
            return None
        except InboxBroken as exc:
            return failed(
                f"the live session's inbox {inbox} accepted a connection, then failed "
                f"({exc}); the message may or may not have arrived, so it is not resent",
                path="inbox",
                session=turn.session,
            )
        await emit(
            Progress(
                "status",
                f"delivered to the live Claude Code session through its inbox {inbox}",
                {"path": "inbox", "session": turn.session},
            )
        )
        session = f" {turn.session}" if turn.session else ""
        return TurnResult(
            COMPLETED,
            text=f"Delivered to the live Claude Code session{session} through its inbox. "
            "It answers in its own time; no answer is captured here.",
            session=turn.session,
            path="inbox",
        )

    async def _process(
        self, turn: Turn, opts: ClaudeCodeOptions, env: dict[str, str], emit: Emit
    ) -> TurnResult:
        path = "resumed" if turn.session else "new"
        new_id = str(uuid.uuid4())
        session = turn.session or new_id
        try:
            program = require_program(opts.binary, env, INSTALL)
            await asyncio.to_thread(SUPPORT.check, program, env=env)
        except RuntimeConfigError as exc:
            return failed(str(exc), path=path)
        stream = _Stream(emit)

        async def on_start(pid: int) -> None:
            await emit(Progress("status", f"started claude (pid {pid})", {"pid": pid}))

        try:
            ex = await run_process(
                build_argv(program, opts, turn.session, new_id),
                cwd=turn.cwd,
                env=env,
                stdin=turn.prompt.encode("utf-8", "surrogatepass"),
                on_line=stream.line,
                on_start=on_start,
                limits=opts.limits,
            )
        except SpawnError as exc:
            return failed(str(exc), path=path)
        except LineTooLong as exc:
            return failed(f"claude was stopped: {exc}", path=path, retryable=False)
        return await _outcome(ex, stream, opts, stream.session_id or session, path, emit)


async def _outcome(
    ex: Exit, stream: _Stream, opts: ClaudeCodeOptions, session: str, path: str, emit: Emit
) -> TurnResult:
    res = stream.result
    if res is None:
        if ex.timed_out:
            return failed(
                ex.with_stderr(f"claude did not finish within {opts.limits.timeout:g} s"),
                session=session,
                path=path,
            )
        if ex.signal in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL, signal.SIGHUP):
            return TurnResult(
                CANCELED,
                text=f"claude {ex.describe()} before finishing the turn; resuming session "
                f"{session} continues it",
                retryable=True,
                session=session,
                path=path,
            )
        noise = f"; output: {' | '.join(stream.noise)}" if stream.noise else ""
        return failed(
            ex.with_stderr(f"claude {ex.describe()} without a result{noise}"),
            retryable=not _REFUSALS.search(ex.stderr),
            session=session,
            path=path,
        )
    usage = _usage(res)
    if usage:
        await emit(Progress("usage", "", usage))
    denials = res.get("permission_denials")
    if isinstance(denials, list) and denials:
        tools = sorted({str(d.get("tool_name")) for d in denials if isinstance(d, dict)})
        await emit(
            Progress(
                "status",
                f"the unattended profile (permission mode {opts.permission_mode}) denied "
                f"{len(denials)} tool call(s): {', '.join(tools)}",
                {"permission_denials": denials},
            )
        )
    answer = res.get("result")
    text = answer if isinstance(answer, str) else stream.last_text
    if res.get("terminal_reason") == "aborted_streaming":
        return TurnResult(
            CANCELED, text=text, retryable=True, session=session, usage=usage, path=path
        )
    if res.get("is_error") is True or ex.returncode != 0:
        errors = res.get("errors")
        detail = (
            "; ".join(str(e) for e in errors)
            if isinstance(errors, list) and errors
            else text or stream.api_error or str(res.get("subtype"))
        )
        reason = res.get("terminal_reason") or res.get("subtype")
        return failed(
            ex.with_stderr(f"claude reported an error ({reason}): {detail}"),
            text=text,
            session=session,
            usage=usage,
            path=path,
        )
    return TurnResult(COMPLETED, text=text, session=session, usage=usage, path=path)
