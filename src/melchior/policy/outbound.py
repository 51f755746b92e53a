"""Where the relay may send a request of its own (a push notification, a wake-up).

A relay that POSTs to URLs its callers choose can be pointed at what only it can reach:
its own loopback, the cloud metadata service on a link-local address, a database on the
private network (server-side request forgery). So an endpoint must be public unless the
workspace's owner said otherwise — a webhook on a private network is often exactly what
is wanted, and only the owner can say it is. The check runs twice: on the URL when it is
given (a literal address is refused at once, with its reason), and on every address its
host resolves to when a request is about to go (a name can point anywhere, and can
change), after which the request goes to the address checked, not to a second lookup.

Plain ``http`` is refused for public hosts: a push carries the caller's token and the
task's content. On a private network the owner who allowed it may use ``http``.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from melchior.policy.decision import Decision, allow, refuse

MAX_URL = 2048


def public(address: str) -> bool:
    """Globally routable unicast: not loopback, private, link-local, shared (CGNAT),
    reserved, multicast or unspecified — IPv4-mapped IPv6 judged as its IPv4 address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


def check_url(url: str, *, allow_private: bool, what: str = "a push URL") -> Decision:
    """An endpoint a caller may give: ``https://HOST[:PORT]/…`` (``http`` only where private
    addresses are allowed), no credentials in it, no literal non-public address unless
    allowed. Host names are judged when they are resolved (:func:`check_addresses`)."""
    if len(url) > MAX_URL:
        return refuse("bad-url", f"{what} must be at most {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return refuse("bad-url", f"{what} is not a URL: {exc}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return refuse("bad-url", f"{what} must be https://HOST/…, not {url[:100]!r}")
    if parts.username is not None or parts.password is not None:
        return refuse(
            "bad-url", f"{what} must not carry credentials; use the token or authentication"
        )
    if port == 0:
        return refuse("bad-url", f"{what} names port 0")
    if parts.scheme == "http" and not allow_private:
        return refuse(
            "plain-http",
            f"{what} must use https: a push carries your token and the task's content "
            "(http is allowed only where the workspace allows private addresses)",
        )
    literal = _literal(parts.hostname)
    if literal is not None and not allow_private and not public(literal):
        return refuse(
            "private-address",
            f"{parts.hostname} is not a public address; the workspace owner may allow "
            "private addresses (mellan push private on)",
        )
    return allow("endpoint", f"{what} to a host that will be checked when it is resolved")


def check_addresses(host: str, addresses: list[str], *, allow_private: bool) -> Decision:
    """Every address ``host`` resolved to must be public (unless allowed): a name with one
    private address among public ones could be made to reach it."""
    if not addresses:
        return refuse("unresolvable", f"{host} does not resolve to any address")
    if allow_private:
        return allow("private-allowed", "the workspace allows private addresses")
    bad = sorted({a for a in addresses if not public(a)})
    if bad:
        return refuse(
            "private-address",
            f"{host} resolves to {', '.join(bad)}, not a public address; the workspace "
            "owner may allow private addresses (mellan push private on)",
        )
    return allow("public-address", f"{host} resolves to public addresses only")
