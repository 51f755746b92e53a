"""Strict decoding: anything but a UTF-8 JSON object is a clear, non-fatal refusal."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.wire import WireError, decode, encode


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\xff\xfe{}", "bad-encoding"),
        (b'{"a":"\xc0\x80"}', "bad-encoding"),
        (b"not json", "bad-json"),
        (b"[1,2]", "not-an-object"),
        (b'"text"', "not-an-object"),
        (b'{"a":NaN}', "bad-json"),
        (b"\xef\xbb\xbf{}", "bad-json"),
        (b"{} {}", "bad-json"),
        (b'{"call":"status","call":"verbs"}', "bad-json"),
        (b'{"args":[{"x":1,"x":1}]}', "bad-json"),
    ],
)
def test_refusals_are_named(data: bytes, code: str) -> None:
    with pytest.raises(WireError) as info:
        decode(data)
    assert info.value.code == code
    assert not info.value.fatal


def test_encode_refuses_non_objects_and_nan() -> None:
    with pytest.raises(WireError):
        encode([1])  # type: ignore[arg-type]
    with pytest.raises(WireError, match="cannot be encoded"):
        encode({"x": float("nan")})


def test_encode_refuses_lone_surrogates() -> None:
    with pytest.raises(WireError, match="lone surrogate") as info:
        encode({"t": "\ud800"})
    assert info.value.code == "bad-encoding"


def test_big_integers_survive() -> None:
    assert decode(encode({"n": 12345678901234567890}))["n"] == 12345678901234567890


def test_unicode_is_utf8_not_escaped() -> None:
    assert encode({"t": "ψ\u2028"}) == '{"t":"ψ\u2028"}'.encode()


@given(st.binary(max_size=200))
def test_arbitrary_bytes_give_a_value_or_a_wire_error(data: bytes) -> None:
    try:
        value: object = decode(data)
    except WireError as exc:
        value = exc
    assert isinstance(value, dict) or (isinstance(value, WireError) and value.reason)


def _loads_as_before(data: bytes) -> tuple[str, object]:
    """The decoder before it ran the scanner itself: json.loads with the same options."""
    import json

    from melchior.wire import codec

    try:
        text = data.decode("utf-8")
        if text.startswith("\ufeff"):
            return "err", "bom"
        return "ok", json.loads(
            text,
            parse_constant=codec._reject_constant,
            object_pairs_hook=codec._unique,
        )
    except UnicodeDecodeError:
        return "err", "utf8"
    except codec._DuplicateKey as exc:
        return "err", f"message repeats a key: {exc}"
    except (ValueError, RecursionError) as exc:
        return "err", f"message is not JSON: {exc}"


json_texts = st.one_of(
    st.binary(max_size=40),
    st.builds(
        lambda pre, body, post: (pre + body + post).encode(),
        st.sampled_from(["", " ", "\n\t", "x"]),
        st.sampled_from(['{"a":1}', '{"a":[1,2.5e3,"\\u00e9"]}', '{"a":1,"a":2}', "[]", "{", "1"]),
        st.sampled_from(["", " ", "\r\n", "{}", " x", ",", "NaN"]),
    ),
)


def _decode_now(data: bytes) -> tuple[str, object]:
    try:
        return "ok", decode(data)
    except WireError as exc:
        return exc.code, exc.reason


@given(json_texts)
def test_decode_answers_as_json_loads_did(data: bytes) -> None:
    kind, expected = _loads_as_before(data)
    code, got = _decode_now(data)
    if kind == "ok" and isinstance(expected, dict):
        assert (code, got) == ("ok", expected)
    elif kind == "ok":
        assert code == "not-an-object"
    elif expected in ("bom", "utf8"):
        assert code in ("bad-json", "bad-encoding")
    else:
        assert got == expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.just("\ud800"),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=5), json_values, max_size=4))
def test_encode_writes_what_json_dumps_wrote(obj: dict[str, object]) -> None:
    import json

    try:
        expected: object = json.dumps(
            obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode("utf-8")
    except (ValueError, UnicodeEncodeError) as exc:
        expected = type(exc)
    try:
        got: object = encode(obj)
    except WireError as exc:
        got = UnicodeEncodeError if exc.code == "bad-encoding" else ValueError
    assert got == expected
    if isinstance(got, bytes):
        assert decode(got) == json.loads(got)
