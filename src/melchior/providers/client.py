"""A provider client: one configured provider's streaming generation and model listing.

:func:`provider_for` picks the client for a :class:`ProviderConfig`'s ``kind``. Every
client offers the same three calls, so the relay's provider adapter and the plane's
provider runtime never branch on the provider:

- ``stream(request)`` — an async generator of
  :data:`~melchior.providers.types.GenerationEvent`, retried within the client's
  :class:`~melchior.providers.transport.RetryPolicy`; close it (``contextlib.aclosing``)
  or cancel its task and the request is closed;
- ``generate(request)`` — the same stream collected into a
  :class:`~melchior.providers.types.Generation`;
- ``list_models()`` — the provider's listing as model cards (no inference).

A client reports success only after its provider's terminal event; a stream that ends
without it raises :class:`~melchior.providers.errors.MalformedStream` (retryable), and
so does an event whose data is not JSON — a tail fragment such as
``{"partial_json":"fa`` is a failed attempt, never a partial success.
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, ClassVar

import httpx

from melchior.providers.config import ProviderConfig
from melchior.providers.errors import MalformedResponse, MalformedStream, ResponseTooLarge
from melchior.providers.sse import SSEEvent
from melchior.providers.transport import Limits, ProviderHTTP, RetryPolicy, retry_call, retrying
from melchior.providers.types import (
    Generation,
    GenerationEvent,
    GenerationRequest,
    ModelCard,
    Restarted,
    TextDelta,
    ToolCall,
    Usage,
)

MAX_TOOL_ARGUMENTS = 16 * 1024 * 1024
"""Characters of streamed tool-call arguments kept per attempt (text deltas are not kept)."""
MAX_LISTED_MODELS = 10_000
MAX_ID = 512


class ProviderClient(abc.ABC):
    """The calls every provider offers; subclasses translate to one wire format."""

    kind: ClassVar[str]

    def __init__(
        self,
        config: ProviderConfig,
        *,
        env: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        retry: RetryPolicy | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.retry = retry or RetryPolicy()
        key = config.api_key(os.environ if env is None else env)
        self.http = ProviderHTTP(
            self.api_base(config.base_url),
            name=config.name,
            headers=self.headers(key),
            limits=limits,
            client=http_client,
        )

    def api_base(self, base_url: str) -> str:
        """The URL every path of this client is under."""
        return base_url

    @abc.abstractmethod
    def headers(self, key: str | None) -> dict[str, str]:
        """Headers for every request, the credential among them."""

    @abc.abstractmethod
    def attempt(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        """One streamed attempt, ending with :class:`Done` or raising."""

    @abc.abstractmethod
    async def list_once(self) -> list[ModelCard]:
        """One attempt at the provider's model listing."""

    def stream(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        """Stream ``request``, retrying failed attempts within the client's policy."""
        return retrying(lambda: self.attempt(request), self.retry, provider=self.name)

    async def generate(self, request: GenerationRequest) -> Generation:
        """Stream ``request`` to its end and return what it produced."""
        async with contextlib.aclosing(self.stream(request)) as events:
            return await generate(events)

    async def list_models(self) -> list[ModelCard]:
        """The provider's models, retried within the client's policy."""
        return await retry_call(self.list_once, self.retry, provider=self.name)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> ProviderClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def card(self, id: Any, **extra: Any) -> ModelCard | None:
        """A model card, or None when the listing's id is not a sane string."""
        if not isinstance(id, str) or not 0 < len(id) <= MAX_ID or not id.isprintable():
            return None
        card: ModelCard = {"provider": self.name, "id": id, "kind": self.kind}
        card.update((k, v) for k, v in extra.items() if v is not None)
        return card

    def check_listing(self, cards: list[ModelCard]) -> list[ModelCard]:
        if len(cards) > MAX_LISTED_MODELS:
            raise ResponseTooLarge(
                f"provider {self.name!r}: the listing has over {MAX_LISTED_MODELS} models",
                provider=self.name,
            )
        return cards

    def malformed(self, what: str) -> MalformedResponse:
        return MalformedResponse(f"provider {self.name!r}: {what}", provider=self.name)


async def generate(events: AsyncIterator[GenerationEvent]) -> Generation:
    """Collect a stream: text joined, tool calls in order, a restart discarding its attempt.

    Raises whatever the stream raises; a stream that stops without :class:`Done`
    raises :class:`MalformedStream` rather than returning half an answer.
    """
    text: list[str] = []
    calls: list[ToolCall] = []
    usage: Usage | None = None
    attempts = 1
    async for event in events:
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, ToolCall):
            calls.append(event)
        elif isinstance(event, Usage):
            usage = event
        elif isinstance(event, Restarted):
            text, calls, usage, attempts = [], [], None, event.attempt
        else:
            return Generation("".join(text), tuple(calls), event.stop_reason, usage, attempts)
    raise MalformedStream("the stream stopped without its terminal event")


def provider_for(
    config: ProviderConfig,
    *,
    env: Mapping[str, str] | None = None,
    limits: Limits | None = None,
    retry: RetryPolicy | None = None,
    http_client: httpx.AsyncClient | None = None,
) -> ProviderClient:
    """The client for ``config.kind``. Raises CredentialMissing if its key is unset."""
    from melchior.providers.anthropic import AnthropicMessages
    from melchior.providers.openai import OllamaChat, OpenAIChat, OpenAIResponses

    classes: dict[str, type[ProviderClient]] = {
        "openai": OpenAIChat,
        "openai-responses": OpenAIResponses,
        "anthropic": AnthropicMessages,
        "ollama": OllamaChat,
    }
    return classes[config.kind](
        config, env=env, limits=limits, retry=retry, http_client=http_client
    )


def event_json(event: SSEEvent, provider: str) -> dict[str, Any]:
    """An event's data as a JSON object, or a failed attempt."""
    try:
        value = json.loads(event.data)
    except (ValueError, RecursionError):
        where = "the stream's last, unterminated event" if event.tail else "an event"
        raise MalformedStream(
            f"provider {provider!r}: {where} is not JSON", provider=provider
        ) from None
    if not isinstance(value, dict):
        raise MalformedStream(f"provider {provider!r}: an event is not a JSON object")
    return value


class ToolArguments:
    """Streamed tool-call fragments, assembled per call, capped per attempt.

    Fragments are joined as text before any JSON parsing, so a character (or an escaped
    surrogate pair) split across two deltas comes out whole.
    """

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.size = 0

    def add(self, parts: list[str], fragment: str) -> None:
        self.size += len(fragment)
        if self.size > MAX_TOOL_ARGUMENTS:
            raise ResponseTooLarge(
                f"provider {self.provider!r}: tool-call arguments over "
                f"{MAX_TOOL_ARGUMENTS} characters",
                provider=self.provider,
            )
        parts.append(fragment)


def tool_call(id: str, name: str, raw: str, given: Any = None) -> ToolCall:
    """A complete call from its assembled argument text (or an object given whole)."""
    if not raw.strip() and isinstance(given, dict):
        return ToolCall(id, name, given, json.dumps(given, ensure_ascii=False))
    text = raw if raw.strip() else "{}"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return ToolCall(id, name, {}, raw, f"arguments are not valid JSON: {exc}")
    if not isinstance(value, dict):
        return ToolCall(id, name, {}, raw, "arguments are not a JSON object")
    return ToolCall(id, name, value, text)


def count(value: Any) -> int | None:
    """A token count from a listing or usage block: a non-negative int, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def money(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None


def short_text(value: Any, limit: int = 200) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= limit and value.isprintable():
        return value
    return None
