"""One POST from the relay to a URL someone else chose, safely: the webhook transport that
push notifications (:mod:`.push`) and wake-ups (:mod:`.wake`) share.

A URL given to the relay is a way to make the relay send requests inside its own network
(SSRF). So before anything is sent:

- the URL is checked (:func:`melchior.policy.outbound.check_url`: scheme, no credentials
  in it, how the host is written, literal addresses judged by the allow-list);
- its host is resolved *here* and every address checked
  (:func:`melchior.policy.outbound.check_addresses`);
- the request goes to the address that was checked — never to a second lookup that could
  answer differently (DNS rebinding) — with the original ``Host`` header and TLS server
  name, so virtual hosts and certificates still work.

:func:`vet` runs the very same steps when a URL is given (a push config, a wake URL), so
what would be refused at delivery is refused then, with its reason.

No redirects are followed; at most ``max_response`` bytes of the answer are read (only
its status matters); the whole exchange is bounded by ``timeout``. A refusal by the
policy is :class:`Refused` (permanent); a transport failure is :class:`Failed` (worth
retrying). The status code is returned for the caller to judge.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from melchior.policy.decision import Decision, allow, refuse
from melchior.policy.outbound import check_addresses, check_url

MAX_RESPONSE = 64 * 1024
"""Bytes of an answer read at most."""


class Refused(Exception):
    """The policy refuses this delivery (a permanent failure)."""


class Failed(Exception):
    """One POST failed; ``retry`` says whether trying again later may help."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


Resolver = Callable[[str, int], Awaitable[list[str]]]


async def resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def _judged(
    url: str,
    *,
    allow_private: bool,
    resolver: Resolver,
    timeout: float,  # noqa: ASYNC109
) -> Decision | list[str]:
    """The checked URL's host resolved, every address judged: the addresses, or the
    refusing decision (the policy says no); :class:`Failed` when the lookup fails."""
    verdict = check_url(url, allow_private=allow_private)
    if not verdict.allowed:
        return verdict
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = await asyncio.wait_for(resolver(host, port), timeout)
    except (OSError, TimeoutError) as exc:
        raise Failed(f"cannot resolve {host}: {exc}", retry=True) from None
    checked: Decision = check_addresses(host, addresses, allow_private=allow_private)
    return addresses if checked.allowed else checked


async def vet(
    url: str,
    *,
    allow_private: bool,
    resolver: Resolver = resolve,
    timeout: float = 5.0,  # noqa: ASYNC109 - one bound for the lookup
) -> Decision:
    """Judge an endpoint when it is given exactly as it will be judged when a request
    goes (:func:`post_checked`): the URL, then every address its host resolves to now.
    A caller is told no at once rather than yes and a delivery that never happens; a
    name that does not resolve now is refused too, saying so."""
    try:
        judged = await _judged(url, allow_private=allow_private, resolver=resolver, timeout=timeout)
    except Failed as exc:
        return refuse("unresolvable", f"{exc}; give an endpoint whose name resolves")
    if isinstance(judged, Decision):
        return judged
    return allow("endpoint", "the URL and every address it resolves to are allowed")


async def post_checked(
    http: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    allow_private: bool,
    resolver: Resolver = resolve,
    timeout: float,  # noqa: ASYNC109 - one bound for resolving and the exchange together
    max_response: int = MAX_RESPONSE,
) -> int:
    """POST ``body`` to ``url`` as the module docstring says; the answer's status code."""
    addresses = await _judged(url, allow_private=allow_private, resolver=resolver, timeout=timeout)
    if isinstance(addresses, Decision):
        raise Refused(f"{addresses.rule}: {addresses.reason}")
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = addresses[0]
    pinned = f"[{address}]" if ":" in address else address
    target = urlunsplit((parts.scheme, f"{pinned}:{port}", parts.path or "/", parts.query, ""))
    sent = {"Host": parts.netloc.rpartition("@")[2], **headers}
    extensions: dict[str, Any] = {}
    if parts.scheme == "https":
        extensions["sni_hostname"] = host
    try:
        async with asyncio.timeout(timeout):
            request = http.build_request(
                "POST", target, content=body, headers=sent, extensions=extensions
            )
            response = await http.send(request, stream=True)
            try:
                read = 0
                async for chunk in response.aiter_raw():
                    read += len(chunk)
                    if read >= max_response:
                        break
            finally:
                await response.aclose()
    except TimeoutError:
        raise Failed(f"no answer within {timeout:g} s", retry=True) from None
    except httpx.HTTPError as exc:
        raise Failed(f"{type(exc).__name__}: {exc}", retry=True) from None
    return response.status_code
