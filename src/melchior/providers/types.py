"""The provider-neutral shape of one generation: what goes in, what streams out.

Two consumers sit on this: the relay receiver's provider adapter (one fresh call per
task) and the plane's provider runtime (a turn whose model may call ``send_to`` and
``team``). Neither should know which provider it talks to, so requests, messages,
tools and events are plain frozen values here and each client translates them.

A stream is a sequence of :data:`GenerationEvent`:

- :class:`TextDelta` as text arrives;
- :class:`ToolCall` once a call is complete, arguments assembled from every streamed
  fragment and parsed as JSON;
- :class:`Usage` once, just before :class:`Done`, when the provider sent token counts;
- :class:`Done` only after the provider's terminal event (``[DONE]``,
  ``message_stop``, ``response.completed``). A stream that ends without it raises
  instead: success is never inferred from silence;
- :class:`Restarted` when an attempt failed *after* it had yielded events and the
  retry policy is trying again: everything yielded since the start (or the previous
  ``Restarted``) belongs to the failed attempt and must be discarded.

Act on tool calls after :class:`Done`: a call yielded by an attempt that then fails
is withdrawn by the ``Restarted`` that follows. :func:`melchior.providers.generate`
collects a stream into a :class:`Generation` with all of that applied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A complete call the model made.

    ``arguments`` is the parsed JSON object. When the model streamed text that is not
    a JSON object, ``arguments`` is empty, ``invalid_arguments`` says why, and
    ``arguments_json`` keeps the raw text, so a runtime can tell the model its call was
    malformed instead of running it with nothing.
    """

    id: str
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    arguments_json: str = "{}"
    invalid_arguments: str | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One turn of the conversation.

    ``user``: ``text``. ``assistant``: ``text`` and/or the ``tool_calls`` it made.
    ``tool``: the result of the call ``tool_call_id`` in ``text``, ``is_error`` when
    the call failed (both providers show the model that distinction).
    """

    role: Role
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call; ``parameters`` is a JSON Schema object."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One call: the model, the conversation so far, the tools it may call."""

    model: str
    messages: Sequence[Message]
    system: str = ""
    tools: Sequence[Tool] = ()
    max_tokens: int = 4096
    temperature: float | None = None


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts (and cost, in USD, when the provider reports one) for one attempt."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    cost: float | None = None


@dataclass(frozen=True, slots=True)
class Done:
    """The provider's terminal event arrived; ``stop_reason`` as the provider says it.

    Typical values: ``stop``/``end_turn`` (finished), ``length``/``max_tokens`` (cut by
    ``max_tokens``), ``tool_calls``/``tool_use`` (waiting for tool results).
    """

    stop_reason: str


@dataclass(frozen=True, slots=True)
class Restarted:
    """Attempt ``attempt`` starts over; discard what the failed attempt yielded."""

    attempt: int
    reason: str


GenerationEvent = TextDelta | ToolCall | Usage | Done | Restarted


@dataclass(frozen=True, slots=True)
class Generation:
    """A finished generation, as :func:`melchior.providers.generate` collects it."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    stop_reason: str
    usage: Usage | None = None
    attempts: int = 1


ModelCard = dict[str, Any]
"""One model as ``melchior models`` lists it: ``provider``, ``id``, ``kind``, then
whatever the listing gave (``display_name``, ``context_window``, ``created``, …)."""
