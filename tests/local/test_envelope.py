"""The message envelope: receipts, the one Decision→refusal helper, fencing in one place."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.envelope import (
    DELIVERED,
    RECEIPT_KINDS,
    REFUSED,
    Message,
    check,
    receipt,
    refusal,
    refused_receipt,
)
from melchior.policy import allow, refuse
from melchior.policy.fence import unfence
from melchior.policy.hops import Chain, first_hop
from melchior.wire.calls import Refused


def test_refusal_carries_rule_reason_and_receipt() -> None:
    decision = refuse("instance-wall", "beta-nu is a subagent of another instance")
    exc = refusal(decision)
    assert isinstance(exc, Refused)
    assert exc.reason == decision.reason
    assert exc.code == "refused"
    assert exc.detail == {"rule": "instance-wall", "receipt": REFUSED}


def test_refusal_of_an_allowing_decision_is_a_bug() -> None:
    with pytest.raises(ValueError, match="allowed"):
        refusal(allow("family", "a child"))
    with pytest.raises(ValueError, match="allowed"):
        refused_receipt(allow("family", "a child"))


def test_check_passes_allowed_and_raises_refused() -> None:
    ok = allow("family", "b is a's child")
    assert check(ok) is ok
    with pytest.raises(Refused) as info:
        check(refuse("hop-limit", "too far"), code="hops")
    assert info.value.code == "hops"
    assert info.value.detail["rule"] == "hop-limit"


def test_receipt_kinds_are_checked() -> None:
    assert receipt(DELIVERED, "m1").as_dict() == {"receipt": "delivered", "message_id": "m1"}
    with pytest.raises(ValueError, match="not a receipt kind"):
        receipt("landed")
    with pytest.raises(ValueError, match="refusals come from"):
        receipt(REFUSED)  # a refusal needs its decision
    r = refused_receipt(refuse("no-door", "planner has no door to ledger"), "m2")
    assert r.refused
    assert r.as_dict() == {
        "receipt": "refused",
        "message_id": "m2",
        "rule": "no-door",
        "reason": "planner has no door to ledger",
    }
    assert set(RECEIPT_KINDS) == {"refused", "held", "queued", "delivered", "answered"}


@given(body=st.text(), sender=st.text(min_size=1, max_size=40))
def test_fenced_body_round_trips_and_names_the_sender(body: str, sender: str) -> None:
    msg = Message(sender=sender, recipient="ledger", text=body, chain=first_hop(sender))
    fenced = msg.fenced()
    who, sort, back = unfence(fenced.text)
    assert back == body
    assert sort == "attention"
    assert who  # the sender's name, made safe for the marker line


@pytest.mark.parametrize("hop", [2, 2.0, Decimal("2.0"), Decimal("2")])
def test_a_chain_hop_is_a_whole_number_however_spelled(hop: object) -> None:
    chain = Chain.from_dict({"chain": "c", "hop": hop, "path": ["a"]})
    assert chain.hop == 2
    assert isinstance(chain.hop, int)


@pytest.mark.parametrize("hop", [0, 1.5, True, None, "2", Decimal("1e1000000"), "²", [1]])
def test_a_chain_hop_that_is_not_a_count_is_refused(hop: object) -> None:
    with pytest.raises(ValueError, match="'hop'"):
        Chain.from_dict({"chain": "c", "hop": hop, "path": []})
