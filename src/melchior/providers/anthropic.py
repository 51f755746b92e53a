"""Anthropic Messages, streamed.

The stream is named events: ``message_start`` (input usage), then per content block
``content_block_start`` / ``content_block_delta`` / ``content_block_stop``, then
``message_delta`` (stop reason, output usage) and ``message_stop``, the terminal event:
nothing counts as finished before it. ``ping`` keeps the connection alive and carries
nothing; ``error`` is the provider failing mid-stream (``overloaded_error`` is worth
retrying). A ``tool_use`` block streams its input as ``input_json_delta`` fragments of
one JSON text; the call is yielded, complete and parsed, at its ``content_block_stop``.
Unknown events and block types (thinking, citations, whatever comes next) are skipped.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from melchior.providers.client import (
    ProviderClient,
    ToolArguments,
    count,
    event_json,
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

API_VERSION = "2023-06-01"
TERMINAL = "message_stop"
RETRYABLE_CODES = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})
LISTING_PAGES = 50
"""Pages of 1000 models at most: a listing that never ends is not followed forever."""


def anthropic_messages(messages: list[Message] | tuple[Message, ...]) -> list[dict[str, Any]]:
    """The conversation as Messages turns: tool results go back as ``user`` content.

    Consecutive messages that map to the same role are merged into one turn, so a run
    of tool results (and a note after them) reaches the model as one user turn, as the
    API expects after an assistant turn that made several calls.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return out


def _blocks(message: Message) -> list[dict[str, Any]]:
    if message.role == "tool":
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": message.tool_call_id,
            "content": message.text,
        }
        if message.is_error:
            block["is_error"] = True
        return [block]
    blocks: list[dict[str, Any]] = []
    if message.text:
        blocks.append({"type": "text", "text": message.text})
    for call in message.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.arguments)}
        )
    return blocks


@dataclass
class _Block:
    id: str
    name: str
    parts: list[str] = field(default_factory=list)
    given: Any = None


class _Events:
    """What one attempt has assembled so far."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.tools: dict[int, _Block] = {}
        self.arguments = ToolArguments(provider)
        self.stop: str | None = None
        self.usage: dict[str, int | None] = {}

    def feed(self, kind: str, event: dict[str, Any]) -> list[GenerationEvent]:
        out: list[GenerationEvent] = []
        index = event.get("index")
        if kind == "content_block_start":
            block = event.get("content_block")
            if isinstance(block, dict) and isinstance(index, int):
                if block.get("type") == "tool_use":
                    self.tools[index] = _Block(
                        str(block.get("id") or f"toolu_{index}"),
                        str(block.get("name") or ""),
                        given=block.get("input"),
                    )
                elif block.get("type") == "text" and isinstance(block.get("text"), str):
                    out += [TextDelta(block["text"])] if block["text"] else []
        elif kind == "content_block_delta":
            delta = event.get("delta")
            if isinstance(delta, dict):
                if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                    if delta["text"]:
                        out.append(TextDelta(delta["text"]))
                elif delta.get("type") == "input_json_delta" and index in self.tools:
                    fragment = delta.get("partial_json")
                    if isinstance(fragment, str):
                        self.arguments.add(self.tools[index].parts, fragment)
        elif kind == "content_block_stop":
            if isinstance(index, int) and index in self.tools:
                tool = self.tools.pop(index)
                out.append(tool_call(tool.id, tool.name, "".join(tool.parts), tool.given))
        elif kind == "message_start":
            message = event.get("message")
            if isinstance(message, dict):
                self._usage(message.get("usage"))
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                self.stop = delta["stop_reason"]
            self._usage(event.get("usage"))
        elif kind == "error":
            error = event.get("error")
            code = safe_code(error.get("type") if isinstance(error, dict) else None)
            raise StreamError(
                f"provider {self.provider!r} reported an error in the stream ({code})",
                code=code,
                retryable=code in RETRYABLE_CODES,
                provider=self.provider,
            )
        return out

    def _usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            for key in (
                "input_tokens",
                "output_tokens",
                "cache_read_input_tokens",
                "cache_creation_input_tokens",
            ):
                value = count(usage.get(key))
                if value is not None:
                    self.usage[key] = value  # later counts are cumulative: the last wins

    def finished(self) -> list[GenerationEvent]:
        out: list[GenerationEvent] = []
        if self.usage:
            out.append(
                Usage(
                    input_tokens=self.usage.get("input_tokens"),
                    output_tokens=self.usage.get("output_tokens"),
                    cache_read_tokens=self.usage.get("cache_read_input_tokens"),
                    cache_write_tokens=self.usage.get("cache_creation_input_tokens"),
                )
            )
        out.append(Done(self.stop or "unknown"))
        return out


class AnthropicMessages(ProviderClient):
    """``POST {base_url}/v1/messages`` with ``stream: true``; models at ``/v1/models``."""

    kind = "anthropic"

    def api_base(self, base_url: str) -> str:
        trimmed = base_url.rstrip("/")
        return trimmed[:-3] if trimmed.endswith("/v1") else base_url

    def headers(self, key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": API_VERSION}
        if key:
            headers["x-api-key"] = key
        return headers

    def body(self, request: GenerationRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "messages": anthropic_messages(tuple(request.messages)),
            "stream": True,
        }
        if request.system:
            body["system"] = request.system
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.tools:
            body["tools"] = [
                {
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": dict(tool.parameters),
                }
                for tool in request.tools
            ]
        return body

    async def attempt(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        state = _Events(self.name)
        events = self.http.events("v1/messages", self.body(request))
        async with contextlib.aclosing(events):
            async for event in events:
                data = event_json(event, self.name)
                kind = data.get("type") if isinstance(data.get("type"), str) else event.event
                if kind == TERMINAL:
                    for item in state.finished():
                        yield item
                    return
                for item in state.feed(str(kind), data):
                    yield item
        raise MalformedStream(
            f"provider {self.name!r}: the stream ended without {TERMINAL}", provider=self.name
        )

    async def list_once(self) -> list[ModelCard]:
        cards: list[ModelCard] = []
        params = {"limit": "1000"}
        for _ in range(LISTING_PAGES):
            page = await self.http.get_json("v1/models", params=params)
            data = page.get("data") if isinstance(page, dict) else None
            if not isinstance(data, list):
                raise self.malformed("the model listing has no 'data' list")
            for entry in data:
                if not isinstance(entry, dict):
                    continue
                card = self.card(
                    entry.get("id"),
                    display_name=short_text(entry.get("display_name")),
                    context_window=count(entry.get("max_input_tokens")),
                    created=short_text(entry.get("created_at"), 64),
                )
                if card is not None:
                    cards.append(card)
            self.check_listing(cards)
            last = page.get("last_id")
            if page.get("has_more") is not True or not isinstance(last, str) or not last:
                return cards
            params = {"limit": "1000", "after_id": last}
        raise self.malformed(f"the model listing runs past {LISTING_PAGES} pages")
