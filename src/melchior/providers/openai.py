"""OpenAI-compatible chat completions, streamed: OpenAI itself, Ollama, and the many
servers that speak the same API.

A stream is ``data:`` events of ``chat.completion.chunk`` objects and then
``data: [DONE]``, the terminal event: nothing counts as finished before it. Text comes
in ``choices[0].delta.content``; a tool call arrives as fragments under
``delta.tool_calls[i]`` keyed by ``index`` — the id and name once, the arguments as
pieces of one JSON text — so calls are assembled here and yielded, complete and parsed,
when ``[DONE]`` arrives. Usage comes in a last chunk with empty ``choices`` because
the request asks for it (``stream_options.include_usage``); ``usage.cost`` is reported
when the server adds it (OpenRouter does).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from melchior.providers.client import (
    ProviderClient,
    ToolArguments,
    count,
    event_json,
    money,
    short_text,
    tool_call,
)
from melchior.providers.errors import MalformedStream, StreamError, safe_code
from melchior.providers.types import (
    Done,
    GenerationEvent,
    GenerationRequest,
    Message,
    ModelCard,
    TextDelta,
    Usage,
)

TERMINAL = "[DONE]"
RETRYABLE_CODES = frozenset(
    {"server_error", "api_error", "internal_error", "overloaded", "overloaded_error",
     "rate_limit_exceeded", "rate_limit_error", "timeout", "service_unavailable"}
)  # fmt: skip


def chat_messages(request: GenerationRequest) -> list[dict[str, Any]]:
    """The conversation in chat-completions form (system first, tool results as ``tool``)."""
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    for message in request.messages:
        out.append(_message(message))
    return out


def _message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.text}
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            "content": message.text or None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments_json},
                }
                for call in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.text}


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)
    given: Any = None


class _Chunks:
    """What one attempt has assembled so far."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.calls: dict[int, _Call] = {}
        self.arguments = ToolArguments(provider)
        self.finish: str | None = None
        self.usage: Usage | None = None

    def feed(self, chunk: dict[str, Any]) -> list[GenerationEvent]:
        error = chunk.get("error")
        if error is not None:
            detail = error if isinstance(error, dict) else {}
            code = safe_code(detail.get("type") or detail.get("code"))
            raise StreamError(
                f"provider {self.provider!r} reported an error in the stream ({code})",
                code=code,
                retryable=code in RETRYABLE_CODES,
                provider=self.provider,
            )
        out: list[GenerationEvent] = []
        choices = chunk.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict) and choice.get("index", 0) == 0:
                    self._choice(choice, out)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            details = usage.get("prompt_tokens_details")
            cached = count(details.get("cached_tokens")) if isinstance(details, dict) else None
            self.usage = Usage(
                input_tokens=count(usage.get("prompt_tokens")),
                output_tokens=count(usage.get("completion_tokens")),
                cache_read_tokens=cached,
                cost=money(usage.get("cost")),
            )
        return out

    def _choice(self, choice: dict[str, Any], out: list[GenerationEvent]) -> None:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if isinstance(content, str) and content:
                out.append(TextDelta(content))
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for position, fragment in enumerate(calls):
                    if isinstance(fragment, dict):
                        self._fragment(position, fragment)
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            self.finish = reason

    def _fragment(self, position: int, fragment: dict[str, Any]) -> None:
        index = fragment.get("index")
        key = index if isinstance(index, int) and not isinstance(index, bool) else position
        call = self.calls.setdefault(key, _Call())
        if isinstance(fragment.get("id"), str) and fragment["id"]:
            call.id = fragment["id"]
        function = fragment.get("function")
        if not isinstance(function, dict):
            return
        name = function.get("name")
        if isinstance(name, str) and name and name != call.name:
            call.name = call.name + name if call.name and not call.parts else name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            self.arguments.add(call.parts, arguments)
        elif isinstance(arguments, dict):
            call.given = arguments

    def finished(self) -> list[GenerationEvent]:
        out: list[GenerationEvent] = []
        for key in sorted(self.calls):
            call = self.calls[key]
            out.append(
                tool_call(call.id or f"call_{key}", call.name, "".join(call.parts), call.given)
            )
        if self.usage is not None:
            out.append(self.usage)
        out.append(Done(self.finish or "unknown"))
        return out


class OpenAIChat(ProviderClient):
    """``POST {base_url}/chat/completions`` with ``stream: true``; models at ``/models``."""

    kind = "openai"
    chat_path = "chat/completions"
    max_tokens_field = "max_completion_tokens"

    def headers(self, key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"} if key else {}

    def body(self, request: GenerationRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model,
            "messages": chat_messages(request),
            "stream": True,
            "stream_options": {"include_usage": True},
            self.max_tokens_field: request.max_tokens,
        }
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": dict(tool.parameters),
                    },
                }
                for tool in request.tools
            ]
        return body

    async def attempt(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        chunks = _Chunks(self.name)
        events = self.http.events(self.chat_path, self.body(request))
        async with contextlib.aclosing(events):
            async for event in events:
                if event.data == TERMINAL:
                    for item in chunks.finished():
                        yield item
                    return
                for item in chunks.feed(event_json(event, self.name)):
                    yield item
        raise MalformedStream(
            f"provider {self.name!r}: the stream ended without {TERMINAL}", provider=self.name
        )

    async def list_once(self) -> list[ModelCard]:
        listing = await self.http.get_json("models")
        data = listing.get("data") if isinstance(listing, dict) else listing
        if not isinstance(data, list):
            raise self.malformed("the model listing has no 'data' list")
        cards = []
        for entry in data:
            if not isinstance(entry, dict):
                continue
            card = self.card(
                entry.get("id"),
                display_name=short_text(entry.get("name") or entry.get("display_name")),
                context_window=count(entry.get("context_length") or entry.get("context_window")),
                created=_epoch(entry.get("created")),
                owned_by=short_text(entry.get("owned_by")),
            )
            if card is not None:
                cards.append(card)
        return self.check_listing(cards)


class OllamaChat(OpenAIChat):
    """Ollama: the OpenAI-compatible chat under ``/v1``, its own listing at ``/api/tags``.

    ``base_url`` is the server's root (``http://127.0.0.1:11434``); a trailing ``/v1``
    is tolerated.
    """

    kind = "ollama"
    chat_path = "v1/chat/completions"
    max_tokens_field = "max_tokens"

    def api_base(self, base_url: str) -> str:
        trimmed = base_url.rstrip("/")
        return trimmed[:-3] if trimmed.endswith("/v1") else base_url

    async def list_once(self) -> list[ModelCard]:
        listing = await self.http.get_json("api/tags")
        data = listing.get("models") if isinstance(listing, dict) else None
        if not isinstance(data, list):
            raise self.malformed("the model listing has no 'models' list")
        cards = []
        for entry in data:
            if not isinstance(entry, dict):
                continue
            raw_details = entry.get("details")
            details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
            card = self.card(
                entry.get("name") or entry.get("model"),
                modified=short_text(entry.get("modified_at"), 64),
                size=count(entry.get("size")),
                family=short_text(details.get("family"), 64),
                parameter_size=short_text(details.get("parameter_size"), 32),
                quantization=short_text(details.get("quantization_level"), 32),
            )
            if card is not None:
                cards.append(card)
        return self.check_listing(cards)


def _epoch(value: Any) -> str | None:
    """A Unix time as ISO 8601 UTC, or None when it is not a plausible one."""
    seconds = count(value)
    if seconds is None or seconds > 32503680000:  # year 3000
        return None
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


RESPONSES_TERMINAL = frozenset({"response.completed", "response.incomplete"})


def responses_input(request: GenerationRequest) -> list[dict[str, Any]]:
    """The conversation as Responses API input items (calls and outputs are items)."""
    out: list[dict[str, Any]] = []
    for message in request.messages:
        if message.role == "tool":
            out.append(
                {
                    "type": "function_call_output",
                    "call_id": message.tool_call_id,
                    "output": message.text,
                }
            )
            continue
        if message.text or not message.tool_calls:
            out.append({"role": message.role, "content": message.text})
        for call in message.tool_calls:
            out.append(
                {
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": call.arguments_json,
                }
            )
    return out


class _ResponseEvents:
    """What one Responses attempt has assembled so far."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.calls: dict[str, _Call] = {}  # by item id
        self.arguments = ToolArguments(provider)
        self.called = False

    def feed(self, kind: str, event: dict[str, Any]) -> list[GenerationEvent]:
        if kind == "response.output_text.delta":
            text = event.get("delta")
            return [TextDelta(text)] if isinstance(text, str) and text else []
        if kind in ("response.output_item.added", "response.output_item.done"):
            item = event.get("item")
            if not isinstance(item, dict) or item.get("type") != "function_call":
                return []
            key = str(item.get("id") or item.get("call_id") or "")
            call = self.calls.setdefault(key, _Call())
            call.id = str(item.get("call_id") or call.id or key)
            call.name = str(item.get("name") or call.name)
            if kind == "response.output_item.added":
                return []
            self.calls.pop(key, None)
            self.called = True
            whole = item.get("arguments")
            raw = whole if isinstance(whole, str) and whole else "".join(call.parts)
            return [tool_call(call.id, call.name, raw)]
        if kind == "response.function_call_arguments.delta":
            fragment = event.get("delta")
            key = str(event.get("item_id") or "")
            if isinstance(fragment, str):
                self.arguments.add(self.calls.setdefault(key, _Call()).parts, fragment)
            return []
        if kind in ("response.failed", "error"):
            response = event.get("response")
            error = response.get("error") if isinstance(response, dict) else event
            detail = error if isinstance(error, dict) else {}
            code = safe_code(detail.get("code") or detail.get("type"))
            raise StreamError(
                f"provider {self.provider!r} reported an error in the stream ({code})",
                code=code,
                retryable=code in RETRYABLE_CODES,
                provider=self.provider,
            )
        return []

    def finished(self, kind: str, event: dict[str, Any]) -> list[GenerationEvent]:
        response = event.get("response")
        body: dict[str, Any] = response if isinstance(response, dict) else {}
        out: list[GenerationEvent] = []
        usage = body.get("usage")
        if isinstance(usage, dict):
            details = usage.get("input_tokens_details")
            cached = count(details.get("cached_tokens")) if isinstance(details, dict) else None
            out.append(
                Usage(
                    input_tokens=count(usage.get("input_tokens")),
                    output_tokens=count(usage.get("output_tokens")),
                    cache_read_tokens=cached,
                    cost=money(usage.get("cost")),
                )
            )
        reason = "tool_calls" if self.called else "stop"
        if kind == "response.incomplete":
            details = body.get("incomplete_details")
            said = details.get("reason") if isinstance(details, dict) else None
            reason = said if isinstance(said, str) and said else "incomplete"
        out.append(Done(reason))
        return out


class OpenAIResponses(OpenAIChat):
    """The OpenAI Responses API: ``POST {base_url}/responses`` with ``stream: true``.

    Terminal events: ``response.completed`` (stop reason ``stop`` or ``tool_calls``)
    and ``response.incomplete`` (its reason, e.g. ``max_output_tokens``). A function
    call is yielded at its ``response.output_item.done``. Requests are sent with
    ``store: false``: the conversation travels in every request and is not kept.
    """

    kind = "openai-responses"

    def body(self, request: GenerationRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model,
            "input": responses_input(request),
            "stream": True,
            "store": False,
            "max_output_tokens": request.max_tokens,
        }
        if request.system:
            body["instructions"] = request.system
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": dict(tool.parameters),
                }
                for tool in request.tools
            ]
        return body

    async def attempt(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        state = _ResponseEvents(self.name)
        events = self.http.events("responses", self.body(request))
        async with contextlib.aclosing(events):
            async for event in events:
                data = event_json(event, self.name)
                kind = str(data.get("type") or event.event)
                if kind in RESPONSES_TERMINAL:
                    for item in state.finished(kind, data):
                        yield item
                    return
                for item in state.feed(kind, data):
                    yield item
        raise MalformedStream(
            f"provider {self.name!r}: the stream ended without response.completed",
            provider=self.name,
        )
