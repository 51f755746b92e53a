"""The A2A ``Part`` rule (:func:`melchior.a2a_message.read_part`), read both ways: as a
ProtoJSON parser must (``wire=True``, the relay's door) and as melchior emits
(``wire=False``, a program's ``stdout = "parts"``).

It is checked against the spec said again as plainly as it can be (:func:`faults`, with
base64 as regular expressions rather than a decoder): over generated JSON it refuses
exactly what has a fault and names one of the faulty fields; valid parts of every kind,
in every base64 form the spec allows, pass unchanged; and each single corruption of a
valid part is refused naming the field corrupted."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.a2a_message import PART_KEYS, PART_KINDS, PartError, read_part

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)

# protobuf.dev, "ProtoJSON Format", bytes: "JSON value will be the data encoded as a string
# using standard base64 encoding with paddings. Either standard or URL-safe base64 encoding
# with/without paddings are accepted."
_STD_PADDED = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
_FORMS = (
    _STD_PADDED,
    re.compile(r"(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2}==|[A-Za-z0-9_-]{3}=)?"),
    re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2,3})?"),
    re.compile(r"(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2,3})?"),
)
_b64_chars = st.text(alphabet="AQgw+/-_=Zz09 !", max_size=12)


def faults(part: Any, *, wire: bool) -> set[str | None]:
    """Every field of ``part`` that breaks the spec (None: the part as a whole); empty for
    a part. Written apart from the rule, from the ProtoJSON page and A2A's ``Part``."""
    if not isinstance(part, dict):
        return {None}
    p = dict(part)
    out: set[str | None] = set()
    if wire:
        if "media_type" in p:  # "Parsers accept both the lowerCamelCase name … and the proto name"
            if "mediaType" in p:
                return {"mediaType"}
            p["mediaType"] = p.pop("media_type")
        # "null is an accepted value for all field types and treated as the default value"
        # — data is a google.protobuf.Value, whose default is not absence: null is a value
        p = {k: v for k, v in p.items() if v is not None or k == "data"}
    else:
        out |= {k for k in p if k not in PART_KEYS}
    kinds = [k for k in PART_KINDS if k in p]
    if len(kinds) != 1:
        return out | {None}
    kind = kinds[0]
    if kind != "data":
        value = p[kind]
        forms = _FORMS if wire else (_STD_PADDED,)
        if not isinstance(value, str):
            out.add(kind)
        elif kind == "raw" and not any(f.fullmatch(value) for f in forms):
            out.add("raw")
    out |= {k for k in ("filename", "mediaType") if k in p and not isinstance(p[k], str)}
    if "metadata" in p and not isinstance(p["metadata"], dict):
        out.add("metadata")
    return out


def named(part: Any, *, wire: bool) -> tuple[bool, str | None]:
    """Whether the rule accepts ``part``, and the field it names when it does not."""
    try:
        got = read_part(part, wire=wire)
    except PartError as exc:
        return False, exc.field
    assert isinstance(got, dict)
    return True, None


_keys = st.sampled_from([*sorted(PART_KEYS), "media_type"]) | st.text(max_size=8)
_values = _json | _b64_chars


@pytest.mark.parametrize("wire", [True, False], ids=["wire", "canonical"])
@given(part=st.dictionaries(_keys, _values, max_size=5) | _json)
def test_a_reason_exactly_for_what_is_not_a_part(wire: bool, part: Any) -> None:
    expected = faults(part, wire=wire)
    ok, field = named(part, wire=wire)
    assert ok == (not expected), (part, field, expected)
    assert ok or field in expected, (part, field, expected)


def _raw(blob: bytes, form: int) -> str:
    encoded = (base64.b64encode if form in (0, 2) else base64.urlsafe_b64encode)(blob).decode()
    return encoded if form < 2 else encoded.rstrip("=")


def _valid(kind: str, text: str, data: Any, blob: bytes, form: int) -> dict[str, Any]:
    return {kind: {"text": text, "url": text, "data": data, "raw": _raw(blob, form)}[kind]}


_valid_parts = st.builds(
    _valid,
    kind=st.sampled_from(PART_KINDS),
    text=st.text(),
    data=_json,
    blob=st.binary(max_size=40),
    form=st.just(0),
)


@given(
    kind=st.sampled_from(PART_KINDS),
    text=st.text(),
    data=_json,
    blob=st.binary(max_size=40),
    form=st.sampled_from(range(4)),
    name=st.none() | st.text(),
)
def test_every_kind_of_part_in_every_allowed_form_passes_unchanged(
    kind: str, text: str, data: Any, blob: bytes, form: int, name: str | None
) -> None:
    part = _valid(kind, text, data, blob, form) | {"metadata": {"k": data}}
    if name is not None:
        part |= {"filename": name, "mediaType": "text/plain"}
    assert read_part(part, wire=True) == part
    # melchior emits standard padded base64 only (the other forms can coincide with it)
    canonical = kind != "raw" or _STD_PADDED.fullmatch(part["raw"]) is not None
    assert form != 0 or canonical
    assert named(part, wire=False) == ((True, None) if canonical else (False, "raw"))
    if canonical:
        assert read_part(part, wire=False) == part


def test_the_spec_table_example_and_url_safe_forms_decode_alike() -> None:
    # the page's example bytes value, then the same bytes URL-safe and unpadded
    std = "YWJjMTIzIT8kKiYoKSctPUB+"
    assert read_part({"raw": std}, wire=False) == {"raw": std}
    for form in ("YWJjMTIzIT8kKiYoKSctPUB-", "QQ", "QUE", "-_-_", "+/+/"):
        assert read_part({"raw": form}, wire=True) == {"raw": form}


@pytest.mark.parametrize(
    "raw",
    ["not base64!", "Q", "QQ=", "QQ==QQ==", "a+b_", "QQ ==", "QQ==\n", "Zm9v\nYmFy", "é==="],
)
def test_raw_that_is_not_one_of_the_four_forms_is_refused_both_ways(raw: str) -> None:
    for wire in (True, False):
        with pytest.raises(PartError) as err:
            read_part({"raw": raw, "filename": "f.bin"}, wire=wire)
        assert err.value.field == "raw"
        assert "base64" in err.value.why


def _corrupt(part: dict[str, Any], how: str, other: Any) -> tuple[Any, str | None]:
    """``part`` with one thing wrong, and the field the rule must name for it."""
    (kind,) = (k for k in PART_KINDS if k in part)
    if how == "not-an-object":
        return [part], None
    if how == "no-kind":
        return {"filename": "f"}, None
    if how == "two-kinds":
        second = next(k for k in ("text", "url") if k != kind)
        return {**part, second: "x"}, None
    if how == "kind-type":
        target = kind if kind != "data" else "text"
        return {target: other}, target
    if how == "raw-not-base64":
        return {"raw": "*" + base64.b64encode(b"x" * len(str(other))).decode()}, "raw"
    if how == "filename":
        return {**part, "filename": other}, "filename"
    if how == "mediaType":
        return {**part, "mediaType": other}, "mediaType"
    assert how == "metadata"
    return {**part, "metadata": other if other != {} else []}, "metadata"


_not_str = st.integers() | st.booleans() | st.lists(st.text(), max_size=2) | st.just({})
_HOWS = ["not-an-object", "no-kind", "two-kinds", "kind-type", "raw-not-base64",
         "filename", "mediaType", "metadata"]  # fmt: skip


@pytest.mark.parametrize("wire", [True, False], ids=["wire", "canonical"])
@given(part=_valid_parts, how=st.sampled_from(_HOWS), other=_not_str)
def test_each_single_corruption_is_refused_naming_its_field(
    wire: bool, part: dict[str, Any], how: str, other: Any
) -> None:
    bad, field = _corrupt(part, how, other)
    assert named(bad, wire=wire) == (False, field), bad
    assert faults(bad, wire=wire) == {field}


@given(part=_valid_parts, extra=st.text(min_size=1).filter(lambda k: k not in PART_KEYS))
def test_the_differences_are_the_documented_ones(part: dict[str, Any], extra: str) -> None:
    """Each of the four is accepted on the wire and refused in what melchior emits."""
    (kind,) = part
    cases: list[tuple[dict[str, Any], str | None]] = [
        ({**part, extra: 1}, extra),  # a field A2A does not define
        ({**part, "filename": None}, "filename"),  # null for absent
        ({**part, "metadata": None}, "metadata"),
        ({**part, "media_type": "text/plain"}, "media_type"),  # the proto name
    ]
    if kind != "text":
        cases.append(({**part, "text": None}, None))  # a null kind beside the real one
    for case, field in cases:
        assert read_part(case, wire=True) == (
            {**part, "mediaType": "text/plain"} if "media_type" in case else case
        )
        assert named(case, wire=False) == (False, field), case
    first, then = {**part, "media_type": "a", "mediaType": "b"}, {"mediaType": "b", **part}
    for both in (first, then | {"media_type": "a"}):  # either order
        with pytest.raises(PartError) as err:
            read_part(both, wire=True)
        assert err.value.field == "mediaType"
        assert err.value.why == "given twice, as 'mediaType' and as 'media_type'"


def test_data_null_is_a_value_and_a_null_kind_is_absent() -> None:
    assert read_part({"data": None}, wire=True) == {"data": None}
    assert read_part({"data": None}, wire=False) == {"data": None}
    assert read_part({"text": None, "data": None}, wire=True) == {"text": None, "data": None}
    with pytest.raises(PartError, match="exactly one of"):
        read_part({"text": None, "raw": None}, wire=True)
    with pytest.raises(PartError) as err:
        read_part({"text": None}, wire=False)
    assert (err.value.field, err.value.why) == ("text", "must be a string, got null")
