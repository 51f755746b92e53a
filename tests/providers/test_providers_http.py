"""The bounded HTTP layer against a real server on loopback, one boundary per test.

Deadlines and windows are shrunk through :class:`Limits` (fractions of a second instead
of 10 s and 180 s); tests assert what happened — the body was cut, this class was
raised, the server saw its socket closed — never how long it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import time
import traceback
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import httpx
import pytest

from melchior.providers.errors import (
    ContextOverflow,
    DeadlineExceeded,
    InactivityTimeout,
    MalformedResponse,
    MalformedStream,
    NotAStream,
    ProviderError,
    RateLimited,
    RequestRefused,
    ResponseTooLarge,
    ServerError,
    TransportError,
)
from melchior.providers.oauth import TokenSet, refresh_token, request_token
from melchior.providers.sse import SSEEvent
from melchior.providers.transport import (
    Limits,
    ProviderHTTP,
    RetryPolicy,
    parse_retry_after,
    retrying,
)
from melchior.providers.types import Restarted
from provider_kit import (
    Conn,
    LoopbackServer,
    Request,
    json_reply,
    sequence,
    sse_reply,
)

pytestmark = pytest.mark.streaming

T = TypeVar("T")
FAST = RetryPolicy(attempts=3, backoff=0.01, backoff_max=0.02)
SECRET = "s3cr3t-MARKER-4711"


async def collect(items: AsyncIterator[T]) -> list[T]:
    return [item async for item in items]


async def closed_by_client(server: LoopbackServer) -> None:
    """The server saw the socket close while the client (and its pool) is still open."""
    assert await asyncio.to_thread(server.client_closed.wait, 5), "the socket stayed open"


async def attempt(
    server: LoopbackServer, limits: Limits | None = None, *, closes: bool = False
) -> list[SSEEvent]:
    async with ProviderHTTP(server.url, name="fake", limits=limits) as http:
        try:
            return await collect(http.events("/stream", {"q": 1}))
        finally:
            if closes:
                await closed_by_client(server)


async def with_retries(
    server: LoopbackServer, policy: RetryPolicy = FAST, limits: Limits | None = None
) -> list[SSEEvent | Restarted]:
    async with ProviderHTTP(server.url, name="fake", limits=limits) as http:
        return await collect(retrying(lambda: http.events("/stream", {}), policy))


def E(data: str, tail: bool = False) -> SSEEvent:
    return SSEEvent(data, tail=tail)


async def drip(conn: Conn, byte: bytes = b"x", every: float = 0.02) -> None:
    """One byte at a time until the client hangs up."""
    while not conn.closed.is_set():
        await conn.chunk(byte)
        await asyncio.sleep(every)


# --- end of body: clean vs cut ---


def test_a_clean_end_of_body_delivers_the_tail_event() -> None:
    with LoopbackServer(sse_reply([b"data: 1\n\n", b"data: 2"])) as server:
        assert asyncio.run(attempt(server)) == [E("1"), E("2", tail=True)]


def test_a_cut_chunked_stream_gives_no_tail_and_a_retryable_failure() -> None:
    with LoopbackServer(sse_reply([b"data: 1\n\n", b"data: 2"], end=False)) as server:
        got: list[SSEEvent] = []

        async def main() -> None:
            async with ProviderHTTP(server.url) as http:
                async for event in http.events("/stream", {}):
                    got.append(event)

        with pytest.raises(TransportError) as err:
            asyncio.run(main())
    assert got == [E("1")]
    assert err.value.retryable
    assert "RemoteProtocolError" in str(err.value)


def test_a_body_shorter_than_its_content_length_is_a_failure_too() -> None:
    async def short(request: Request, conn: Conn) -> None:
        await conn.head(200, {"content-type": "text/event-stream"}, length=100)
        await conn.send(b"data: 1\n\ndata: 2")
        conn.cut()

    with LoopbackServer(short) as server, pytest.raises(TransportError):
        asyncio.run(attempt(server))


def test_a_cut_stream_is_retried_and_the_consumer_told_to_start_over() -> None:
    handler = sequence(
        sse_reply([b"data: 1\n\n", b"data: 2"], end=False),
        sse_reply([b"data: 1\n\n", b"data: 2\n\n"]),
    )
    with LoopbackServer(handler) as server:
        got = asyncio.run(with_retries(server))
    assert got[0] == E("1")
    assert isinstance(got[1], Restarted)
    assert got[1].attempt == 2
    assert got[2:] == [E("1"), E("2")]


# --- inactivity ---


def test_the_inactivity_timeout_fires_when_no_byte_arrives() -> None:
    async def stall(request: Request, conn: Conn) -> None:
        await conn.head(200, {"content-type": "text/event-stream"})
        await conn.chunk(b"data: 1\n\n")
        await conn.wait_closed(30)

    with LoopbackServer(stall) as server:
        with pytest.raises(InactivityTimeout) as err:
            asyncio.run(attempt(server, Limits(inactivity=0.3), closes=True))
        assert err.value.retryable


def test_pings_reset_the_inactivity_timeout() -> None:
    async def pinging(request: Request, conn: Conn) -> None:
        await conn.head(200, {"content-type": "text/event-stream"})
        for _ in range(20):  # 2 s of pings, twice the window; each gap a tenth of it
            await conn.chunk(b": ping\n\n")
            await asyncio.sleep(0.1)
        await conn.chunk(b"event: ping\ndata: {}\n\ndata: done\n\n")
        await conn.end()

    with LoopbackServer(pinging) as server:
        got = asyncio.run(attempt(server, Limits(inactivity=1.0)))
    assert got == [SSEEvent("{}", "ping"), E("done")]


# --- cancellation ---


def test_cancelling_the_consumer_closes_the_socket() -> None:
    async def endless(request: Request, conn: Conn) -> None:
        await conn.head(200, {"content-type": "text/event-stream"})
        await conn.chunk(b"data: first\n\n")
        while not conn.closed.is_set():
            await conn.chunk(b": ping\n\n")
            await asyncio.sleep(0.05)

    with LoopbackServer(endless) as server:

        async def main() -> list[SSEEvent]:
            seen: list[SSEEvent] = []
            first = asyncio.Event()

            async with ProviderHTTP(server.url) as http:

                async def consume() -> None:
                    async for event in http.events("/stream", {}):
                        seen.append(event)
                        first.set()

                task = asyncio.create_task(consume())
                await first.wait()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await closed_by_client(server)
            return seen

        assert asyncio.run(main()) == [E("first")]


def test_a_consumer_that_stops_early_closes_the_socket() -> None:
    async def endless(request: Request, conn: Conn) -> None:
        await conn.head(200, {"content-type": "text/event-stream"})
        while not conn.closed.is_set():
            await conn.chunk(b"data: more\n\n")
            await asyncio.sleep(0.02)

    with LoopbackServer(endless) as server:

        async def main() -> None:
            async with ProviderHTTP(server.url) as http:
                async with contextlib.aclosing(http.events("/stream", {})) as events:
                    async for _ in events:
                        break
                await closed_by_client(server)

        asyncio.run(main())


def test_cancelling_before_the_headers_arrive_closes_the_socket() -> None:
    async def silent(request: Request, conn: Conn) -> None:
        await conn.wait_closed(30)

    with LoopbackServer(silent) as server:

        async def main() -> None:
            async with ProviderHTTP(server.url) as http:
                task = asyncio.create_task(collect(http.events("/stream", {})))
                while not server.requests:  # noqa: ASYNC110 (set by the server's thread)
                    await asyncio.sleep(0.01)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await closed_by_client(server)

        asyncio.run(main())


# --- error bodies: 64 KiB, 10 s absolute, status class kept ---


def test_a_slow_drip_error_body_stops_at_the_deadline_and_keeps_its_class() -> None:
    async def dripping(request: Request, conn: Conn) -> None:
        await conn.head(503, {"content-type": "application/json"})
        await drip(conn)

    limits = Limits(error_body_deadline=0.4, inactivity=30)
    with LoopbackServer(dripping) as server, pytest.raises(ServerError) as err:
        asyncio.run(attempt(server, limits, closes=True))
    exc = err.value
    assert exc.status == 503
    assert exc.retryable
    assert not exc.body_complete
    assert exc.body
    assert set(exc.body) == {"x"}
    assert "at the deadline" in str(exc)


def test_an_incomplete_body_is_never_classified_as_context_overflow() -> None:
    async def dripping(request: Request, conn: Conn) -> None:
        await conn.head(400, {"content-type": "application/json"})
        await conn.chunk(b'{"error":{"message":"prompt is too long')
        await drip(conn, b" ")

    with LoopbackServer(dripping) as server, pytest.raises(RequestRefused) as err:
        asyncio.run(attempt(server, Limits(error_body_deadline=0.3)))
    assert type(err.value) is RequestRefused
    assert not err.value.retryable
    assert "prompt is too long" in err.value.body


def test_a_10_mb_error_body_is_cut_at_64_kib_and_the_connection_closed() -> None:
    size = 10 * 1024 * 1024

    async def huge(request: Request, conn: Conn) -> None:
        await conn.head(400, {"content-type": "text/plain"}, length=size)
        piece = b"y" * 65536
        for _ in range(size // len(piece)):
            await conn.send(piece)
        await conn.wait_closed()

    with LoopbackServer(huge) as server, pytest.raises(RequestRefused) as err:
        asyncio.run(attempt(server, closes=True))
    assert len(err.value.body) == 64 * 1024
    assert not err.value.body_complete
    assert "at the cap after 65536 chars" in str(err.value)


def test_the_cap_counts_decoded_characters_not_bytes() -> None:
    async def wide(request: Request, conn: Conn) -> None:
        body = ("é" * 100).encode()
        await conn.reply(500, body, "text/plain; charset=utf-8")

    with LoopbackServer(wide) as server, pytest.raises(ServerError) as err:
        asyncio.run(attempt(server, Limits(error_body_chars=60)))
    assert err.value.body == "é" * 60


def test_an_error_body_cut_by_the_connection_keeps_the_status_class() -> None:
    async def broken(request: Request, conn: Conn) -> None:
        await conn.head(429, {"retry-after": "7"})
        await conn.chunk(b"slow down")
        conn.cut()

    with LoopbackServer(broken) as server, pytest.raises(RateLimited) as err:
        asyncio.run(attempt(server))
    assert err.value.retry_after == 7.0
    assert err.value.body == "slow down"
    assert not err.value.body_complete
    assert "broken" in str(err.value)


def test_a_non_sse_200_is_read_as_an_error_body() -> None:
    payload = b'{"error": {"message": "not streaming"}}'
    with LoopbackServer(json_reply({"error": {"message": "not streaming"}})) as server:
        with pytest.raises(NotAStream) as err:
            asyncio.run(with_retries(server))
        assert len(server.requests) == 1  # not retried: the same request, the same answer
    assert err.value.status == 200
    assert err.value.body.encode() == payload.replace(b": ", b": ")
    assert err.value.body_complete
    assert "application/json" in str(err.value)


def test_a_non_sse_200_body_is_bounded_too() -> None:
    async def endless_html(request: Request, conn: Conn) -> None:
        await conn.head(200, {"content-type": "text/html"})
        await drip(conn, b"<p>" * 100, every=0.001)

    with LoopbackServer(endless_html) as server, pytest.raises(NotAStream) as err:
        asyncio.run(attempt(server, Limits(error_body_chars=1000)))
    assert len(err.value.body) == 1000


@pytest.mark.parametrize(
    "body",
    [
        b'{"error":{"message":"This model\'s maximum context length is 8192 tokens.",'
        b'"code":"context_length_exceeded"}}',
        b'{"type":"error","error":{"type":"invalid_request_error",'
        b'"message":"prompt is too long: 210000 tokens > 200000 maximum"}}',
        b'{"error":"input length and `max_tokens` exceed context limit"}',
    ],
)
def test_a_complete_error_body_can_say_context_overflow(body: bytes) -> None:
    async def overflow(request: Request, conn: Conn) -> None:
        await conn.reply(400, body)

    with LoopbackServer(overflow) as server, pytest.raises(ContextOverflow) as err:
        asyncio.run(attempt(server))
    assert not err.value.retryable
    assert err.value.body_complete
    assert "context window" in str(err.value)


def test_an_ordinary_refusal_is_not_an_overflow() -> None:
    with LoopbackServer(json_reply({"error": "no such model"}, status=404)) as server:
        with pytest.raises(RequestRefused) as err:
            asyncio.run(with_retries(server))
        assert len(server.requests) == 1
    assert type(err.value) is RequestRefused
    assert err.value.status == 404


# --- retries: bounded, Retry-After honoured ---


def test_429_with_retry_after_is_retried_after_the_wait() -> None:
    handler = sequence(
        json_reply({"error": "busy"}, status=429, **{"retry-after": "0"}),
        sse_reply([b"data: ok\n\n"]),
    )
    with LoopbackServer(handler) as server:
        assert asyncio.run(with_retries(server)) == [E("ok")]  # no Restarted: nothing yielded
        assert len(server.requests) == 2


def test_a_retry_after_longer_than_the_policy_waits_goes_to_the_caller() -> None:
    handler = json_reply({"error": "busy"}, status=429, **{"retry-after": "3600"})
    with LoopbackServer(handler) as server:
        with pytest.raises(RateLimited) as err:
            asyncio.run(with_retries(server))
        assert len(server.requests) == 1
    assert err.value.retry_after == 3600.0


def test_5xx_is_retried_within_the_bound_and_then_raised() -> None:
    with LoopbackServer(json_reply({"error": "down"}, status=502)) as server:
        with pytest.raises(ServerError):
            asyncio.run(with_retries(server, RetryPolicy(attempts=4, backoff=0.01)))
        assert len(server.requests) == 4


def test_a_connection_closed_without_an_answer_is_retried_within_the_bound() -> None:
    async def hang_up(request: Request, conn: Conn) -> None:
        conn.cut()

    with LoopbackServer(hang_up) as server:
        with pytest.raises(TransportError):
            asyncio.run(with_retries(server))
        assert len(server.requests) == 3


def test_malformed_utf8_fails_the_attempt_and_is_retried() -> None:
    handler = sequence(
        sse_reply([b"data: 1\n\n", b"data: \xc3\n\n"]),
        sse_reply([b"data: 1\n\n", "data: \u00e9\n\n".encode()]),
    )
    with LoopbackServer(handler) as server:
        got = asyncio.run(with_retries(server))
    assert got[0] == E("1")
    assert isinstance(got[1], Restarted)
    assert "not UTF-8" in got[1].reason
    assert got[2:] == [E("1"), E("é")]


def test_malformed_utf8_every_time_ends_in_malformed_stream() -> None:
    with LoopbackServer(sse_reply([b"data: \xff\n\n"])) as server:
        with pytest.raises(MalformedStream) as err:
            asyncio.run(with_retries(server))
        assert len(server.requests) == 3
    assert err.value.retryable


def test_an_oversized_event_is_refused_not_retried() -> None:
    with LoopbackServer(sse_reply([b"data: " + b"z" * 200 + b"\n\n"])) as server:
        with pytest.raises(ResponseTooLarge):
            asyncio.run(with_retries(server, limits=Limits(max_line=100)))
        assert len(server.requests) == 1


def test_the_policy_delay() -> None:
    policy = RetryPolicy(attempts=3, backoff=1.0, backoff_max=3.0, retry_after_max=10)
    busy = RateLimited("x", status=429, retry_after=4.0)
    assert policy.delay(1, busy) == 4.0
    assert policy.delay(3, busy) is None  # the bound
    assert policy.delay(1, RateLimited("x", status=429, retry_after=11.0)) is None
    assert policy.delay(1, RequestRefused("x", status=400)) is None
    assert 0.5 <= (policy.delay(1, TransportError("x")) or 0) <= 1.0
    assert 1.0 <= (policy.delay(2, TransportError("x")) or 0) <= 2.0
    wide = RetryPolicy(attempts=9, backoff=1.0, backoff_max=3.0)
    assert 1.5 <= (wide.delay(5, TransportError("x")) or 0) <= 3.0  # capped at backoff_max


def test_retry_after_parsing() -> None:
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    parse = parse_retry_after
    assert parse(httpx.Headers({"retry-after": "12"})) == 12.0
    assert parse(httpx.Headers({"retry-after": "1.5"})) == 1.5
    assert parse(httpx.Headers({"retry-after-ms": "250", "retry-after": "9"})) == 0.25
    assert 28 <= (parse(httpx.Headers({"retry-after": date}), now=now) or 0) <= 31
    assert parse(httpx.Headers({"retry-after": "soon"})) is None
    assert parse(httpx.Headers({"retry-after": "9" * 100})) is None
    assert parse(httpx.Headers({"retry-after-ms": "nan"})) is None
    assert parse(httpx.Headers({})) is None


# --- redaction: no body, no userinfo, no query values, no header values ---


def _leaks(exc: BaseException, *secrets: str) -> list[str]:
    texts = [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
    return [s for s in secrets for t in texts if s in t]


def test_errors_name_the_redacted_url_and_never_the_body(caplog: pytest.LogCaptureFixture) -> None:
    async def refuse(request: Request, conn: Conn) -> None:
        await conn.reply(503, f'{{"error":"{SECRET} echoed"}}'.encode())

    caplog.set_level(logging.DEBUG, logger="melchior.providers")
    with LoopbackServer(refuse) as server:
        base = server.url.replace("http://", f"http://user:{SECRET}@") + f"/v1?key={SECRET}"

        async def main() -> None:
            headers = {"authorization": f"Bearer {SECRET}-bearer"}
            async with ProviderHTTP(base, name="p", headers=headers) as http:
                await collect(retrying(lambda: http.events("/chat", {}), FAST))

        with pytest.raises(ServerError) as err:
            asyncio.run(main())
        sent = server.requests[0]
    assert sent.query == f"key={SECRET}"
    assert sent.path == "/v1/chat"
    assert SECRET in err.value.body  # kept for whoever chooses to show it
    assert _leaks(err.value, SECRET) == []
    assert "/v1/chat?key=REDACTED" in str(err.value)
    assert caplog.records
    assert SECRET not in caplog.text


def test_transport_errors_never_carry_the_url_credentials() -> None:
    async def main() -> None:
        base = f"http://u:{SECRET}@127.0.0.1:9/x?token={SECRET}"
        async with ProviderHTTP(base, headers={"x-api-key": SECRET + "k"}) as http:
            await collect(http.events("/s", {}))

    with pytest.raises(TransportError) as err:
        asyncio.run(main())
    assert _leaks(err.value, SECRET) == []
    assert "127.0.0.1:9/x/s?token=REDACTED" in str(err.value)


def test_a_bad_scheme_is_refused_without_echoing_the_url() -> None:
    async def main() -> None:
        async with ProviderHTTP(f"ftp://u:{SECRET}@example.invalid/?k={SECRET}") as http:
            await collect(http.events("/s", {}))

    with pytest.raises(ProviderError) as err:
        asyncio.run(main())
    assert not err.value.retryable
    assert _leaks(err.value, SECRET) == []


# --- control exchanges (OAuth): one deadline over headers and body ---


async def control(
    server: LoopbackServer, limits: Limits, form: dict[str, str], *, closes: bool = False
) -> Any:
    async with ProviderHTTP(server.url, limits=limits) as http:
        try:
            return await http.control(server.url + "/oauth/token", form=form)
        finally:
            if closes:
                await closed_by_client(server)


def test_a_control_exchange_whose_headers_never_come_stops_at_the_deadline() -> None:
    async def silent(request: Request, conn: Conn) -> None:
        await conn.wait_closed(30)

    limits = Limits(control_deadline=0.3)
    with LoopbackServer(silent) as server, pytest.raises(DeadlineExceeded) as err:
        asyncio.run(control(server, limits, {"grant_type": "x"}, closes=True))
    assert err.value.retryable


def test_a_control_body_that_drips_stops_at_the_same_deadline() -> None:
    async def dripping(request: Request, conn: Conn) -> None:
        await conn.head(200, {"content-type": "application/json"})
        await conn.chunk(b'{"access_token":"')
        await drip(conn)

    with LoopbackServer(dripping) as server, pytest.raises(DeadlineExceeded):
        asyncio.run(control(server, Limits(control_deadline=0.4), {}, closes=True))


def test_a_control_error_body_that_drips_keeps_its_status_class() -> None:
    async def dripping(request: Request, conn: Conn) -> None:
        await conn.head(503, {"content-type": "application/json"})
        await drip(conn)

    with LoopbackServer(dripping) as server, pytest.raises(ServerError) as err:
        asyncio.run(control(server, Limits(control_deadline=0.4), {}))
    assert not err.value.body_complete


def test_a_control_answer_over_64_kib_is_refused() -> None:
    big = b'{"access_token":"' + b"a" * (10 * 1024 * 1024) + b'"}'
    with LoopbackServer(json_reply(None)) as server:
        server.handler = lambda r, c: c.reply(200, big)
        with pytest.raises(ResponseTooLarge):
            asyncio.run(control(server, Limits(), {}, closes=True))


def test_a_control_refusal_never_shows_the_form_or_the_body() -> None:
    body = f'{{"error":"invalid_grant","echo":"{SECRET}"}}'.encode()
    with LoopbackServer(json_reply(None)) as server:
        server.handler = lambda r, c: c.reply(400, body)
        with pytest.raises(RequestRefused) as err:
            asyncio.run(control(server, Limits(), {"refresh_token": SECRET}))
        assert SECRET in server.requests[0].body.decode()
    assert _leaks(err.value, SECRET) == []
    assert err.value.body_complete


def test_a_control_answer_within_bounds_is_returned() -> None:
    with LoopbackServer(json_reply({"access_token": "abc", "expires_in": 60})) as server:
        answer = asyncio.run(control(server, Limits(), {"grant_type": "refresh_token"}))
        assert server.requests[0].headers["content-type"] == "application/x-www-form-urlencoded"
    assert answer.status == 200
    assert '"access_token": "abc"' in answer.text


# --- listings: bounded GET ---


def test_a_listing_over_its_cap_is_refused() -> None:
    with LoopbackServer(json_reply({"data": ["m" * 5000]})) as server:

        async def main() -> Any:
            async with ProviderHTTP(server.url, limits=Limits(listing_bytes=1000)) as http:
                return await http.get_json("/models")

        with pytest.raises(ResponseTooLarge):
            asyncio.run(main())


def test_a_listing_that_is_not_json_is_malformed() -> None:
    with LoopbackServer(json_reply(None)) as server:
        server.handler = lambda r, c: c.reply(200, b"<html>hello</html>", "text/html")

        async def main() -> Any:
            async with ProviderHTTP(server.url) as http:
                return await http.get_json("/models")

        with pytest.raises(MalformedResponse):
            asyncio.run(main())


def test_a_listing_that_drips_stops_at_its_deadline() -> None:
    async def dripping(request: Request, conn: Conn) -> None:
        await conn.head(200, {"content-type": "application/json"})
        await drip(conn, b" ")

    with LoopbackServer(dripping) as server:

        async def main() -> Any:
            async with ProviderHTTP(server.url, limits=Limits(listing_deadline=0.3)) as http:
                try:
                    return await http.get_json("/models")
                finally:
                    await closed_by_client(server)

        with pytest.raises(DeadlineExceeded):
            asyncio.run(main())


def test_the_base_url_path_and_query_are_kept_under_every_path() -> None:
    with LoopbackServer(json_reply({"ok": 1})) as server:

        async def main() -> Any:
            async with ProviderHTTP(server.url + "/api/v1/?tenant=t1") as http:
                return await http.get_json("models", params={"limit": "5"})

        assert asyncio.run(main()) == {"ok": 1}
        assert server.requests[0].target == "/api/v1/models?tenant=t1&limit=5"


# --- the OAuth helpers on top of control exchanges ---


def test_a_refresh_returns_a_token_set_that_hides_its_tokens() -> None:
    answer = {"access_token": SECRET, "refresh_token": SECRET + "r", "expires_in": 3600}
    with LoopbackServer(json_reply(answer)) as server:

        async def main() -> TokenSet:
            async with ProviderHTTP(server.url) as http:
                return await refresh_token(
                    http, server.url + "/token", "old-refresh", client_id="cli", now=1000.0
                )

        tokens = asyncio.run(main())
        form = server.requests[0].body.decode()
    assert form == "grant_type=refresh_token&refresh_token=old-refresh&client_id=cli"
    assert tokens.access_token == SECRET
    assert tokens.refresh_token == SECRET + "r"
    assert tokens.expires_at == 4600.0
    assert tokens.token_type == "Bearer"
    assert SECRET not in repr(tokens)


@pytest.mark.parametrize(
    "answer", [b"not json", b"[1]", b'{"token_type": "Bearer"}', b'{"access_token": ""}']
)
def test_a_token_answer_without_a_token_is_malformed(answer: bytes) -> None:
    with LoopbackServer(json_reply(None)) as server:
        server.handler = lambda r, c: c.reply(200, answer)

        async def main() -> TokenSet:
            async with ProviderHTTP(server.url) as http:
                return await request_token(http, server.url + "/token", {"grant_type": "x"})

        with pytest.raises(MalformedResponse):
            asyncio.run(main())


def test_an_unparseable_base_url_is_refused_without_echoing_it() -> None:
    with pytest.raises(ProviderError) as err:
        ProviderHTTP(f"http://u:{SECRET}@[::1", name="p")
    assert not err.value.retryable
    assert _leaks(err.value, SECRET) == []


def test_a_successful_stream_has_no_total_cap_of_time_or_size() -> None:
    """The error-body bounds never apply to a generation that keeps streaming."""

    async def long(request: Request, conn: Conn) -> None:
        await conn.head(200, {"content-type": "text/event-stream"})
        for i in range(30):  # 0.6 s, three times the error-body deadline
            await conn.chunk(b"data: " + b"%02d" % i + b"." * 98 + b"\n\n")
            await asyncio.sleep(0.02)
        await conn.end()

    with LoopbackServer(long) as server:
        limits = Limits(error_body_deadline=0.2, error_body_chars=100, control_deadline=0.2)
        got = asyncio.run(attempt(server, limits))
    assert [e.data[:2] for e in got] == [f"{i:02d}" for i in range(30)]
    assert sum(len(e.data) for e in got) == 3000


def test_a_strange_content_type_is_not_echoed() -> None:
    async def odd(request: Request, conn: Conn) -> None:
        await conn.reply(200, b"hello", content_type=f"{SECRET} {SECRET}")

    with LoopbackServer(odd) as server, pytest.raises(NotAStream) as err:
        asyncio.run(attempt(server))
    assert _leaks(err.value, SECRET) == []
    assert "'unusual'" in str(err.value)
