"""URLs and text made safe for diagnostics: no userinfo, no query values, no secrets.

A provider's base URL may carry a credential (``https://user:key@host``, ``?key=…``);
an exception message or a log line that printed it would leak the credential into
logs, terminals and bug reports. Every URL this package writes into a message goes
through :func:`redact_url`, and text that came from elsewhere (an httpx exception's
message) through :func:`scrub`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import httpx

REDACTED = "REDACTED"
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def redact_url(url: str | httpx.URL) -> str:
    """``scheme://host:port/path`` plus query keys with their values replaced.

    Userinfo and the fragment are dropped. Something that does not parse as an
    absolute URL is not echoed at all (it may be a key pasted in the wrong place).
    """
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
        netloc = parsed.netloc.decode("ascii")
        query = "&".join(f"{key}={REDACTED}" for key, _ in parsed.params.multi_items())
    except (httpx.InvalidURL, UnicodeError, TypeError, ValueError):
        return "<unparseable URL>"
    if not parsed.scheme or not netloc:
        return "<not an absolute URL>"
    text = f"{parsed.scheme}://{netloc}{parsed.path}"
    return f"{text}?{query}" if query else text


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every URL in it redacted and every given secret replaced."""
    out = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    for secret in secrets:
        if secret:
            out = out.replace(secret, REDACTED)
    return out
