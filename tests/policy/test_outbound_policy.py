"""The wall in front of every request the relay sends on a caller's say (pushes, wake-ups):
an allow-list of addresses, IPv6 transition forms judged as the IPv4 address they carry,
metadata and link-local refused even with private targets on, hosts written only as a
canonical address or an ASCII DNS name — and the same verdict when a URL is given as when
its addresses are checked at delivery. Property tests over generated addresses/hosts."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.policy.outbound import (
    METADATA,
    check_addresses,
    check_host,
    check_url,
    judge_address,
    public,
    unwrap,
)

v4 = st.integers(min_value=0, max_value=2**32 - 1).map(ipaddress.IPv4Address)
v6 = st.integers(min_value=0, max_value=2**128 - 1).map(ipaddress.IPv6Address)


def wrapped(ip: ipaddress.IPv4Address) -> list[str]:
    """Every IPv6 form that carries ``ip`` and is judged as it."""
    n = int(ip)
    return [
        str(ipaddress.IPv6Address((0xFFFF << 32) | n)),  # ::ffff:a.b.c.d (mapped)
        str(ipaddress.IPv6Address((0xFFFF << 48) | n)),  # ::ffff:0:a.b.c.d (translated)
        str(ipaddress.IPv6Address((0x64FF9B << 96) | n)),  # 64:ff9b::/96 (NAT64)
        str(ipaddress.IPv6Address((0x2002 << 112) | (n << 80))),  # 2002::/16 (6to4)
    ] + ([str(ipaddress.IPv6Address(n))] if n > 1 else [])  # ::a.b.c.d (compatible)


@given(v4, st.booleans())
def test_a_transition_form_is_judged_as_the_ipv4_address_it_carries(
    ip: ipaddress.IPv4Address, allow_private: bool
) -> None:
    inner = judge_address(str(ip), allow_private=allow_private).allowed
    for form in wrapped(ip):
        assert judge_address(form, allow_private=allow_private).allowed == inner, form


@given(st.integers(min_value=0, max_value=2**96 - 1), st.integers(0, 2**80 - 1), st.booleans())
def test_teredo_and_local_nat64_are_refused(low: int, low48: int, allow_private: bool) -> None:
    teredo = ipaddress.IPv6Address((0x20010000 << 96) | low)
    local64 = ipaddress.IPv6Address((0x0064FF9B0001 << 80) | low48)
    for ip in (teredo, local64):
        verdict = judge_address(str(ip), allow_private=allow_private)
        assert not verdict.allowed
        assert verdict.rule == "transition-address"


@given(st.one_of(v4, v6))
def test_allowing_private_only_adds_and_public_v6_is_global_unicast(ip: object) -> None:
    text = str(ip)
    if public(text):
        assert judge_address(text, allow_private=True).allowed
        addr = ipaddress.ip_address(text)
        if isinstance(addr, ipaddress.IPv6Address) and unwrap(addr) == addr:
            assert addr in ipaddress.ip_network("2000::/3")
    verdict = judge_address(text, allow_private=True)
    assert verdict.reason  # every verdict says why


@given(st.one_of(v4, v6), st.booleans())
def test_link_local_and_metadata_are_refused_whatever_the_workspace_allows(
    ip: object, allow_private: bool
) -> None:
    addr = ipaddress.ip_address(str(ip))
    if addr.is_link_local or addr in METADATA:
        assert not judge_address(str(addr), allow_private=allow_private).allowed


@pytest.mark.parametrize("address", ["169.254.169.254", "fd00:ec2::254", "fe80::1",
                                     "169.254.170.2", "100.100.100.200"])  # fmt: skip
def test_metadata_with_private_on(address: str) -> None:
    verdict = judge_address(address, allow_private=True)
    assert not verdict.allowed
    assert verdict.rule in {"metadata-address", "link-local"}


@given(v4)
def test_only_the_dotted_quad_spells_an_ipv4_host(ip: ipaddress.IPv4Address) -> None:
    n = int(ip)
    a, b, c, d = ip.packed
    for spelling in (str(n), hex(n), f"0{a:o}.{b}.{c}.{d}", f"{a}.{(b << 16) | (c << 8) | d}"):
        verdict = check_host(spelling, allow_private=True)
        assert not verdict.allowed, spelling
        assert verdict.rule == "bad-host"
    dotted = check_host(str(ip), allow_private=True)
    assert dotted.rule != "bad-host"


@pytest.mark.parametrize("host", ["localhost", "localhost.", "LOCALHOST", "a.localhost",
                                  "ⓛⓞⓒⓐⓛⓗⓞⓢⓣ", "0", "127.1", "[::1]", "[::127.0.0.1]",
                                  "[2002:7f00:1::]", "[64:ff9b::7f00:1]"])  # fmt: skip
def test_this_machine_in_any_spelling_is_refused_at_config_time(host: str) -> None:
    verdict = check_url(f"https://{host}:8443/hook", allow_private=False)
    assert not verdict.allowed, host
    assert verdict.reason


@given(st.text(max_size=60), st.booleans())
def test_any_host_text_gets_a_verdict_with_a_reason(host: str, allow_private: bool) -> None:
    verdict = check_host(host, allow_private=allow_private)
    assert verdict.rule
    assert verdict.reason


@given(st.one_of(v4, v6), st.booleans())
def test_a_literal_url_is_judged_at_config_time_as_at_delivery(
    ip: object, allow_private: bool
) -> None:
    """The same function decides both: a literal host's verdict when the URL is given is
    the verdict on its address when the request would go."""
    addr = str(ip)
    host = f"[{addr}]" if ":" in addr else addr
    given_now = check_url(f"https://{host}/hook", allow_private=allow_private)
    at_delivery = check_addresses(addr, [addr], allow_private=allow_private)
    assert given_now.allowed == at_delivery.allowed, (given_now, at_delivery)


def test_one_bad_address_among_good_ones_refuses_the_name() -> None:
    verdict = check_addresses("h.example", ["93.184.216.34", "10.0.0.1"], allow_private=False)
    assert not verdict.allowed
    assert "10.0.0.1" in verdict.reason
    assert check_addresses("h.example", ["93.184.216.34"], allow_private=False).allowed
    assert not check_addresses("h.example", [], allow_private=True).allowed
