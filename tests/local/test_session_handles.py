"""Question handles and chains as parsed from untrusted input: refuse or round-trip."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior import names
from melchior.session.serve import new_message_id, split_about
from melchior.wire.calls import Refused

ids = st.lists(st.sampled_from(names.GREEK), min_size=2, max_size=3).map("-".join)


@given(ids)
def test_handles_round_trip(callee: str) -> None:
    mid = new_message_id()
    assert split_about(f"{callee}@{mid}") == (callee, mid)


@given(st.one_of(st.text(max_size=40), st.integers(), st.none(), st.lists(st.text())))
def test_anything_else_is_refused_with_a_reason_or_is_a_handle(value: object) -> None:
    try:
        callee, mid = split_about(value)
    except Refused as exc:
        refused: Refused | None = exc
    else:
        refused = None
    if refused is not None:
        assert refused.code == "bad-args"
        assert "handle" in refused.reason
        return
    assert isinstance(value, str)
    assert names.is_id(callee)
    assert mid
    assert value == f"{callee}@{mid}"


@pytest.mark.parametrize("bad", ["alpha-beta", "@m1", "alpha-beta@", "a@b@c", "x-y@m1"])
def test_malformed_handles(bad: str) -> None:
    with pytest.raises(Refused):
        split_about(bad)
