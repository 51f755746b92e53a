"""Bounded HTTP to a provider, on httpx: what is read, for how long, and how often.

The rules (seed 000, "Provider response boundaries"):

- **Successful generations** have no total-duration or total-byte cap: a long answer is
  not an error. They have an *inactivity* timeout, :attr:`Limits.inactivity` (180 s):
  httpx's read timeout, which is per socket read, so any byte resets it — SSE comment
  pings and Anthropic's ``event: ping`` exist for exactly this. Memory stays bounded by
  the SSE decoder's line and event caps.
- **Error bodies** (any non-success status, and a success whose body is not
  ``text/event-stream``) are read to at most :attr:`Limits.error_body_chars` (64 KiB)
  of decoded text within :attr:`Limits.error_body_deadline` (10 s), an *absolute*
  deadline: a per-read timeout never fires on a body dripped a byte at a time. Then the
  connection is closed. The error class comes from the status alone; only a complete
  body may turn a refusal into :class:`~melchior.providers.errors.ContextOverflow`.
- **Control responses** (OAuth token and refresh requests) get the same 64 KiB and one
  10 s deadline, :attr:`Limits.control_deadline`, that covers the request, the response
  headers and the body.
- **Model listings** are read whole but capped (:attr:`Limits.listing_bytes`) within
  :attr:`Limits.listing_deadline`.
- **Retries** (:class:`RetryPolicy`): a bounded number of attempts for connection
  errors, cut or malformed streams (malformed UTF-8 included), 408/429/5xx; a
  ``Retry-After`` is honoured, and one longer than the policy will wait is raised to the
  caller instead of slept through.
- **Cancellation** of the consuming task closes the response, and with it the
  connection (an unfinished HTTP/1.1 response is never returned to the pool).
- **Diagnostics** name the method and the redacted URL; never a body, never userinfo,
  query values or header values.

Every limit is a field with its documented default, so tests shrink them instead of
waiting for minutes.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import email.utils
import json
import logging
import math
import random
import re
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from melchior.providers.errors import (
    ContextOverflow,
    DeadlineExceeded,
    HTTPStatusError,
    InactivityTimeout,
    MalformedResponse,
    MalformedStream,
    NotAStream,
    ProviderError,
    ResponseTooLarge,
    TransportError,
    is_context_overflow,
    status_class,
)
from melchior.providers.redact import redact_url, scrub
from melchior.providers.sse import (
    DEFAULT_MAX_EVENT,
    DEFAULT_MAX_LINE,
    SSEDecodeError,
    SSEDecoder,
    SSEEvent,
    SSELimitError,
)
from melchior.providers.types import Restarted

log = logging.getLogger("melchior.providers")

ERROR_BODY_CHARS = 64 * 1024
"""Decoded characters kept of an error body or a control response."""
ERROR_BODY_DEADLINE = 10.0
"""Seconds, absolute, for reading an error body once its headers arrived."""
CONTROL_DEADLINE = 10.0
"""Seconds, absolute, for an OAuth exchange: request, headers and body."""
INACTIVITY = 180.0
"""Seconds without a single byte before a generation is abandoned."""
CONNECT_TIMEOUT = 30.0
LISTING_BYTES = 8 * 1024 * 1024
LISTING_DEADLINE = 60.0
_MEDIA_TYPE = re.compile(r"[A-Za-z0-9][\w.+-]{0,40}/[A-Za-z0-9][\w.+-]{0,60}|none")
RETRY_AFTER_MAX_TEXT = 64
"""A ``Retry-After`` value longer than this is ignored before it is parsed."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one provider endpoint; the defaults are the documented ones."""

    error_body_chars: int = ERROR_BODY_CHARS
    error_body_deadline: float = ERROR_BODY_DEADLINE
    control_deadline: float = CONTROL_DEADLINE
    inactivity: float = INACTIVITY
    connect: float = CONNECT_TIMEOUT
    listing_bytes: int = LISTING_BYTES
    listing_deadline: float = LISTING_DEADLINE
    max_line: int = DEFAULT_MAX_LINE
    max_event: int = DEFAULT_MAX_EVENT

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.connect, read=self.inactivity)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many attempts, and how long between them.

    ``attempts`` counts the first one. The wait doubles from ``backoff`` up to
    ``backoff_max`` with jitter, unless the provider said ``Retry-After``: then exactly
    that, and if it is longer than ``retry_after_max`` the error goes to the caller
    rather than the policy sleeping through it.
    """

    attempts: int = 3
    backoff: float = 0.5
    backoff_max: float = 8.0
    retry_after_max: float = 60.0

    def delay(self, attempt: int, error: ProviderError) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or None: do not retry."""
        if not error.retryable or attempt >= self.attempts:
            return None
        after = getattr(error, "retry_after", None)
        if isinstance(after, int | float):
            after = float(after)
            return after if after <= self.retry_after_max else None
        wait = min(self.backoff_max, self.backoff * 2.0 ** (attempt - 1))
        return wait * (0.5 + random.random() / 2)


NO_RETRY = RetryPolicy(attempts=1)

T = TypeVar("T")


async def retrying(
    attempt: Callable[[], AsyncGenerator[T, None]],
    policy: RetryPolicy,
    *,
    provider: str = "",
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> AsyncGenerator[T | Restarted, None]:
    """Run ``attempt()`` until it finishes, retrying retryable failures within ``policy``.

    A failure before the attempt yielded anything is retried silently; one after it
    yielded is announced with :class:`Restarted` so the consumer discards that output.
    """
    number = 1
    while True:
        yielded = False
        try:
            async with contextlib.aclosing(attempt()) as items:
                async for item in items:
                    yielded = True
                    yield item
            return
        except ProviderError as exc:
            wait = policy.delay(number, exc)
            if wait is None:
                raise
            log.info(
                "provider %s: attempt %d of %d failed (%s); retrying in %.2f s",
                provider or "?",
                number,
                policy.attempts,
                exc,
                wait,
            )
            number += 1
            if yielded:
                yield Restarted(number, str(exc))
        await sleep(wait)


async def retry_call(
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    provider: str = "",
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Await ``call()`` until it returns, retrying retryable failures within ``policy``."""
    number = 1
    while True:
        try:
            return await call()
        except ProviderError as exc:
            wait = policy.delay(number, exc)
            if wait is None:
                raise
            log.info(
                "provider %s: attempt %d of %d failed (%s); retrying in %.2f s",
                provider or "?",
                number,
                policy.attempts,
                exc,
                wait,
            )
            number += 1
        await sleep(wait)


@dataclass(frozen=True, slots=True)
class BoundedText:
    """At most the cap of a body's decoded text; ``complete`` when it is all of it."""

    text: str
    complete: bool
    why: str = ""  # why it is not complete: "deadline", "cap", "connection"


async def read_bounded(
    response: httpx.Response, *, max_chars: int, deadline: float | None
) -> BoundedText:
    """Read ``response``'s body as text, bounded in characters and (optionally) time.

    Malformed bytes become U+FFFD here: an error body is diagnostics, not data. The
    response is closed afterwards whatever happened, which closes its connection when
    the body was not read to the end.
    """
    try:
        decoder = codecs.getincrementaldecoder(response.charset_encoding or "utf-8")("replace")
    except LookupError:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
    parts: list[str] = []
    size = 0
    why = ""
    try:
        async with asyncio.timeout(deadline):
            async for chunk in response.aiter_bytes():
                text = decoder.decode(chunk)
                if size + len(text) > max_chars:
                    parts.append(text[: max_chars - size])
                    size = max_chars
                    why = "cap"
                    break
                parts.append(text)
                size += len(text)
            else:
                text = decoder.decode(b"", final=True)
                if size + len(text) > max_chars:
                    parts.append(text[: max_chars - size])
                    why = "cap"
                else:
                    parts.append(text)
    except TimeoutError:
        why = "deadline"
    except (httpx.HTTPError, OSError):
        why = "connection"
    finally:
        await response.aclose()
    return BoundedText("".join(parts), not why, why)


def parse_retry_after(headers: httpx.Headers, *, now: float | None = None) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis is not None and len(millis) <= RETRY_AFTER_MAX_TEXT:
        with contextlib.suppress(ValueError):
            value = float(millis) / 1000.0
            if math.isfinite(value) and value >= 0:
                return value
    raw = headers.get("retry-after")
    if raw is None or len(raw) > RETRY_AFTER_MAX_TEXT:
        return None
    raw = raw.strip()
    if raw.isascii() and raw.replace(".", "", 1).isdigit():
        return float(raw)
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def is_event_stream(response: httpx.Response) -> bool:
    media = str(response.headers.get("content-type", "")).split(";", 1)[0]
    return media.strip().lower() == "text/event-stream"


@dataclass(frozen=True, slots=True)
class ControlResponse:
    """A bounded control exchange's answer (the body may hold a token: never log it)."""

    status: int
    text: str
    headers: httpx.Headers


class ProviderHTTP:
    """One provider endpoint: bounded requests, redacted diagnostics.

    ``base_url`` may carry query parameters (kept on every request); ``headers`` are
    sent on every request and their values (credentials) are scrubbed from any message.
    Each method is *one attempt*; :func:`retrying` repeats attempts.
    """

    def __init__(
        self,
        base_url: str,
        *,
        name: str = "",
        headers: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        try:
            self.base = httpx.URL(base_url)
        except httpx.InvalidURL:
            raise ProviderError(
                f"provider {name!r}: base_url {redact_url(base_url)!r} is not a URL",
                provider=name,
            ) from None
        self.name = name
        self.limits = limits or Limits()
        self._headers = dict(headers or {})
        values = [*self._headers.values()]
        values += [v.split(" ", 1)[1] for v in values if " " in v]  # "Bearer <key>"
        self._secrets = tuple(v for v in values if len(v) >= 6)
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=self.limits.timeout(), follow_redirects=False
        )

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()

    async def __aenter__(self) -> ProviderHTTP:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def url(self, path: str, params: Mapping[str, str] | None = None) -> httpx.URL:
        """``path`` under the base URL's path, keeping the base's query parameters."""
        base_path = self.base.path.rstrip("/")
        url = self.base.copy_with(path=f"{base_path}/{path.lstrip('/')}")
        return url.copy_merge_params(dict(params)) if params else url

    def _who(self) -> str:
        return f"provider {self.name!r}" if self.name else "provider"

    def _request(
        self,
        method: str,
        url: httpx.URL,
        *,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Request:
        return self._client.build_request(
            method,
            url,
            json=json_body,
            headers={**self._headers, **(headers or {})},
            timeout=timeout or self.limits.timeout(),
        )

    def transport_error(
        self, exc: BaseException, what: str, secrets: tuple[str, ...] = ()
    ) -> ProviderError:
        """An httpx failure as one of ours, its message scrubbed of URLs and secrets."""
        if isinstance(exc, httpx.ReadTimeout):
            return InactivityTimeout(
                f"{self._who()}: no bytes for {self.limits.inactivity:g} s on {what}",
                provider=self.name,
            )
        detail = scrub(str(exc), self._secrets + secrets)
        text = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
        if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
            return ProviderError(f"{self._who()}: {what}: {text}", provider=self.name)
        return TransportError(f"{self._who()}: {what} failed: {text}", provider=self.name)

    async def raise_for_body(
        self, response: httpx.Response, what: str, *, deadline: float | None = None
    ) -> None:
        """Read an error body within bounds, then raise the status's error class.

        ``deadline`` shortens the error-body deadline when an enclosing one (a control
        exchange's, a listing's) has less time left, so that the enclosing deadline
        never fires inside the read and the status's class always wins.
        """
        allowed = self.limits.error_body_deadline
        body = await read_bounded(
            response,
            max_chars=self.limits.error_body_chars,
            deadline=allowed if deadline is None else max(0.0, min(allowed, deadline)),
        )
        status = response.status_code
        cls: type[HTTPStatusError]
        if response.is_success:
            cls = NotAStream
        elif is_context_overflow(status, body.text, body.complete):
            cls = ContextOverflow
        else:
            cls = status_class(status)
        retry_after = parse_retry_after(response.headers)
        notes = []
        if cls is NotAStream:
            media = response.headers.get("content-type", "none").split(";", 1)[0].strip()
            shown = media if _MEDIA_TYPE.fullmatch(media) else "unusual"
            notes.append(f"content-type {shown!r}, not text/event-stream")
        if retry_after is not None:
            notes.append(f"Retry-After {retry_after:g} s")
        if body.complete:
            notes.append(f"error body {len(body.text)} chars")
        else:
            cut = {"cap": "at the cap", "deadline": "at the deadline", "connection": "broken"}
            notes.append(f"error body {cut[body.why]} after {len(body.text)} chars")
        if cls is ContextOverflow:
            notes.append("the prompt is over the model's context window")
        raise cls(
            f"{self._who()}: HTTP {status} from {what} ({'; '.join(notes)})",
            status=status,
            body=body.text,
            body_complete=body.complete,
            retry_after=retry_after,
            provider=self.name,
        )

    async def events(
        self, path: str, json_body: Any, *, headers: Mapping[str, str] | None = None
    ) -> AsyncGenerator[SSEEvent, None]:
        """POST ``json_body`` and yield the SSE events of the answer: one attempt.

        Raises a status error (body read within bounds) unless the answer is a success
        with ``text/event-stream``; :class:`TransportError` if the body is cut (the
        pending event is then never delivered); :class:`MalformedStream` on malformed
        UTF-8; :class:`InactivityTimeout` when no byte arrives for the window. The tail
        event is delivered only after a clean end of body.
        """
        url = self.url(path)
        what = f"POST {redact_url(url)}"
        request = self._request(
            "POST",
            url,
            json_body=json_body,
            headers={"accept": "text/event-stream", **(headers or {})},
        )
        try:
            response = await self._client.send(request, stream=True, follow_redirects=False)
        except httpx.HTTPError as exc:
            raise self.transport_error(exc, what) from None
        try:
            if not response.is_success or not is_event_stream(response):
                await self.raise_for_body(response, what)
            decoder = SSEDecoder(max_line=self.limits.max_line, max_event=self.limits.max_event)
            try:
                async for chunk in response.aiter_bytes():
                    for event in decoder.feed(chunk):
                        yield event
                tail = decoder.close()
            except httpx.HTTPError as exc:
                raise self.transport_error(exc, what) from None
            except SSEDecodeError as exc:
                raise MalformedStream(f"{self._who()}: {what}: {exc}", provider=self.name) from None
            except SSELimitError as exc:
                raise ResponseTooLarge(
                    f"{self._who()}: {what}: {exc}", provider=self.name
                ) from None
            for event in tail:
                yield event
        finally:
            await response.aclose()

    async def get_json(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """GET a JSON document (a model listing): one attempt, capped and deadlined."""
        url = self.url(path, params)
        what = f"GET {redact_url(url)}"
        request = self._request(
            "GET", url, headers={"accept": "application/json", **(headers or {})}
        )
        buf = bytearray()
        loop = asyncio.get_running_loop()
        ends = loop.time() + self.limits.listing_deadline
        response: httpx.Response | None = None
        try:
            async with asyncio.timeout_at(ends):
                response = await self._client.send(request, stream=True, follow_redirects=False)
                if response.is_success:
                    async for chunk in response.aiter_bytes():
                        buf += chunk
                        if len(buf) > self.limits.listing_bytes:
                            raise ResponseTooLarge(
                                f"{self._who()}: {what}: answer over "
                                f"{self.limits.listing_bytes} bytes",
                                provider=self.name,
                            )
        except TimeoutError:
            raise DeadlineExceeded(
                f"{self._who()}: {what} took over {self.limits.listing_deadline:g} s",
                provider=self.name,
            ) from None
        except httpx.HTTPError as exc:
            raise self.transport_error(exc, what) from None
        finally:
            if response is not None and response.is_success:
                await response.aclose()
        if not response.is_success:
            await self.raise_for_body(response, what, deadline=ends - loop.time())
        try:
            return json.loads(buf.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise MalformedResponse(
                f"{self._who()}: {what}: the answer is not UTF-8 JSON", provider=self.name
            ) from None

    async def control(
        self,
        url: str,
        *,
        form: Mapping[str, str] | None = None,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> ControlResponse:
        """POST to a control endpoint (OAuth): request, headers and body in one deadline.

        The body is kept to :attr:`Limits.error_body_chars` of text; a success over that
        raises :class:`ResponseTooLarge`, a failure raises its status class (the body
        kept, cut or not, on the exception and never in its message).
        """
        target = httpx.URL(url)
        what = f"POST {redact_url(target)}"
        request = self._client.build_request(
            "POST",
            target,
            data=dict(form) if form is not None else None,
            json=json_body,
            headers={"accept": "application/json", **(headers or {})},
            timeout=self.limits.timeout(),
        )
        secrets = tuple(v for v in (form or {}).values() if len(v) >= 6)
        deadline = self.limits.control_deadline
        loop = asyncio.get_running_loop()
        ends = loop.time() + deadline
        try:
            async with asyncio.timeout_at(ends):
                response = await self._client.send(request, stream=True, follow_redirects=False)
        except TimeoutError:
            raise DeadlineExceeded(
                f"{self._who()}: no answer from {what} within {deadline:g} s",
                provider=self.name,
            ) from None
        except httpx.HTTPError as exc:
            raise self.transport_error(exc, what, secrets) from None
        if not response.is_success:
            await self.raise_for_body(response, what, deadline=ends - loop.time())
        body = await read_bounded(
            response, max_chars=self.limits.error_body_chars, deadline=ends - loop.time()
        )
        if not body.complete:
            if body.why == "cap":
                raise ResponseTooLarge(
                    f"{self._who()}: {what}: answer over {self.limits.error_body_chars} chars",
                    provider=self.name,
                )
            if body.why == "deadline":
                raise DeadlineExceeded(
                    f"{self._who()}: {what} did not finish within {deadline:g} s",
                    provider=self.name,
                )
            raise TransportError(
                f"{self._who()}: {what}: the answer was cut off", provider=self.name
            )
        return ControlResponse(response.status_code, body.text, response.headers)
