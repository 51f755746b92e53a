"""What can go wrong talking to a provider, sorted by what the caller should do next.

Every error carries ``retryable``: True when the same request may succeed if sent
again (the connection broke, the stream was cut, the provider is overloaded or
rate-limiting), False when it will not (the request was refused, the response is not
what the protocol promises, a credential is missing). The transport's retry policy
reads nothing else, and a caller with its own retry (a relay task lease, a plane turn)
can read the same flag.

Two things never appear in ``str()`` or ``repr()`` of any of these: a response body
(it may echo the prompt, or a token) and a credential-bearing URL (userinfo and query
values are redacted by :func:`melchior.providers.redact.redact_url` before a URL is
written into a message). An error body read within bounds is kept on
:attr:`HTTPStatusError.body` for whoever decides to show it, and is used here only to
classify a context overflow, and only when the whole body arrived.
"""

from __future__ import annotations

import re


class ProviderError(Exception):
    """Base of everything this package raises about a provider.

    ``provider`` names the configured provider (``[providers.NAME]``) when known.
    """

    retryable = False

    def __init__(self, message: str, *, provider: str = "", retryable: bool | None = None) -> None:
        super().__init__(message)
        self.provider = provider
        if retryable is not None:
            self.retryable = retryable


class CredentialMissing(ProviderError):
    """The environment variable named by ``api_key_env`` is unset or empty."""


class TransportError(ProviderError):
    """The exchange broke: no connection, a reset, a body cut short. Worth retrying."""

    retryable = True


class InactivityTimeout(TransportError):
    """No byte arrived for the inactivity window (pings count as bytes)."""


class MalformedResponse(TransportError):
    """The answer broke its own protocol: not UTF-8, not JSON, not the promised shape.

    Retryable: a proxy that garbled or cut one response usually does not garble the next.
    """


class MalformedStream(MalformedResponse):
    """A stream that is not UTF-8, carries an event that is not JSON, or ended without
    its terminal event."""


class DeadlineExceeded(TransportError):
    """A bounded exchange (an OAuth token request) did not finish within its deadline."""


class ResponseTooLarge(ProviderError):
    """A line, an event, a listing or a control response is over its cap.

    Not retryable: the same request gets the same answer, and the cap exists so that a
    hostile or broken server cannot make the client hold unbounded data.
    """


class HTTPStatusError(ProviderError):
    """The provider answered with a status that is not success (or a 200 that is not SSE).

    ``status`` is the HTTP status; ``retry_after`` the seconds a ``Retry-After`` (or
    ``retry-after-ms``) header asked for, if any; ``body`` the first at most 64 KiB of
    the decoded error body and ``body_complete`` whether that is all of it. The class is
    decided by the status alone, so a body that could not be read (deadline, cap,
    broken connection) never changes whether the request is retried.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int,
        body: str = "",
        body_complete: bool = False,
        retry_after: float | None = None,
        provider: str = "",
    ) -> None:
        super().__init__(message, provider=provider)
        self.status = status
        self.body = body
        self.body_complete = body_complete
        self.retry_after = retry_after


class RateLimited(HTTPStatusError):
    """429: retried after ``Retry-After`` when the policy allows the wait."""

    retryable = True


class ServerError(HTTPStatusError):
    """5xx, 408: the provider failed or timed out on its side."""

    retryable = True


class RequestRefused(HTTPStatusError):
    """Any other 4xx (and unfollowed 3xx): the request itself is at fault."""


class ContextOverflow(RequestRefused):
    """The prompt does not fit the model's context window (from a complete error body)."""


class NotAStream(HTTPStatusError):
    """A success status whose body is not ``text/event-stream``; read as an error body."""


class StreamError(ProviderError):
    """The provider reported an error inside a successful stream (``event: error``).

    ``code`` is the provider's error type when it is a short identifier (for example
    ``overloaded_error``); the provider's message is a body and stays out.
    """

    def __init__(self, message: str, *, code: str, retryable: bool, provider: str = "") -> None:
        super().__init__(message, provider=provider, retryable=retryable)
        self.code = code


RETRYABLE_STATUSES = frozenset({408, 429})
"""Besides every 5xx (Anthropic's 529 "overloaded" included)."""

_OVERFLOW = re.compile(
    r"context[_ ]length[_ ]exceeded|maximum context length|context window|"
    r"prompt is too long|input is too long|too many (input )?tokens|"
    r"exceeds? the (model's )?(context|max(imum)? (input|prompt))|"
    r"input length and `?max_tokens`? exceed|context length",
    re.IGNORECASE,
)
OVERFLOW_STATUSES = frozenset({400, 413, 422})


def status_class(status: int) -> type[HTTPStatusError]:
    """The error class for a non-success status, by the status alone."""
    if status == 429:
        return RateLimited
    if status >= 500 or status in RETRYABLE_STATUSES:
        return ServerError
    return RequestRefused


def is_context_overflow(status: int, body: str, complete: bool) -> bool:
    """Does a *complete* error body say the prompt is over the context window?

    A cut-off body is never classified: its missing part could say something else,
    and a wrong "overflow" would make a caller shrink a prompt that was fine.
    """
    return complete and status in OVERFLOW_STATUSES and _OVERFLOW.search(body) is not None


_SAFE_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")


def safe_code(value: object) -> str:
    """A provider's error type if it is a short identifier, else ``unknown``."""
    if isinstance(value, str) and _SAFE_CODE.fullmatch(value):
        return value
    return "unknown"
