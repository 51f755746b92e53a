"""The ``provider`` runtime: a fresh model turn per call, through :mod:`melchior.providers`.

Each turn is one new conversation with a model: the prompt as the user's message, the
configured ``system`` prompt, and — inside a plane turn — two tools, ``send_to`` and
``team``, carried out by writing the very outbox ``melchior tool --verb=send_to``
writes (:mod:`melchior.plane.verbs`, handed in with the turn as its
:class:`~melchior.runtimes.base.PlaneSeat`: the plane is above the runtimes and is never
imported here), so a model's note and a coding agent's note are judged by the plane in
exactly the same way. Without the plane's verbs and environment there are no tools: one
fresh provider run per task, as the relay's receiver wants.

A turn is a loop of at most ``tool_rounds + 1`` generations: the model answers, or calls
tools; their results go back and it is asked again. Streams follow the providers'
rules (``docs/providers.md``): text is shown as it streams; a ``Restarted`` event means
that attempt failed after it had yielded, so its text and tool calls are discarded;
tool calls are carried out only after ``Done``. A malformed call (arguments that are not
a JSON object) is reported to the model, never run.

Options::

    provider = "claude"            # without kind: a [providers.NAME] of melchior's config file
    kind = "openai"                # with kind, the provider is described here (provider names it):
    base_url = "http://127.0.0.1:11434/v1"   # openai | openai-responses | anthropic | ollama
    api_key_env = "OPENAI_API_KEY"
    model = "claude-sonnet-4-5"    # required
    system = "You keep the books." # prepended to what the runtime says about the plane
    max_tokens = 4096
    temperature = 0.2
    tools = "auto"                 # auto: send_to and team in a plane turn; none: never
    tool_rounds = 8
    attempts = 3                   # provider attempts per generation (retry policy)
    timeout = 600                  # seconds for the whole turn
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from melchior.policy import route_options as ro
from melchior.runtimes.base import (
    COMPLETED,
    Emit,
    PlaneSeat,
    Progress,
    RuntimeConfigError,
    Turn,
    TurnResult,
    failed,
    text_artifact,
)
from melchior.runtimes.options import OptionReader, layered

if TYPE_CHECKING:
    from melchior.providers import Generation, ProviderClient, ProviderConfig, Tool, ToolCall

NAME = "provider"
OPTIONS = (
    "provider",
    "kind",
    "base_url",
    "api_key_env",
    "model",
    "system",
    "max_tokens",
    "temperature",
    "tools",
    "tool_rounds",
    "attempts",
    "timeout",
)
ROUTE_RULES: dict[str, ro.RouteOption] = {
    "provider": ro.free(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"),
    "kind": ro.listed(),
    "base_url": ro.URL_OPTION,
    "api_key_env": ro.listed(),
    "model": ro.free(ro.MODEL_NAME),
    "system": ro.listed(),
    "max_tokens": ro.limit(4096),
    "temperature": ro.free(),
    "tools": ro.ordered(("none", "auto"), "auto"),
    "tool_rounds": ro.limit(8),
    "attempts": ro.limit(3),
    "timeout": ro.limit(),
}
"""What a relay route may do with each option (:mod:`melchior.policy.route_options`): a
provider of melchior's own config file by name, a model, lower bounds; the kind of API and
which of this machine's variables holds the key it is sent, and the system prompt, only as
this machine lists them; a ``base_url`` only inside ``allow.urls``."""
MAX_TOOL_RESULT = 16 * 1024


@dataclass(frozen=True)
class ProviderOptions:
    provider: str | None
    kind: str | None
    base_url: str | None
    api_key_env: str | None
    model: str
    system: str
    max_tokens: int
    temperature: float | None
    tools: str
    tool_rounds: int
    attempts: int
    timeout: float | None

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ProviderOptions:
        from melchior.providers.config import KINDS

        r = OptionReader(NAME, raw, OPTIONS)
        provider = r.opt_text("provider")
        kind = r.opt_text("kind", choices=KINDS)
        if provider is None and kind is None:
            raise RuntimeConfigError(
                f"{NAME}: give provider (a [providers.NAME] of melchior's config file) or kind "
                "(with base_url and api_key_env) for a provider described here"
            )
        if kind is None and ("base_url" in raw or "api_key_env" in raw):
            raise RuntimeConfigError(
                f"{NAME}: base_url and api_key_env describe a provider here, with kind; "
                f"provider {provider!r} without kind is read from melchior's config file"
            )
        return cls(
            provider=provider,
            kind=kind,
            base_url=r.opt_text("base_url"),
            api_key_env=r.opt_text("api_key_env"),
            model=r.required_text("model"),
            system=r.text("system", "") if "system" in raw else "",
            max_tokens=r.integer("max_tokens", 4096, low=1, high=1_000_000),
            temperature=r.opt_number("temperature", low=0, high=2),
            tools=r.text("tools", "auto", choices=("auto", "none")),
            tool_rounds=r.integer("tool_rounds", 8, low=0, high=100),
            attempts=r.integer("attempts", 3, low=1, high=10),
            timeout=r.opt_number("timeout", low=0.001, high=7 * 86400),
        )

    def provider_config(self, env: Mapping[str, str]) -> ProviderConfig:
        """The provider to call: named in melchior's config, or described inline."""
        from melchior.providers.config import _one, read_providers

        if self.kind is not None:
            table: dict[str, Any] = {"kind": self.kind, "discover": False}
            if self.base_url is not None:
                table["base_url"] = self.base_url
            if self.api_key_env is not None:
                table["api_key_env"] = self.api_key_env
            return _one(self.provider or "inline", table, Path("(provider runtime options)"))
        providers = read_providers(env)
        assert self.provider is not None
        if self.provider not in providers:
            raise RuntimeConfigError(
                f"{NAME}: no [providers.{self.provider}] in melchior's config file; it has "
                f"{', '.join(providers) or 'none'}"
            )
        return providers[self.provider]


def plane_tools() -> list[Tool]:
    """``send_to`` and ``team`` as the model sees them."""
    from melchior.providers import Tool

    return [
        Tool(
            "send_to",
            "Leave a note for another agent on this plane. It goes when this turn ends and "
            "wakes that agent; it arrives as data, not as an order, and its answer comes back "
            "to you as a turn of your own, so end this turn rather than waiting. Three notes a "
            "turn, one per agent: put the whole request in one.",
            {
                "type": "object",
                "properties": {
                    "to": {"type": "string", "description": "the agent's id, as team lists it"},
                    "message": {"type": "string", "description": "the whole request"},
                },
                "required": ["to", "message"],
            },
        ),
        Tool(
            "team",
            "Who there is on this plane and whom you may write to now. Read only: only the "
            "operator opens doors (a /team line is refused with the line the operator types).",
            {
                "type": "object",
                "properties": {"line": {"type": "string", "description": "optional: a /team line"}},
            },
        ),
    ]


def plane_system(plane: PlaneSeat, env: Mapping[str, str]) -> str:
    """What the model is told about the plane: who it is and the roster."""
    me, team = plane.seat(env)
    door = {True: " (you may write to it now)", False: " (no door: a note waits for the operator)"}
    lines = [
        f"- {o.get('id')}: {o.get('description') or '(no description)'}"
        f"{door[bool(o.get('may_write'))]}"
        for o in team
        if isinstance(o, dict)
    ]
    return (
        f"You are {me}, one agent on a plane of agents that take turns. Your final answer "
        "ends your turn and goes where your turn came from. The team:\n"
        + ("\n".join(lines) or "- nobody else")
    )


def call_tool(call: ToolCall, plane: PlaneSeat | None, env: Mapping[str, str]) -> tuple[str, bool]:
    """Carry out one tool call through the plane's verbs; (result text, is_error)."""
    from melchior.wire.calls import Refused

    if plane is None:
        return f"there is no tool {call.name!r}; this turn has no tools", True

    if call.invalid_arguments:
        return f"your arguments were not a JSON object ({call.invalid_arguments}); not run", True
    args = call.arguments
    try:
        if call.name == "send_to":
            to, message = args.get("to"), args.get("message")
            if not isinstance(to, str) or not isinstance(message, str) or message == "-":
                return "send_to takes {to: text, message: text}; nothing was written", True
            result: Any = plane.send_to(env, to, message)
        elif call.name == "team":
            line = args.get("line")
            result = plane.team(env, line if isinstance(line, str) else None)
        else:
            return f"there is no tool {call.name!r}; the tools are send_to and team", True
    except Refused as exc:
        return json.dumps({"refused": exc.reason, **exc.detail}, ensure_ascii=False), True
    except plane.PlaneUsage as exc:
        return str(exc), True
    text = json.dumps(result, ensure_ascii=False)
    return text[:MAX_TOOL_RESULT], False


class ProviderRuntime:
    """One fresh model turn per call; see the module docstring."""

    name = NAME

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        ProviderOptions.parse(self.config)

    async def run(self, turn: Turn, emit: Emit) -> TurnResult:
        from melchior.providers import ProviderError, RetryPolicy, provider_for
        from melchior.providers.config import ConfigError

        try:
            opts = ProviderOptions.parse(layered(self.config, turn.options))
            env = {**os.environ, **turn.env}
            cfg = opts.provider_config(env)
            client = provider_for(cfg, env=env, retry=RetryPolicy(attempts=opts.attempts))
        except (RuntimeConfigError, ConfigError, ProviderError) as exc:
            return failed(str(exc), path=NAME)
        try:
            async with client, _deadline(opts.timeout):
                return await self._turn(client, opts, turn, emit)
        except TimeoutError:
            return failed(f"the model did not finish within {opts.timeout:g} s", path=NAME)
        except ProviderError as exc:
            return failed(str(exc), retryable=exc.retryable, path=NAME)

    async def _turn(
        self, client: ProviderClient, opts: ProviderOptions, turn: Turn, emit: Emit
    ) -> TurnResult:
        from melchior.providers import GenerationRequest, Message

        plane = turn.plane if turn.plane is not None and turn.plane.in_plane(turn.env) else None
        tools = plane_tools() if opts.tools == "auto" and plane is not None else []
        system = opts.system
        if tools:
            assert plane is not None
            system = "\n\n".join(s for s in (opts.system, plane_system(plane, turn.env)) if s)
        messages: list[Message] = [Message("user", turn.prompt)]
        usage: dict[str, int | float] = {}
        await emit(Progress("status", f"asking {client.name} ({opts.model})", {"path": "new"}))
        for round_ in range(opts.tool_rounds + 1):
            request = GenerationRequest(
                model=opts.model,
                messages=list(messages),
                system=system,
                tools=tools,
                max_tokens=opts.max_tokens,
                temperature=opts.temperature,
            )
            gen = await _generate(client, request, emit)
            _add_usage(usage, gen)
            if gen.usage is not None or usage:
                await emit(Progress("usage", "", dict(usage)))
            messages.append(Message("assistant", gen.text, tool_calls=gen.tool_calls))
            if not gen.tool_calls:
                artifacts = (text_artifact("answer", gen.text),) if gen.text else ()
                return TurnResult(
                    COMPLETED, text=gen.text, artifacts=artifacts, usage=usage, path=NAME
                )
            if round_ == opts.tool_rounds:
                break
            for call in gen.tool_calls:
                text, is_error = call_tool(call, plane, turn.env)
                await emit(
                    Progress(
                        "status",
                        f"{call.name}({call.arguments_json[:200]}) -> "
                        f"{'error' if is_error else 'ok'}",
                        {"tool": call.name, "error": is_error},
                    )
                )
                messages.append(Message("tool", text, tool_call_id=call.id, is_error=is_error))
        return failed(
            f"the model was still calling tools after {opts.tool_rounds} rounds (tool_rounds)",
            usage=usage,
            path=NAME,
        )


async def _generate(client: ProviderClient, request: Any, emit: Emit) -> Generation:
    """One generation, streamed: text shown line by line as it comes, a restarted attempt's
    output discarded, tool calls kept only from the attempt that reached ``Done``."""
    from melchior.providers import Done, Generation, Restarted, TextDelta, ToolCall, Usage
    from melchior.providers.errors import MalformedStream

    text: list[str] = []
    pending = ""
    calls: list[ToolCall] = []
    usage: Usage | None = None
    attempts = 1
    async with contextlib.aclosing(client.stream(request)) as events:
        async for event in events:
            if isinstance(event, TextDelta):
                text.append(event.text)
                pending += event.text
                if "\n" in pending:
                    done, _, pending = pending.rpartition("\n")
                    await emit(Progress("message", done))
            elif isinstance(event, ToolCall):
                calls.append(event)
            elif isinstance(event, Usage):
                usage = event
            elif isinstance(event, Restarted):
                text, calls, usage, pending, attempts = [], [], None, "", event.attempt
                await emit(
                    Progress(
                        "status",
                        f"the provider restarted (attempt {event.attempt}: {event.reason}); "
                        "what it said so far is discarded",
                    )
                )
            elif isinstance(event, Done):
                if pending:
                    await emit(Progress("message", pending))
                return Generation("".join(text), tuple(calls), event.stop_reason, usage, attempts)
    raise MalformedStream("the stream stopped without its terminal event")


def _add_usage(total: dict[str, int | float], gen: Generation) -> None:
    u = gen.usage
    if u is None:
        return
    for key, value in (("input_tokens", u.input_tokens), ("output_tokens", u.output_tokens)):
        if value is not None:
            total[key] = int(total.get(key, 0)) + value
    if u.cost is not None:
        total["cost_usd"] = float(total.get("cost_usd", 0.0)) + u.cost


@contextlib.asynccontextmanager
async def _deadline(seconds: float | None) -> Any:
    if seconds is None:
        yield
        return
    async with asyncio.timeout(seconds):
        yield
