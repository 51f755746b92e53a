"""One answer to "does this stay on this machine?" and one to "may a credential go there
in clear?" (melchior.policy.outbound), and every place that asks gets the same answer for
every spelling of a host: a relay client, the a2a runtime, the relay serving plain http.

Before, "loopback" was written four ways: ``http://LOCALHOST`` was allowed by the relay
client and refused by the a2a runtime, ``foo.localhost`` passed one and not the others.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.mellan import transport
from melchior.mellan.relay.server import serve
from melchior.plane import config as plane_config
from melchior.policy.outbound import loopback, may_carry_credential
from melchior.runtimes import a2a

LOOPBACK = ["localhost", "LOCALHOST", "LocalHost", "127.0.0.1", "127.0.0.2", "127.255.255.254",
            "::1", "[::1]", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1"]  # fmt: skip

ELSEWHERE = [
    "localhost.",  # a resolver may ask the network for the fully qualified name
    "foo.localhost",  # only some resolvers keep *.localhost here
    "localhost.example.com",
    "127.1",  # spellings of 127.0.0.1 that only some parsers read as it
    "2130706433",
    "0x7f000001",
    "0177.0.0.1",
    "0.0.0.0",
    "::",
    "10.0.0.1",
    "192.168.1.1",
    "::ffff:10.0.0.1",
    "64:ff9b::7f00:1",  # NAT64: goes through a translator, not to this machine
    "2002:7f00:1::",
    "ⓛⓞⓒⓐⓛⓗⓞⓢⓣ",
    "example.com",
    "",
]


def url_host(host: str) -> str:
    """The host as it sits in a URL (IPv6 literals bracketed)."""
    bare = host.strip("[]")
    return f"[{bare}]" if ":" in bare else host


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_spellings(host: str) -> None:
    assert loopback(host)


@pytest.mark.parametrize("host", ELSEWHERE)
def test_spellings_that_may_leave_this_machine(host: str) -> None:
    assert not loopback(host)


def every_place_says(host: str) -> set[bool]:
    """Whether each place lets a credential go in clear to ``host`` (or, the relay,
    serve plain http on it)."""
    url = f"http://{url_host(host)}:8787/"
    answers = {bool(may_carry_credential(url))}
    try:
        transport.check_url(url, credential=True)
        answers.add(True)
    except transport.TransportError:
        answers.add(False)
    answers.add(a2a.check_url(url, insecure=False, what="card_url") is None)
    answers.add(serve.loopback(host))
    if not host.startswith("["):  # the plane's webhook takes an address to bind
        answers.add(webhook_may_listen_on(host))
    return answers


PLANE = """
[webhook]
listen = {listen}

[[agents]]
id = "planner"
description = "plans"
runtime = "command"
options = {{ argv = ["true"] }}
"""


def webhook_may_listen_on(host: str) -> bool:
    try:
        plane_config.parse(PLANE.format(listen=json.dumps(host)), Path("PLANE.toml"))
    except plane_config.PlaneConfigError as why:
        refused = str(why)
    else:
        return True
    assert "webhook.listen must be a loopback address" in refused
    return False


@pytest.mark.parametrize("host", [h for h in LOOPBACK if h] + [h for h in ELSEWHERE if h])
def test_every_place_gives_the_same_answer(host: str) -> None:
    assert every_place_says(host) == {loopback(host)}


@given(st.ip_addresses())
def test_an_address_is_loopback_only_where_it_reaches_this_machine(ip: Any) -> None:
    reaches_here = ip.is_loopback or (
        isinstance(ip, ipaddress.IPv6Address)
        and ip.ipv4_mapped is not None
        and ip.ipv4_mapped.is_loopback
    )
    assert loopback(str(ip)) == reaches_here
    assert every_place_says(str(ip)) == {reaches_here}


@given(st.text(max_size=40))
def test_any_host_text_gets_one_answer_without_error(host: str) -> None:
    assert isinstance(loopback(host), bool)


def test_https_carries_a_credential_anywhere_and_other_schemes_nowhere() -> None:
    assert may_carry_credential("https://relay.example.net/")
    refused = may_carry_credential("http://relay.example.net/")
    assert not refused
    assert refused.rule == "credential-in-clear"
    assert "relay.example.net" in refused.reason
    assert may_carry_credential("ftp://localhost/").rule == "credential-scheme"
    assert not may_carry_credential("http:///nohost")
