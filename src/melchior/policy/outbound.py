"""Where the relay may send a request of its own (a push notification, a wake-up).

A relay that POSTs to URLs its callers choose can be pointed at what only it can reach:
its own loopback, the cloud metadata service on a link-local address, a database on the
private network (server-side request forgery). So an endpoint must be public unless the
workspace's owner said otherwise — a webhook on a private network is often exactly what
is wanted, and only the owner can say it is — but never link-local space or a cloud
metadata service, which hold the relay machine's own credentials.

The wall is an allow-list (:func:`judge_address`): public unicast, and private networks
where allowed; everything else is refused, naming why. IPv6 forms that carry an IPv4
address (mapped, NAT64, 6to4, IPv4-compatible) are judged as that address, and the ones
that hide it (Teredo, local NAT64) are refused. A host is written as a canonical IP
address or an ASCII DNS name (:func:`check_host`): the other spellings of an IPv4 address
that resolvers accept (``2130706433``, ``0x7f000001``, ``127.1``) are refused.

The same check runs when a URL is given — its host resolved then, so the caller is told
no at once — and again when a request is about to go (a name can point anywhere, and can
change), after which the request goes to the address checked, not to a second lookup.

Plain ``http`` is refused for public hosts: a push carries the caller's token and the
task's content. On a private network the owner who allowed it may use ``http``.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from melchior.policy.decision import Decision, allow, refuse

MAX_URL = 2048

IP = ipaddress.IPv4Address | ipaddress.IPv6Address

# -- the allow-list: what may be reached, everything else refused ---------------------------

PUBLIC_V6 = ipaddress.ip_network("2000::/3")
"""IPv6 global unicast: the only IPv6 space a public endpoint can be in."""

PRIVATE_NETS = tuple(
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",  # RFC 1918
        "100.64.0.0/10",  # shared address space (CGNAT)
        "127.0.0.0/8", "::1/128",  # loopback
        "fc00::/7",  # unique local IPv6
    )
)  # fmt: skip
"""What ``mellan push private on`` adds to the public space: private networks and the
relay's own loopback — never link-local, metadata, multicast or unspecified."""

METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack…
        "169.254.170.2",  # AWS ECS task metadata
        "100.100.100.200",  # Alibaba Cloud (inside the CGNAT range)
        "fd00:ec2::254",  # AWS IMDS over IPv6 (inside the unique-local range)
        "fd20:ce::254",  # GCP metadata over IPv6
    )
)
"""Cloud metadata services: the credentials of the machine the relay runs on. Refused
whatever the workspace allows, even where they sit inside an allowed private range."""

# IPv6 forms that carry an IPv4 address: judged as the IPv4 address they reach.
_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")
_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")
# Refused outright: where the IPv4 address cannot be read off, or is a local choice.
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_TEREDO = ipaddress.ip_network("2001::/32")


def unwrap(ip: IP) -> IP | None:
    """The address an IPv6 transition form really reaches: the IPv4 address inside an
    IPv4-mapped, -translated or -compatible address, a NAT64 (64:ff9b::/96) or a 6to4
    (2002::/16) address; None for forms whose target cannot be judged (local-use NAT64
    64:ff9b:1::/48, Teredo 2001::/32). Anything else is itself."""
    if isinstance(ip, ipaddress.IPv4Address):
        return ip
    if ip in _NAT64_LOCAL or ip in _TEREDO:
        return None
    value = int(ip)
    for net in (_MAPPED, _TRANSLATED, _NAT64):
        if ip in net:
            return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if ip in _SIX_TO_FOUR:
        return ipaddress.IPv4Address((value >> 80) & 0xFFFFFFFF)
    if ip in _COMPATIBLE and value > 1:  # :: and ::1 are themselves
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    return ip


def judge_address(address: str, *, allow_private: bool) -> Decision:
    """May the relay send to ``address``? An allow-list: a globally routable unicast
    address (IPv6 only inside 2000::/3), or — where the workspace allows private
    addresses — one of :data:`PRIVATE_NETS`. Metadata addresses, link-local, multicast,
    unspecified and reserved space are refused always; a transition form is judged as
    the IPv4 address it carries (:func:`unwrap`)."""
    try:
        ip: IP | None = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return refuse("bad-address", f"{address!r} is not an IP address")
    assert ip is not None
    inner = unwrap(ip)
    if inner is None:
        return refuse(
            "transition-address",
            f"{address} is a Teredo or local NAT64 address, whose real target cannot be "
            "judged; use the endpoint's own address",
        )
    shown = address if inner == ip else f"{address} (that is {inner})"
    if inner in METADATA:
        return refuse(
            "metadata-address",
            f"{shown} is a cloud metadata service, which the relay never calls",
        )
    if inner.is_link_local:
        return refuse("link-local", f"{shown} is link-local, which the relay never calls")
    public = (
        inner.is_global
        and not inner.is_multicast
        and (isinstance(inner, ipaddress.IPv4Address) or inner in PUBLIC_V6)
    )
    if public:
        return allow("public-address", f"{shown} is a public address")
    if any(inner in net for net in PRIVATE_NETS if net.version == inner.version):
        if allow_private:
            return allow("private-allowed", f"{shown} is private; the workspace allows it")
        return refuse(
            "private-address",
            f"{shown} is not a public address; the workspace owner may allow private "
            "addresses (mellan push private on)",
        )
    return refuse(
        "not-routable",
        f"{shown} is not an address an endpoint can have (unspecified, multicast, "
        "broadcast or reserved)",
    )


def public(address: str) -> bool:
    """Whether ``address`` is allowed with private addresses off (see
    :func:`judge_address`)."""
    return judge_address(address, allow_private=False).allowed


# -- host names: an allow-list of how a host may be written ---------------------------------

_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
_NUMERIC = re.compile(r"[0-9a-fx.]+")
LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def _literal(host: str) -> str | None:
    """The canonical text of an IP literal host, or None when ``host`` is not one."""
    inner = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(inner))
    except ValueError:
        return None


def check_host(host: str, *, allow_private: bool) -> Decision:
    """How a host may be written: an IP address in its canonical form (judged at once),
    or an ASCII DNS name of letter-digit-hyphen labels (an internationalised name in its
    ``xn--`` form), judged when it is resolved. Refused: the other spellings resolvers
    read as IPv4 (``0``, ``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1``), any
    non-ASCII name (``ⓛⓞⓒⓐⓛⓗⓞⓢⓣ`` is ``localhost`` to IDNA), and — unless private
    addresses are allowed — the names of the relay's own machine (``localhost``,
    ``*.localhost``, with or without a final dot)."""
    literal = _literal(host)
    if literal is not None:
        bare = host.strip("[]").split("%", 1)[0].lower()
        if ":" not in bare and bare != literal:
            return refuse("bad-host", f"{host} is not an IPv4 address in dotted-quad form")
        return judge_address(literal, allow_private=allow_private)
    name = host.lower()
    if name.endswith("."):
        name = name[:-1]
    if not host.isascii():
        return refuse(
            "bad-host",
            f"host {host!r} is not ASCII; write an internationalised name in its xn-- form",
        )
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return refuse("bad-host", f"host {host!r} is not a DNS name or an IP address")
    if _NUMERIC.fullmatch(name) and (labels[-1].isdigit() or name.startswith("0x")):
        return refuse(
            "bad-host",
            f"{host} reads as an IPv4 address in a non-standard form; write it as four "
            "decimal numbers (a.b.c.d)",
        )
    if name in LOCAL_NAMES or name.endswith(".localhost"):
        if allow_private:
            return allow("private-allowed", f"{host} is this machine; the workspace allows it")
        return refuse(
            "private-address",
            f"{host} is this machine, not a public address; the workspace owner may allow "
            "private addresses (mellan push private on)",
        )
    return allow("name", f"{host} will be judged by the addresses it resolves to")


def check_url(url: str, *, allow_private: bool, what: str = "a push URL") -> Decision:
    """An endpoint a caller may give: ``https://HOST[:PORT]/…`` (``http`` only where private
    addresses are allowed), no credentials in it, a host as :func:`check_host` allows.
    Host names are judged again when they are resolved (:func:`check_addresses`)."""
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
    return check_host(parts.hostname, allow_private=allow_private)


def check_addresses(host: str, addresses: list[str], *, allow_private: bool) -> Decision:
    """Every address ``host`` resolved to must be allowed (:func:`judge_address`): a name
    with one refused address among allowed ones could be made to reach it."""
    if not addresses:
        return refuse("unresolvable", f"{host} does not resolve to any address")
    for address in sorted(set(addresses)):
        verdict = judge_address(address, allow_private=allow_private)
        if not verdict.allowed:
            return refuse(verdict.rule, f"{host} resolves to {verdict.reason}")
    if allow_private:
        return allow("private-allowed", f"{host} resolves to addresses the workspace allows")
    return allow("public-address", f"{host} resolves to public addresses only")


# -- a credential in clear: to this machine's loopback or nowhere ---------------------------


def loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback: the name ``localhost`` (in any case,
    as DNS names are), or an IP literal in ``127.0.0.0/8``, ``::1`` or an IPv4-mapped
    ``::ffff:127.x.y.z`` (brackets allowed). Nothing else: not ``*.localhost`` or
    ``localhost.``, which a resolver may send to the network, nor the other spellings of
    127.0.0.1 (``127.1``, ``2130706433``) that only some parsers read as it.

    The one answer for every place that lets something through because it stays on this
    machine: a credential over plain ``http`` (relay clients, the a2a runtime), a relay
    serving plain ``http``, a plane webhook's listening address.
    """
    name = host.strip()
    if name[:1] == "[" and name[-1:] == "]":
        name = name[1:-1]
    if name.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def may_carry_credential(url: str, *, what: str = "a credential") -> Decision:
    """Whether a request to ``url`` may carry ``what`` (a bearer token, a client secret):
    over ``https`` to anywhere, over plain ``http`` only to :func:`loopback` — anyone on
    the network path could otherwise read it and use it."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return allow("credential-over-tls", f"{what} goes to {parts.hostname} over TLS")
    if parts.scheme != "http" or not parts.hostname:
        return refuse("credential-scheme", f"{url!r} is not an http(s)://HOST URL")
    if loopback(parts.hostname):
        return allow("credential-loopback", f"{what} stays on this machine ({parts.hostname})")
    return refuse(
        "credential-in-clear",
        f"{what} would cross the network readable over plain http to {parts.hostname}: "
        "anyone on the path could read and reuse it",
    )
