"""Exact JSON (``melchior.mellan.rawjson``) and the relay's small pure helpers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.mellan.rawjson import JSONTextError, Raw, decode, decode_stored, encode
from melchior.mellan.relay.store._common import lost_reason
from melchior.mellan.relay.store.dburl import redact
from melchior.mellan.relay.surfaces.receiver import backoff

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(json_values)
def test_decode_encode_round_trips_exactly(value: Any) -> None:
    text = encode(value)
    assert decode(text) == value
    assert decode(encode(decode(text))) == value


_tricky = st.text(alphabet='"\\\n\tx:é{}[],\u2028', max_size=12)
tricky_values = st.recursive(
    st.none() | st.booleans() | st.integers() | _tricky,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_tricky, inner, max_size=4),
    max_leaves=12,
)


def _raws(value: Any) -> list[Raw]:
    if isinstance(value, Raw):
        return [value]
    if isinstance(value, dict):
        assert not any(isinstance(k, Raw) for k in value)
        return [r for v in value.values() for r in _raws(v)]
    if isinstance(value, list):
        return [r for v in value for r in _raws(v)]
    return []


@given(tricky_values)
def test_stored_text_with_long_strings_spliced_comes_back_byte_identical(value: Any) -> None:
    """:func:`decode_stored` with a tiny threshold (every string of more than 4 characters
    of JSON text kept as its text): quotes, backslash runs, colons and brackets inside
    strings never fool the scan, keys are never kept raw, and the result writes back the
    very text it was read from."""
    text = encode(value)
    stored = decode_stored(text, raw_over=4)
    assert encode(stored) == text
    assert all(len(r.text) > 4 and r.text.startswith('"') for r in _raws(stored))


def test_a_long_key_is_parsed_and_a_long_value_spliced() -> None:
    long = "k" * 100
    stored = decode_stored(encode({long: long, "n": [long]}), raw_over=50)
    assert list(stored) == [long, "n"]
    assert stored[long] == Raw(f'"{long}"')
    assert stored["n"] == [Raw(f'"{long}"')]


def test_numbers_keep_their_digits() -> None:
    text = '{"n":12345678901234567890,"f":0.10000000000000000001,"e":1e400}'
    value = decode(text)
    assert value["n"] == 12345678901234567890
    assert str(value["f"]) == "0.10000000000000000001"
    assert decode(encode(value)) == value
    assert encode({"raw": Raw(text)}) == '{"raw":' + text + "}"


@pytest.mark.parametrize("bad", ["NaN", '{"x": Infinity}', "-Infinity", "{", "[1,]"])
def test_non_json_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        decode(bad)


def test_duplicate_keys_are_refused_not_collapsed() -> None:
    with pytest.raises(JSONTextError, match="duplicate object key 'n'"):
        decode('{"n": 1, "m": {"x": 2}, "n": 3}')
    assert decode('{"a": {"n": 1}, "b": {"n": 2}}') == {"a": {"n": 1}, "b": {"n": 2}}


def test_unicode_is_kept_as_text() -> None:
    assert encode({"é": "ø\u2028"}) == json.dumps({"é": "ø\u2028"}, ensure_ascii=False).replace(
        " ", ""
    )


def test_backoff_doubles_with_jitter_and_is_capped() -> None:
    for attempt, ceiling in ((1, 1.0), (2, 2.0), (5, 16.0), (30, 300.0)):
        for _ in range(50):
            assert ceiling / 2 <= backoff(attempt) <= ceiling


def test_database_urls_lose_their_password_in_status_lines() -> None:
    assert redact("postgresql://u:secret@db:5432/x") == "postgresql://u:***@db:5432/x"
    assert redact("postgresql://db/x") == "postgresql://db/x"
    assert redact("sqlite:///tmp/a.db") == "sqlite:///tmp/a.db"
    assert redact("/tmp/a.db") == "sqlite:///tmp/a.db"  # a bare path: one URL form


def test_lease_lost_reasons() -> None:
    assert lost_reason(None, None, 1)[0] == "finished"
