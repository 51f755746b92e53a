"""The ``command`` runtime: any program, one run per turn.

The prompt goes to the program on stdin (unless ``prompt_on_stdin`` is false) and,
with the envelope, in ``MELCHIOR_TURN_*`` environment variables; what it prints on
stdout is the answer. No shell is involved: ``argv`` is executed as given, so nothing
in a prompt or a sender's name can become shell syntax.

With ``stdout = "parts"`` stdout is not text but a JSON array of A2A parts (text, file
bytes in base64 with a filename and media type, a file URL, structured data), the
``stdout`` artifact's parts as they are, for a program whose answer is a file or data.

Exit codes say how the turn ended, so a script can take part without any library:

====================  ================================================================
exit status           result
====================  ================================================================
0                     completed; stdout is the answer (and a ``stdout`` artifact)
3 (input_required_exit)  input_required; stdout is the question
reply_exit (none)     completed as a direct reply: stdout is the agent's message, and a
                      blocking A2A send gets that message back instead of a task
4 (permanent_exit)    failed, not to be retried (the input itself is the problem)
any other             failed; retried when ``retryable`` (default true)
killed by a signal    failed, retryable (something outside stopped it)
====================  ================================================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from melchior.a2a_message import PartError, read_part, text_of
from melchior.policy import route_options as ro
from melchior.runtimes.base import (
    COMPLETED,
    INPUT_REQUIRED,
    Emit,
    Progress,
    RuntimeConfigError,
    Turn,
    TurnResult,
    failed,
    text_artifact,
)
from melchior.runtimes.options import OptionReader, layered
from melchior.runtimes.process import (
    PROCESS_OPTIONS,
    PROCESS_RULES,
    Limits,
    LineTooLong,
    SpawnError,
    compose_env,
    read_limits,
    require_program,
    run_process,
)

NAME = "command"
ENV_PREFIX = "MELCHIOR_TURN_"
PROMPT_ENV_LIMIT = 64 * 1024
"""The prompt is put in ``MELCHIOR_TURN_PROMPT`` only up to this many bytes: Linux
refuses to start a program with one environment string over 128 KiB, and stdin always
carries the whole prompt anyway."""

DEFAULT_OUTPUT_LIMIT = 4 * 1024 * 1024
OPTIONS = (
    *PROCESS_OPTIONS,
    "argv",
    "input_required_exit",
    "permanent_exit",
    "reply_exit",
    "retryable",
    "output_limit",
    "progress_lines",
    "prompt_on_stdin",
    "stdout",
)
ROUTE_RULES: dict[str, ro.RouteOption] = {
    **PROCESS_RULES,
    # argv[0] is resolved on the receiver's machine and judged against allow.programs; the
    # arguments are the allowed program's own interface (allow a program only when any
    # arguments to it are acceptable: never an interpreter or a shell)
    "argv": ro.program(),
    "input_required_exit": ro.free(),
    "permanent_exit": ro.free(),
    "reply_exit": ro.free(),
    "retryable": ro.free(),
    "output_limit": ro.limit(DEFAULT_OUTPUT_LIMIT),
    "progress_lines": ro.free(),
    "prompt_on_stdin": ro.free(),
    "stdout": ro.free(),
}
"""What a relay route may do with each option (:mod:`melchior.policy.route_options`)."""


@dataclass(frozen=True)
class CommandOptions:
    argv: tuple[str, ...]
    limits: Limits
    env: Mapping[str, str]
    input_required_exit: int | None
    permanent_exit: int | None
    reply_exit: int | None
    retryable: bool
    output_limit: int
    progress_lines: bool
    prompt_on_stdin: bool
    parts: bool
    """``stdout = "parts"``: stdout is a JSON array of A2A parts, not text."""

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> CommandOptions:
        r = OptionReader(NAME, raw, OPTIONS)
        argv = r.texts("argv")
        if not argv:
            raise RuntimeConfigError(
                f"{NAME}: option argv is required: the program and its arguments as a list"
            )
        codes = {"input_required_exit": 3, "permanent_exit": 4, "reply_exit": None}
        chosen: dict[str, int | None] = {}
        for key, default in codes.items():
            chosen[key] = default if key not in raw else r.opt_integer(key, low=1, high=255)
            if chosen[key] is not None and chosen[key] in list(chosen.values())[:-1]:
                taken = ", ".join(k for k in chosen if k != key)
                raise RuntimeConfigError(
                    f"{NAME}: {key} must differ from {taken} (each exit status says one thing)"
                )
        return cls(
            argv=argv,
            limits=read_limits(r),
            env=r.env_map("env"),
            input_required_exit=chosen["input_required_exit"],
            permanent_exit=chosen["permanent_exit"],
            reply_exit=chosen["reply_exit"],
            retryable=r.flag("retryable", True),
            output_limit=r.integer("output_limit", DEFAULT_OUTPUT_LIMIT, low=1, high=1 << 30),
            progress_lines=r.flag("progress_lines", False),
            prompt_on_stdin=r.flag("prompt_on_stdin", True),
            parts=_stdout_kind(raw.get("stdout", "text")) == "parts",
        )


def _stdout_kind(value: Any) -> str:
    if value not in ("text", "parts"):
        raise RuntimeConfigError(
            f'{NAME}: option stdout must be "text" (the answer is stdout\'s text) or'
            f' "parts" (stdout is a JSON array of A2A parts), got {value!r}'
        )
    return str(value)


def stdout_parts(text: str) -> tuple[list[dict[str, Any]] | None, str]:
    """The A2A parts a program printed as a JSON array, and what they say as text; None
    and the reason when stdout is not that (the turn then fails, naming it)."""
    try:
        parts = json.loads(text)
    except ValueError as exc:
        return None, f"its stdout is not JSON ({exc})"
    if not isinstance(parts, list) or not parts:
        return None, "its stdout is not a non-empty JSON array of A2A parts"
    for i, part in enumerate(parts):
        try:
            read_part(part, wire=False)  # what melchior emits: ProtoJSON's canonical form
        except PartError as exc:
            return None, f"part {i} of its stdout: {exc}"
    return parts, text_of(parts)


def turn_env(turn: Turn) -> dict[str, str]:
    """The ``MELCHIOR_TURN_*`` variables for ``turn`` (absent = not known).

    Raises ValueError for a value that cannot travel in an environment (a NUL).
    """
    env: dict[str, str] = {}

    def put(name: str, value: str | None) -> None:
        if value is None:
            return
        if "\0" in value:
            raise ValueError(f"{ENV_PREFIX}{name} would contain a NUL character")
        env[ENV_PREFIX + name] = value

    if len(turn.prompt.encode("utf-8", "surrogatepass")) <= PROMPT_ENV_LIMIT:
        put("PROMPT", turn.prompt)
    put("SESSION", turn.session)
    msg = turn.message
    if msg is not None:
        put("SENDER", msg.sender)
        put("RECIPIENT", msg.recipient)
        put("SORT", msg.sort)
        put("MESSAGE_ID", msg.message_id)
        put("CONTEXT", msg.context)
        put("ABOUT", msg.about)
        if msg.chain is not None:
            put("CHAIN", json.dumps(msg.chain.as_dict(), ensure_ascii=False))
    return env


class _TooMuchOutput(Exception):
    pass


class CommandRuntime:
    """Runs ``argv`` once per turn; see the module docstring for the exit-code contract."""

    name = NAME

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        CommandOptions.parse(self.config)  # a bad configuration fails at start-up

    async def run(self, turn: Turn, emit: Emit) -> TurnResult:
        try:
            opts = CommandOptions.parse(layered(self.config, turn.options))
            extra = turn_env(turn)
        except (RuntimeConfigError, ValueError) as exc:
            return failed(str(exc), path=NAME)
        if "\0" in turn.prompt:
            return failed("the prompt contains a NUL character", path=NAME)
        env = compose_env(opts.env, turn.env, extra, drop_prefix=ENV_PREFIX)
        try:
            program = require_program(opts.argv[0], env)
        except RuntimeConfigError as exc:
            return failed(str(exc), path=NAME)
        stdout = bytearray()

        async def on_line(line: bytes) -> None:
            if len(stdout) + len(line) > opts.output_limit:
                raise _TooMuchOutput
            stdout.extend(line)
            if opts.progress_lines:
                await emit(Progress("status", line.decode("utf-8", "replace").rstrip("\r\n")))

        async def on_start(pid: int) -> None:
            await emit(Progress("status", f"started {opts.argv[0]} (pid {pid})", {"pid": pid}))

        try:
            ex = await run_process(
                [program, *opts.argv[1:]],
                cwd=turn.cwd,
                env=env,
                stdin=turn.prompt.encode("utf-8", "surrogatepass")
                if opts.prompt_on_stdin
                else None,
                on_line=on_line,
                on_start=on_start,
                limits=opts.limits,
            )
        except SpawnError as exc:
            return failed(str(exc), path=NAME)
        except LineTooLong as exc:
            return failed(f"{opts.argv[0]} was stopped: {exc}", path=NAME)
        except _TooMuchOutput:
            return failed(
                f"{opts.argv[0]} was stopped: its output was longer than {opts.output_limit} bytes",
                path=NAME,
            )
        text = stdout.decode("utf-8", "replace").rstrip("\r\n")
        artifacts = (text_artifact("stdout", text),) if text else ()
        prog = opts.argv[0]
        if opts.parts and ex.returncode == 0 and not ex.timed_out:
            parts, said = stdout_parts(text)
            if parts is None:
                return failed(f'{prog} answered with stdout = "parts", but {said}', path=NAME)
            text, artifacts = said, ({"artifactId": "stdout", "name": "stdout", "parts": parts},)
        if ex.timed_out:
            return failed(
                ex.with_stderr(f"{prog} did not finish within {opts.limits.timeout:g} s"),
                path=NAME,
            )
        if ex.returncode == 0:
            return TurnResult(COMPLETED, text=text, artifacts=artifacts, path=NAME)
        if ex.returncode == opts.reply_exit:
            return TurnResult(COMPLETED, text=text, path=NAME, reply=True)
        if ex.returncode == opts.input_required_exit:
            return TurnResult(INPUT_REQUIRED, text=text, artifacts=artifacts, path=NAME)
        retryable = ex.returncode < 0 or (opts.retryable and ex.returncode != opts.permanent_exit)
        return failed(
            ex.with_stderr(f"{prog} {ex.describe()}"),
            retryable=retryable,
            text=text,
            artifacts=artifacts,
            path=NAME,
        )
