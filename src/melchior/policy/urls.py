"""Is a URL inside a prefix an operator wrote? Compared as URLs, never as strings.

``allow.urls`` says where a receiver's adapters may connect with this machine's tokens
and keys. Compared as text, ``http://127.0.0.1:19601`` would also cover
``http://127.0.0.1:196019/``, ``http://127.0.0.1:19601.attacker.example/`` and
``http://127.0.0.1:19601@attacker.example/`` — a different port, a different host, and a
URL whose host *is* the attacker's. So both sides are parsed the way the HTTP client that
will connect parses them (httpx: the a2a-sdk client and the provider clients use it), and
a URL is inside a prefix only when

* the scheme, the host and the port are the same (a missing port is the scheme's
  default; host names compare without case, as DNS does);
* the URL has no user information (``user@``): a prefix never covers one;
* its path is the prefix's path or below it on a segment boundary (``/v1`` covers
  ``/v1`` and ``/v1/models``, not ``/v10``); a prefix without a path means ``/``;
* its path is judged as the client will send it: plain ``.`` and ``..`` segments are
  resolved by the client before it connects (``/v1/../admin`` is sent as ``/admin``), and
  a percent-encoded one (``%2e%2e``), which the client sends as written and a server may
  resolve out of the prefix, puts the URL outside every prefix.

A prefix that is not an absolute ``http(s)`` URL with a host, carries user information, a
query or a fragment, or has a ``.`` or ``..`` segment as written, covers nothing:
:func:`prefix_problem` says why, so the receiver can warn at start-up instead of silently
never matching.

Pure: parsing only, no lookup.
"""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import urlsplit

import httpx

DEFAULT_PORTS = {"http": 80, "https": 443}


class Origin(NamedTuple):
    scheme: str
    host: str
    port: int
    path: str


def _origin(text: str) -> tuple[Origin | None, str]:
    """The parsed URL, or None and why it is not one a prefix can judge."""
    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        return None, f"it does not parse as a URL ({exc})"
    scheme = url.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        return None, "it is not an http:// or https:// URL"
    if not url.host:
        return None, "it names no host"
    if url.userinfo:
        return None, "it carries user information (user@host)"
    port = url.port if url.port is not None else DEFAULT_PORTS[scheme]
    if not 0 < port <= 65535:
        return None, f"its port {port} is out of range"
    return Origin(scheme, url.host.lower().rstrip("."), port, url.path or "/"), ""


def _segments_clean(path: str) -> bool:
    return all(seg not in (".", "..") for seg in path.split("/"))


def prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` covers no URL at all, or None when it is a usable prefix."""
    origin, why = _origin(prefix)
    if origin is None:
        return why
    url = httpx.URL(prefix)
    if url.query or url.fragment:
        return "it has a query or a fragment, which a prefix cannot have"
    if not _segments_clean(origin.path) or not _segments_clean(urlsplit(prefix).path):
        return "its path has a '.' or '..' segment"
    return None


def within(url: str, prefix: str) -> bool:
    """Is ``url`` inside ``prefix`` (see the module docstring)?"""
    if prefix_problem(prefix) is not None:
        return False
    mine, _ = _origin(url)
    theirs, _ = _origin(prefix)
    if mine is None or theirs is None:
        return False
    if (mine.scheme, mine.host, mine.port) != (theirs.scheme, theirs.host, theirs.port):
        return False
    if not _segments_clean(mine.path):
        return False
    base = theirs.path
    if base == "/" or mine.path == base:
        return True
    return mine.path.startswith(base if base.endswith("/") else base + "/")


def within_any(url: str, prefixes: tuple[str, ...] | list[str]) -> bool:
    return any(within(url, p) for p in prefixes)
