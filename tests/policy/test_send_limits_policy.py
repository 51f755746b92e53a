"""The send-limit rule (:mod:`melchior.policy.send_limits`), pure: the token bucket never
lets more than ``burst + rate × elapsed`` sends through, says when to come back, and the
caps and overrides decide as documented."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.policy.send_limits import (
    CAP_RETRY_AFTER,
    DEFAULTS,
    QUEUED,
    RATE,
    UNFINISHED,
    Bucket,
    Overrides,
    cap,
    check_value,
    effective,
    take,
)

rates = st.floats(min_value=0.01, max_value=1000, allow_nan=False)
bursts = st.integers(min_value=1, max_value=500)
gaps = st.lists(st.floats(min_value=0, max_value=5, allow_nan=False), min_size=1, max_size=200)


@given(rates, bursts, gaps)
def test_bucket_never_passes_more_than_burst_plus_refill(
    rate: float, burst: int, steps: list[float]
) -> None:
    bucket: Bucket | None = None
    now, allowed = 0.0, 0
    for gap in steps:
        now += gap
        got = take(bucket, now, rate, burst)
        bucket = got.bucket
        if got.decision.allowed:
            allowed += 1
            assert got.retry_after == 0
        else:
            assert got.decision.rule == RATE
            assert got.retry_after >= 1
            # coming back after retry_after seconds finds a token
            assert take(bucket, now + got.retry_after, rate, burst).decision.allowed
        assert 0 <= bucket.tokens <= burst
    assert allowed <= burst + math.floor(rate * now) + 1


def test_bucket_starts_full_and_refills() -> None:
    got = take(None, 100.0, rate=1.0, burst=2)
    assert got.decision.allowed
    got = take(got.bucket, 100.0, 1.0, 2)
    assert got.decision.allowed
    got = take(got.bucket, 100.0, 1.0, 2)
    assert not got.decision.allowed
    assert got.retry_after == 1
    assert "1 a second" in got.decision.reason
    assert take(got.bucket, 101.0, 1.0, 2).decision.allowed


def test_clock_going_back_refills_nothing() -> None:
    empty = Bucket(0.0, 50.0)
    assert not take(empty, 10.0, 1.0, 5).decision.allowed


@given(st.integers(0, 100), st.integers(1, 100))
def test_caps(count: int, allowed: int) -> None:
    for limit in (UNFINISHED, QUEUED):
        decision, retry = cap(limit, count, allowed, "private/ops")
        assert decision.allowed == (count < allowed)
        assert decision.rule == limit
        assert retry == (0 if decision.allowed else CAP_RETRY_AFTER)
        if not decision.allowed:
            assert "private/ops" in decision.reason
            assert "Nothing was stored" in decision.reason


def test_cap_names_only_caps() -> None:
    with pytest.raises(ValueError, match="not a cap"):
        cap(RATE, 5, 1, "x")


def test_overrides_agent_then_workspace_then_relay() -> None:
    ws = Overrides(send_rate=5.0, max_queued=7)
    agent = Overrides(send_rate=1.0, burst=3)
    got = effective(ws, agent)
    assert got == (1.0, 3, DEFAULTS.max_unfinished_per_receiver, 7)
    assert effective(Overrides(), Overrides()) == DEFAULTS


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("send_rate", 0, "above 0"),
        ("send_rate", float("inf"), "finite"),
        ("burst", 0, "between 1"),
        ("burst", 1.5, "whole number"),
        ("max_queued", True, "a number"),
        ("speed", 1, "unknown limit"),
    ],
)
def test_check_value_refuses_by_name(name: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_value(name, value)
