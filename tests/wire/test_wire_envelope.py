"""The two shapes and the family rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.wire import (
    FAMILY,
    Refused,
    WireError,
    call,
    check_family,
    decode,
    encode,
    event,
    ok,
    refused,
    shape,
    unwrap,
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def test_call_matches_seed() -> None:
    assert call("status") == {"call": "status", "args": []}
    assert encode(call("status")) == b'{"call":"status","args":[]}'


def test_reply_matches_seed() -> None:
    assert ok([{"busy": False}]) == {"ok": True, "family": 1, "n": 1, "result": [{"busy": False}]}


def test_refusal_is_a_reply_with_reason() -> None:
    msg = refused("no such verb 'fly'", code="unknown-verb", id=7)
    assert shape(msg) == "reply"
    assert msg["n"] == 0
    assert msg["result"] == []
    assert msg["ok"] is False
    with pytest.raises(Refused) as info:
        unwrap(msg)
    assert info.value.reason == "no such verb 'fly'"
    assert info.value.code == "unknown-verb"


@given(st.lists(json_values, max_size=6))
def test_result_is_a_list_and_n_its_length(items: list[object]) -> None:
    reply = decode(encode(ok(items)))
    assert reply["n"] == len(reply["result"]) == len(items)
    assert unwrap(reply) == items


def test_n_must_match() -> None:
    with pytest.raises(WireError, match="'n' must equal"):
        shape({"ok": True, "family": 1, "n": 2, "result": [1]})
    with pytest.raises(WireError, match="must be a list"):
        shape({"ok": True, "family": 1, "n": 1, "result": 1})


def test_event_shape() -> None:
    assert shape(event("listening", at="/x")) == "event"
    assert next(iter(event("doing", busy=True))) == "event"


@pytest.mark.parametrize(
    "msg",
    [
        {},
        {"type": "message"},
        {"call": "a", "event": "b"},
        {"call": ""},
        {"event": 3},
        {"call": "x", "args": {}},
        {"ok": "yes", "result": [], "n": 0},
    ],
)
def test_bad_shapes_are_named(msg: dict[str, object]) -> None:
    with pytest.raises(WireError) as info:
        shape(msg)
    assert info.value.code == "bad-shape"
    assert info.value.reason


def test_newer_family_refused_older_tolerated() -> None:
    assert check_family({"family": FAMILY}) == FAMILY
    assert check_family({}) == FAMILY
    with pytest.raises(WireError, match="newer than this reader knows"):
        check_family({"family": FAMILY + 1})
    assert check_family({"family": 1}, known=3) == 1
    with pytest.raises(WireError, match="positive integer"):
        check_family({"family": "1"})
    with pytest.raises(WireError):
        check_family({"family": True})


def test_unwrap_refuses_newer_family_reply() -> None:
    with pytest.raises(WireError, match="newer"):
        unwrap({"ok": True, "family": FAMILY + 1, "n": 0, "result": []})
