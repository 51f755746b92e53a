"""What a relay said no with, read one way for every client: :class:`RelayError`.

The relay answers a refusal in one of two shapes, by surface:

- the control API (``/api/...``): ``{"error": {"code", "reason", "rule"}}`` — ``code`` a
  short word (``forbidden``, ``not_found``), ``reason`` the sentence;
- the A2A entry (``/a2a/...``): a ``google.rpc.Status`` — ``{"error": {"code": HTTP,
  "status", "message", "details": [ErrorInfo...]}}`` — ``status`` the gRPC name
  (``PERMISSION_DENIED``), ``message`` the sentence, the ErrorInfo's ``reason`` the A2A
  or relay reason (``TASK_NOT_FOUND``, ``HOP_LIMIT``, ``QUOTA_EXCEEDED``) and its
  ``metadata`` the details (a quota's ``retryAfter``); a stream that fails after it
  began sends the same body as an ``event: error``.

:func:`refusal` turns either (or an answer that is neither: a proxy's HTML page, a
truncated body) into one exception carrying the HTTP status, the code, the reason and
the relay's sentence, so ``mellan send``, ``mellan task``, the MCP bridge and a program
using :class:`~melchior.mellan.client.caller.RelayClient` all report the same refusal
with the same words. Failures that never got an answer (no connection, a certificate
that does not verify, an answer too big or not JSON) are the same type with ``status``
``None`` and a ``code`` saying which.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from melchior.mellan.rawjson import decode

UNREACHABLE = "unreachable"
"""``code`` of a relay that could not be reached (no answer at all)."""
UNTRUSTED = "untrusted"
"""``code`` of a TLS handshake that failed (certificate, client certificate)."""
BAD_ANSWER = "bad-answer"
"""``code`` of an answer this client will not use (too big, not JSON, wrong shape)."""
BAD_ARGS = "bad-args"
"""``code`` of a call refused before anything was sent (a bad agent id, a bad mode)."""

SEALED = "sealed"
"""``code`` of a sealed send not made (no key, a changed key) or a sealed result that
does not open: this client's refusal, nothing the relay said."""

SHOWN_TEXT = 200
"""Characters of a non-JSON error answer quoted in the message."""


class RelayError(Exception):
    """The relay refused, failed, or could not be reached; ``str()`` says why in one line.

    ``status`` is the HTTP status (None: no answer), ``code`` the control API's code or
    the A2A ``google.rpc`` status name (or one of this module's words for no answer),
    ``reason`` the A2A ErrorInfo reason when there is one, ``sentence`` the relay's own
    words, ``retry_after`` the seconds a 429 or 503 asks to wait, ``details`` the
    ErrorInfo metadata."""

    def __init__(
        self,
        sentence: str,
        *,
        status: int | None = None,
        code: str = "error",
        reason: str = "",
        retry_after: float | None = None,
        details: Mapping[str, str] | None = None,
        said: bool = True,
        text: str = "",
    ) -> None:
        self.sentence = sentence
        self.status = status
        self.code = code
        self.reason = reason
        self.retry_after = retry_after
        self.details = dict(details or {})
        self.said = said
        """Whether ``sentence`` is the relay's (False: this client's, about the answer)."""
        self.text = text
        """The exact JSON of an error a stream sent (``event: error``), else empty."""
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.status is None or not self.said:
            return self.sentence
        return f"{self.sentence} ({self.code}, HTTP {self.status})"

    @property
    def unreachable(self) -> bool:
        """Nothing is known to have happened: no answer, or the relay's store is down."""
        return (self.status is None and self.code in (UNREACHABLE, UNTRUSTED)) or (
            self.status == 503
        )


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else " " for c in text)


def _seconds(value: Any) -> float | None:
    """A ``Retry-After`` of whole seconds (an HTTP date is not worth parsing here)."""
    text = str(value).strip() if value is not None else ""
    if text.isascii() and text.isdigit() and len(text) <= 9:
        return float(int(text))
    return None


def refusal(
    status: int, content: bytes, headers: Mapping[str, str] | None = None, where: str = ""
) -> RelayError:
    """The one decoder: an error answer of either surface, or of neither, as a RelayError.
    ``where`` (method and URL) is named only when the answer says nothing itself."""
    head = {k.lower(): v for k, v in (headers or {}).items()}
    try:
        data = decode(content) if content else None
    except (ValueError, RecursionError):  # not JSON, or nested past what a parser follows
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        sentence = error.get("message") or error.get("reason")
        if isinstance(sentence, str) and sentence:
            return _said(status, error, sentence, head)
    text = _printable(content[: SHOWN_TEXT * 4].decode("utf-8", "replace"))[:SHOWN_TEXT]
    at = f" from {where}" if where else ""
    return RelayError(
        f"HTTP {status}{at}: {text}".rstrip(": ") if text else f"HTTP {status}{at}",
        status=status,
        code="http",
        retry_after=_seconds(head.get("retry-after")),
        said=False,
    )


def _said(status: int, error: dict[str, Any], sentence: str, head: dict[str, str]) -> RelayError:
    """A refusal the relay put in words: the A2A Status form or the control API's."""
    reason = ""
    details: dict[str, str] = {}
    for d in error.get("details") or []:
        if isinstance(d, dict) and isinstance(d.get("reason"), str) and not reason:
            reason = d["reason"]
            meta = d.get("metadata")
            if isinstance(meta, dict):
                details = {str(k): str(v) for k, v in meta.items()}
    kind = error.get("status") if isinstance(error.get("status"), str) else error.get("code")
    code = kind if isinstance(kind, str) and kind else "error"
    retry = _seconds(head.get("retry-after")) or _seconds(details.get("retryAfter"))
    return RelayError(
        _printable(sentence), status=status, code=code, reason=reason, retry_after=retry,
        details=details,
    )  # fmt: skip


def stream_refusal(body: Any, text: str = "") -> RelayError:
    """An ``event: error`` a stream sent after it began (the same Status body); ``text``
    its exact JSON, kept on the error for a caller that prints what it received."""
    error = body.get("error") if isinstance(body, dict) else None
    found = RelayError(
        "the stream failed with an error the relay did not describe", code=BAD_ANSWER, said=False
    )
    if isinstance(error, dict):
        sentence = error.get("message") or error.get("reason")
        code = error.get("code")
        status = code if isinstance(code, int) and 100 <= code <= 599 else 500
        if isinstance(sentence, str) and sentence:
            found = _said(status, error, sentence, {})
    found.text = text
    return found
