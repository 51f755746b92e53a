"""OAuth token and refresh requests, within the control-response bounds.

A token endpoint is a control exchange (:meth:`ProviderHTTP.control`): the request,
the response headers and the body share one 10-second deadline, and at most 64 KiB of
text is read. The answer holds credentials, so :class:`TokenSet` never shows its
tokens in ``repr``, and no error carries the form sent or the body received.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from melchior.providers.errors import MalformedResponse
from melchior.providers.redact import redact_url
from melchior.providers.transport import ProviderHTTP

MAX_EXPIRES_IN = 10 * 365 * 24 * 3600


@dataclass(frozen=True, slots=True)
class TokenSet:
    """An access token and what came with it; ``expires_at`` is a Unix time."""

    access_token: str = field(repr=False)
    token_type: str = "Bearer"
    expires_at: float | None = None
    refresh_token: str | None = field(default=None, repr=False)
    scope: str | None = None


async def request_token(
    http: ProviderHTTP, token_url: str, form: Mapping[str, str], *, now: float | None = None
) -> TokenSet:
    """POST ``form`` to ``token_url`` and read the token answer (RFC 6749 §5.1)."""
    answer = await http.control(token_url, form=form)
    where = f"the token answer from {redact_url(token_url)}"
    try:
        data = json.loads(answer.text)
    except (ValueError, RecursionError):
        raise MalformedResponse(f"{where} is not JSON", provider=http.name) from None
    if not isinstance(data, dict):
        raise MalformedResponse(f"{where} is not a JSON object", provider=http.name)
    token, kind = data.get("access_token"), data.get("token_type", "Bearer")
    if not isinstance(token, str) or not token or not isinstance(kind, str):
        raise MalformedResponse(f"{where} has no access_token", provider=http.name)
    expires = data.get("expires_in")
    expires_at = None
    if isinstance(expires, bool) or not isinstance(expires, int | float):
        expires = None
    if expires is not None and 0 <= expires <= MAX_EXPIRES_IN:
        expires_at = (time.time() if now is None else now) + float(expires)
    refresh, scope = data.get("refresh_token"), data.get("scope")
    return TokenSet(
        token,
        kind,
        expires_at,
        refresh if isinstance(refresh, str) and refresh else None,
        scope if isinstance(scope, str) else None,
    )


async def refresh_token(
    http: ProviderHTTP,
    token_url: str,
    refresh: str,
    *,
    client_id: str | None = None,
    scope: str | None = None,
    now: float | None = None,
) -> TokenSet:
    """Exchange a refresh token for a new access token (``grant_type=refresh_token``).

    A provider that does not rotate refresh tokens answers without one; the caller
    keeps the old one then.
    """
    form = {"grant_type": "refresh_token", "refresh_token": refresh}
    if client_id is not None:
        form["client_id"] = client_id
    if scope is not None:
        form["scope"] = scope
    return await request_token(http, token_url, form, now=now)
