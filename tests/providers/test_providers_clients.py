"""The streaming clients against scripted provider streams on a loopback server.

Each stream is served cut into small HTTP chunks, so multi-byte characters and CRLFs
are split on the wire; the expected events are written out in full. Success needs the
provider's terminal event; everything else is a failed attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from melchior.providers.client import ProviderClient, generate, provider_for
from melchior.providers.config import Kind, ProviderConfig
from melchior.providers.errors import (
    CredentialMissing,
    MalformedResponse,
    MalformedStream,
    RequestRefused,
    StreamError,
    TransportError,
)
from melchior.providers.transport import RetryPolicy
from melchior.providers.types import (
    Done,
    GenerationEvent,
    GenerationRequest,
    Message,
    TextDelta,
    Tool,
    ToolCall,
    Usage,
)
from provider_kit import (
    Conn,
    Handler,
    LoopbackServer,
    Request,
    anthropic_sse,
    json_reply,
    sequence,
    split_bytes,
    sse,
    sse_reply,
)

pytestmark = pytest.mark.streaming

KEY = "sk-test-0123456789"
ENV = {"FAKE_KEY": KEY}
FAST = RetryPolicy(attempts=3, backoff=0.01, backoff_max=0.02)
ONCE = RetryPolicy(attempts=1)
ARGS = '{"to": "東京-team", "text": "😀 ünïcode"}'
SEND_TO = Tool(
    "send_to",
    "send a message to another agent",
    {"type": "object", "properties": {"to": {"type": "string"}, "text": {"type": "string"}}},
)
REQUEST = GenerationRequest(
    model="m-1",
    system="be brief",
    messages=[
        Message("user", "hello"),
        Message("assistant", "", tool_calls=(ToolCall("c0", "team", {}, "{}"),)),
        Message("tool", '["alpha","beta"]', tool_call_id="c0"),
        Message("user", "now write to alpha"),
    ],
    tools=[SEND_TO, Tool("team", "list the team")],
    max_tokens=64,
    temperature=0.2,
)


def client(
    server: LoopbackServer, kind: Kind = "openai", retry: RetryPolicy = FAST, path: str = "/v1"
) -> ProviderClient:
    config = ProviderConfig("fake", kind, server.url + path, api_key_env="FAKE_KEY")
    return provider_for(config, env=ENV, retry=retry)


async def events_of(server: LoopbackServer, kind: Kind = "openai", **kw: Any) -> list[Any]:
    async with client(server, kind, **kw) as c:
        return [e async for e in c.stream(REQUEST)]


def served(body: bytes, size: int = 7, end: bool = True) -> Handler:
    return sse_reply(split_bytes(body, size), end=end)


# --- OpenAI-compatible chat ---


def delta(**fields: Any) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": fields}]}


def tool_delta(index: int, **fragment: Any) -> dict[str, Any]:
    return delta(tool_calls=[{"index": index, **fragment}])


OPENAI_STREAM = sse(
    delta(role="assistant", content=""),
    delta(content="Hello, "),
    delta(content="wörld ✓"),
    tool_delta(0, id="call_1", type="function", function={"name": "send_to", "arguments": ""}),
    *[tool_delta(0, function={"arguments": part}) for part in (ARGS[:8], ARGS[8:17], ARGS[17:])],
    tool_delta(1, id="call_2", function={"name": "team", "arguments": ""}),
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {
        "choices": [],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 4},
            "cost": 0.00012,
        },
    },
    "[DONE]",
)
OPENAI_EVENTS: list[GenerationEvent] = [
    TextDelta("Hello, "),
    TextDelta("wörld ✓"),
    ToolCall("call_1", "send_to", {"to": "東京-team", "text": "😀 ünïcode"}, ARGS),
    ToolCall("call_2", "team", {}, "{}"),
    Usage(input_tokens=12, output_tokens=7, cache_read_tokens=4, cost=0.00012),
    Done("tool_calls"),
]


@pytest.mark.parametrize("size", [1, 3, 7, 64, 100_000])
def test_openai_stream_gives_text_assembled_tool_calls_usage_and_done(size: int) -> None:
    with LoopbackServer(served(OPENAI_STREAM, size)) as server:
        assert asyncio.run(events_of(server)) == OPENAI_EVENTS


def test_openai_request_shape_and_credential() -> None:
    with LoopbackServer(served(OPENAI_STREAM)) as server:
        asyncio.run(events_of(server))
        sent = server.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.headers["accept"] == "text/event-stream"
    body = sent.json()
    assert body["model"] == "m-1"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_completion_tokens"] == 64
    assert body["temperature"] == 0.2
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "team", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": '["alpha","beta"]'},
        {"role": "user", "content": "now write to alpha"},
    ]
    assert body["tools"][0] == {
        "type": "function",
        "function": {
            "name": "send_to",
            "description": "send a message to another agent",
            "parameters": SEND_TO.parameters,
        },
    }


def test_an_escaped_surrogate_pair_split_across_deltas_comes_out_whole() -> None:
    body = sse(
        tool_delta(0, id="c", function={"name": "send_to", "arguments": '{"text": "\\ud83d'}),
        tool_delta(0, function={"arguments": '\\ude00"}'}),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        "[DONE]",
    )
    with LoopbackServer(served(body)) as server:
        got = asyncio.run(events_of(server))
    assert isinstance(got[0], ToolCall)
    assert got[0].arguments == {"text": "😀"}


def test_arguments_that_are_not_a_json_object_are_reported_not_run() -> None:
    body = sse(
        tool_delta(0, id="a", function={"name": "send_to", "arguments": '{"to": "x"'}),
        tool_delta(1, id="b", function={"name": "team", "arguments": "[1]"}),
        "[DONE]",
    )
    with LoopbackServer(served(body)) as server:
        first, second, done = asyncio.run(events_of(server))
    assert isinstance(first, ToolCall)
    assert isinstance(second, ToolCall)
    assert first.arguments == {}
    assert first.arguments_json == '{"to": "x"'
    assert first.invalid_arguments
    assert "not valid JSON" in first.invalid_arguments
    assert second.invalid_arguments == "arguments are not a JSON object"
    assert done == Done("unknown")  # [DONE] without a finish_reason: finished, reason unsaid


def test_openai_without_done_is_a_failed_attempt_even_after_finish_reason() -> None:
    body = sse(
        delta(content="hi"), {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    )
    with LoopbackServer(served(body)) as server:
        with pytest.raises(MalformedStream, match=r"without \[DONE\]"):
            asyncio.run(events_of(server, retry=FAST))
        assert len(server.requests) == 3  # retried within the bound


def test_a_tail_that_is_not_json_is_a_failed_attempt() -> None:
    body = sse(delta(content="hi")) + b'data: {"choices": [{"delta": {"content": "cut'
    with LoopbackServer(served(body)) as server, pytest.raises(MalformedStream, match="last"):
        asyncio.run(events_of(server, retry=ONCE))


def test_a_cut_stream_is_retried_and_generate_keeps_only_the_good_attempt() -> None:
    cut = OPENAI_STREAM[: OPENAI_STREAM.index(b"\xe6\x9d\xb1") + 1]  # inside 東, mid-arguments
    handler = sequence(served(cut, end=False), served(OPENAI_STREAM))
    with LoopbackServer(handler) as server:

        async def main() -> Any:
            async with client(server) as c:
                return await c.generate(REQUEST)

        result = asyncio.run(main())
    assert result.text == "Hello, wörld ✓"
    assert result.attempts == 2
    assert [c.name for c in result.tool_calls] == ["send_to", "team"]
    assert result.usage == OPENAI_EVENTS[4]
    assert result.stop_reason == "tool_calls"


def test_a_cut_stream_without_retries_raises_and_never_reports_the_call() -> None:
    cut = OPENAI_STREAM[: OPENAI_STREAM.index(b"\xe6\x9d\xb1") + 1]
    with LoopbackServer(served(cut, end=False)) as server:
        seen: list[Any] = []

        async def main() -> None:
            async with client(server, retry=ONCE) as c:
                async for event in c.stream(REQUEST):
                    seen.append(event)

        with pytest.raises(TransportError):
            asyncio.run(main())
    assert seen == OPENAI_EVENTS[:2]


def test_an_error_inside_the_stream_is_classified_and_retried() -> None:
    failing = served(sse(delta(content="x"), {"error": {"type": "server_error", "message": "b"}}))
    with LoopbackServer(sequence(failing, served(OPENAI_STREAM))) as server:
        got = asyncio.run(events_of(server))
    assert got[0] == TextDelta("x")
    assert got[2:] == OPENAI_EVENTS
    refused = served(sse({"error": {"type": "invalid_request_error", "message": "nope"}}))
    with LoopbackServer(refused) as server:
        with pytest.raises(StreamError) as err:
            asyncio.run(events_of(server))
        assert len(server.requests) == 1
    assert err.value.code == "invalid_request_error"
    assert "nope" not in str(err.value)


def test_cancelling_a_generation_closes_the_connection() -> None:
    async def endless(request: Request, conn: Conn) -> None:
        await conn.head(200, {"content-type": "text/event-stream"})
        while not conn.closed.is_set():
            await conn.chunk(sse(delta(content="la ")))
            await asyncio.sleep(0.02)

    with LoopbackServer(endless) as server:

        async def main() -> None:
            async with client(server) as c:
                task = asyncio.create_task(c.generate(REQUEST))
                while not server.requests:  # noqa: ASYNC110 (set by the server's thread)
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                assert await asyncio.to_thread(server.client_closed.wait, 5)

        asyncio.run(main())


def test_a_missing_key_is_refused_before_any_request() -> None:
    config = ProviderConfig("fake", "openai", "http://127.0.0.1:9/v1", api_key_env="NOPE_KEY")
    with pytest.raises(CredentialMissing, match=r"\$NOPE_KEY is not set"):
        provider_for(config, env={})


def test_a_refusal_that_echoes_the_key_does_not_repeat_it() -> None:
    refusal = json_reply({"error": f"bad key {KEY}"}, status=401)
    with LoopbackServer(refusal) as server, pytest.raises(RequestRefused) as err:
        asyncio.run(events_of(server))
    assert KEY not in str(err.value)
    assert KEY not in repr(err.value)


def test_openai_listing() -> None:
    listing = {
        "object": "list",
        "data": [
            {"id": "gpt-x", "object": "model", "created": 1700000000, "owned_by": "openai"},
            {"id": "router/y", "name": "Y", "context_length": 131072},
            {"id": ""},  # not a model: skipped
            "junk",
        ],
    }
    with LoopbackServer(json_reply(listing)) as server:

        async def main() -> Any:
            async with client(server) as c:
                return await c.list_models()

        cards = asyncio.run(main())
        assert server.requests[0].path == "/v1/models"
        assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert cards == [
        {
            "provider": "fake",
            "id": "gpt-x",
            "kind": "openai",
            "created": "2023-11-14T22:13:20Z",
            "owned_by": "openai",
        },
        {
            "provider": "fake",
            "id": "router/y",
            "kind": "openai",
            "display_name": "Y",
            "context_window": 131072,
        },
    ]


def test_a_listing_of_the_wrong_shape_is_malformed() -> None:
    with LoopbackServer(json_reply({"models": []})) as server:

        async def main() -> Any:
            async with client(server, retry=ONCE) as c:
                return await c.list_models()

        with pytest.raises(MalformedResponse):
            asyncio.run(main())


# --- Ollama ---


def test_ollama_chats_under_v1_and_lists_its_tags() -> None:
    tags = {
        "models": [
            {
                "name": "llama3.2:3b",
                "model": "llama3.2:3b",
                "modified_at": "2025-01-01T10:00:00Z",
                "size": 2019393189,
                "details": {"family": "llama", "parameter_size": "3.2B"},
            }
        ]
    }
    routes = {"/v1/chat/completions": served(OPENAI_STREAM), "/api/tags": json_reply(tags)}
    with LoopbackServer(routes=routes) as server:

        async def main() -> Any:
            config = ProviderConfig("local", "ollama", server.url + "/v1/")  # /v1 tolerated
            async with provider_for(config, retry=ONCE) as c:
                return [e async for e in c.stream(REQUEST)], await c.list_models()

        events, cards = asyncio.run(main())
        body = server.requests[0].json()
        assert "authorization" not in server.requests[0].headers
    assert events == OPENAI_EVENTS
    assert body["max_tokens"] == 64
    assert cards == [
        {
            "provider": "local",
            "id": "llama3.2:3b",
            "kind": "ollama",
            "modified": "2025-01-01T10:00:00Z",
            "size": 2019393189,
            "family": "llama",
            "parameter_size": "3.2B",
        }
    ]


# --- Anthropic Messages ---

PARTS = [ARGS[:5], ARGS[5:11], ARGS[11:23], ARGS[23:]]
ANTHROPIC_STREAM = anthropic_sse(
    {
        "type": "message_start",
        "message": {"id": "msg_1", "usage": {"input_tokens": 25, "cache_read_input_tokens": 3}},
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "ping"},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Sure — "}},
    {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "writing."},
    },
    {"type": "content_block_stop", "index": 0},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "send_to", "input": {}},
    },
    *[
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": part},
        }
        for part in PARTS
    ],
    {"type": "content_block_stop", "index": 1},
    {
        "type": "content_block_start",
        "index": 2,
        "content_block": {"type": "tool_use", "id": "toolu_2", "name": "team", "input": {}},
    },
    {"type": "content_block_stop", "index": 2},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 15}},
    {"type": "message_stop"},
).replace(b"\n", b"\r\n")
ANTHROPIC_EVENTS: list[GenerationEvent] = [
    TextDelta("Sure — "),
    TextDelta("writing."),
    ToolCall("toolu_1", "send_to", {"to": "東京-team", "text": "😀 ünïcode"}, ARGS),
    ToolCall("toolu_2", "team", {}, "{}"),
    Usage(input_tokens=25, output_tokens=15, cache_read_tokens=3),
    Done("tool_use"),
]


@pytest.mark.parametrize("size", [1, 5, 64, 100_000])
def test_anthropic_stream_gives_text_tool_calls_usage_and_done(size: int) -> None:
    with LoopbackServer(served(ANTHROPIC_STREAM, size)) as server:
        assert asyncio.run(events_of(server, "anthropic", path="")) == ANTHROPIC_EVENTS


def test_anthropic_request_shape_and_credential() -> None:
    with LoopbackServer(served(ANTHROPIC_STREAM)) as server:
        asyncio.run(events_of(server, "anthropic", path="/v1"))  # a trailing /v1 is tolerated
        sent = server.requests[0]
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    body = sent.json()
    assert body["system"] == "be brief"
    assert body["max_tokens"] == 64
    assert body["stream"] is True
    assert body["tools"][0] == {
        "name": "send_to",
        "description": "send a message to another agent",
        "input_schema": SEND_TO.parameters,
    }
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "c0", "name": "team", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c0", "content": '["alpha","beta"]'},
                {"type": "text", "text": "now write to alpha"},
            ],
        },
    ]


def test_anthropic_without_message_stop_is_a_failed_attempt() -> None:
    body = ANTHROPIC_STREAM[: ANTHROPIC_STREAM.index(b"event: message_stop")]
    with (
        LoopbackServer(served(body)) as server,
        pytest.raises(MalformedStream, match="without message_stop"),
    ):
        asyncio.run(events_of(server, "anthropic", path="", retry=ONCE))


def test_anthropic_cut_mid_arguments_yields_no_call() -> None:
    cut = ANTHROPIC_STREAM[: ANTHROPIC_STREAM.index(b"\xe6\x9d\xb1") + 2]
    seen: list[Any] = []
    with LoopbackServer(served(cut, end=False)) as server:

        async def main() -> None:
            async with client(server, "anthropic", retry=ONCE, path="") as c:
                async for event in c.stream(REQUEST):
                    seen.append(event)

        with pytest.raises(TransportError):
            asyncio.run(main())
    assert seen == ANTHROPIC_EVENTS[:2]


def test_anthropic_overloaded_error_event_is_retried() -> None:
    overloaded = anthropic_sse(
        {"type": "message_start", "message": {"usage": {"input_tokens": 1}}},
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    )
    handler = sequence(served(overloaded), served(ANTHROPIC_STREAM))
    with LoopbackServer(handler) as server:

        async def main() -> Any:
            async with client(server, "anthropic", path="") as c:
                return await c.generate(REQUEST)

        result = asyncio.run(main())
        assert len(server.requests) == 2
    assert result.text == "Sure — writing."
    assert result.attempts == 1


def test_anthropic_listing_follows_pages() -> None:
    pages = [
        {
            "data": [{"id": "claude-a", "display_name": "A", "created_at": "2025-02-01T00:00:00Z"}],
            "has_more": True,
            "last_id": "claude-a",
        },
        {"data": [{"id": "claude-b", "max_input_tokens": 200000}], "has_more": False},
    ]
    handler = sequence(json_reply(pages[0]), json_reply(pages[1]))
    with LoopbackServer(handler) as server:

        async def main() -> Any:
            async with client(server, "anthropic", path="") as c:
                return await c.list_models()

        cards = asyncio.run(main())
        first, second = server.requests
    assert first.target == "/v1/models?limit=1000"
    assert first.headers["x-api-key"] == KEY
    assert second.target == "/v1/models?limit=1000&after_id=claude-a"
    assert [c["id"] for c in cards] == ["claude-a", "claude-b"]
    assert cards[0]["display_name"] == "A"
    assert cards[1]["context_window"] == 200000


def test_generate_refuses_a_stream_without_done() -> None:
    async def events() -> Any:
        yield TextDelta("x")

    with pytest.raises(MalformedStream):
        asyncio.run(generate(events()))


# --- OpenAI Responses API ---


def responses_sse(*events: dict[str, Any]) -> bytes:
    return b"".join(sse(e, event=str(e["type"])) for e in events)


RESPONSES_STREAM = responses_sse(
    {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}},
    {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "Hello, "},
    {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "wörld ✓"},
    {
        "type": "response.output_item.added",
        "output_index": 1,
        "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "send_to"},
    },
    *[
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": part}
        for part in PARTS
    ],
    {
        "type": "response.output_item.done",
        "output_index": 1,
        "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "send_to"},
    },
    {
        "type": "response.completed",
        "response": {
            "status": "completed",
            "usage": {
                "input_tokens": 30,
                "output_tokens": 9,
                "input_tokens_details": {"cached_tokens": 0},
            },
        },
    },
)


@pytest.mark.parametrize("size", [3, 100_000])
def test_responses_stream_gives_text_calls_usage_and_done(size: int) -> None:
    with LoopbackServer(served(RESPONSES_STREAM, size)) as server:
        got = asyncio.run(events_of(server, "openai-responses"))
        sent = server.requests[0]
    assert got == [
        TextDelta("Hello, "),
        TextDelta("wörld ✓"),
        ToolCall("call_1", "send_to", {"to": "東京-team", "text": "😀 ünïcode"}, ARGS),
        Usage(input_tokens=30, output_tokens=9, cache_read_tokens=0),
        Done("tool_calls"),
    ]
    body = sent.json()
    assert sent.path == "/v1/responses"
    assert body["store"] is False
    assert body["instructions"] == "be brief"
    assert body["max_output_tokens"] == 64
    assert body["tools"][0]["name"] == "send_to"
    assert body["tools"][0]["type"] == "function"
    assert body["input"] == [
        {"role": "user", "content": "hello"},
        {"type": "function_call", "call_id": "c0", "name": "team", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c0", "output": '["alpha","beta"]'},
        {"role": "user", "content": "now write to alpha"},
    ]


def test_responses_incomplete_is_terminal_with_its_reason() -> None:
    body = responses_sse(
        {"type": "response.output_text.delta", "delta": "long"},
        {
            "type": "response.incomplete",
            "response": {"incomplete_details": {"reason": "max_output_tokens"}},
        },
    )
    with LoopbackServer(served(body)) as server:
        got = asyncio.run(events_of(server, "openai-responses"))
    assert got == [TextDelta("long"), Done("max_output_tokens")]


def test_responses_without_completed_or_with_failed_is_a_failed_attempt() -> None:
    unfinished = RESPONSES_STREAM[: RESPONSES_STREAM.index(b"event: response.completed")]
    with LoopbackServer(served(unfinished)) as server, pytest.raises(MalformedStream):
        asyncio.run(events_of(server, "openai-responses", retry=ONCE))
    failed = responses_sse(
        {"type": "response.failed", "response": {"error": {"code": "server_error"}}}
    )
    with LoopbackServer(served(failed)) as server:
        with pytest.raises(StreamError) as err:
            asyncio.run(events_of(server, "openai-responses"))
        assert len(server.requests) == 3
        assert err.value.retryable
