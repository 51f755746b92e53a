"""Properties of the A2A request readers: what they accept comes back unchanged, what they
refuse is refused with a named reason, and nothing else escapes."""

from __future__ import annotations

import base64
import json
import re
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from melchior.a2a_message import PART_KEYS as A2A_PART_KEYS
from melchior.mellan.relay.surfaces.a2a import jsontext, paths, requests
from melchior.mellan.relay.surfaces.a2a.errors import InvalidParams, InvalidRequest, ParseError
from melchior.mellan.relay.surfaces.a2a.jsonrpc import envelope
from melchior.runtimes.command import stdout_parts

big_ints = st.integers(min_value=-(10**40), max_value=10**40)
decimals = st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(
    lambda d: d.is_finite()
)
scalars = st.none() | st.booleans() | big_ints | decimals | st.text()
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def exact(text: str) -> Any:
    return json.loads(text, parse_float=Decimal)


@given(json_values)
def test_json_round_trip_keeps_every_value(value: Any) -> None:
    text = jsontext.dumps(value)
    assert exact(jsontext.dumps(jsontext.loads(text))) == exact(text)
    assert jsontext.dumps(jsontext.loads(text)) == text


@given(st.lists(decimals | big_ints, min_size=1, max_size=5))
def test_number_literals_survive_as_written(numbers: list[Any]) -> None:
    literals = [str(n) for n in numbers]
    text = "[" + ",".join(literals) + "]"
    assert jsontext.dumps(jsontext.loads(text)) == text


@pytest.mark.parametrize(
    "text",
    ['{"a":NaN}', "[Infinity]", '{"a":1,"a":2}', "\ufeff{}", "{", '{"a":-Infinity}'],
)
def test_unfaithful_json_is_refused(text: str) -> None:
    with pytest.raises(ParseError):
        jsontext.loads(text)


def test_invalid_utf8_is_refused() -> None:
    with pytest.raises(ParseError, match="UTF-8"):
        jsontext.loads(b'{"a":"\xff"}')


parts = st.one_of(
    st.builds(lambda t: {"text": t}, st.text()),
    st.builds(lambda b: {"raw": base64.b64encode(b).decode(), "filename": "f.bin"}, st.binary()),
    st.builds(lambda t: {"url": t, "mediaType": "text/html"}, st.text()),
    st.builds(lambda d: {"data": d, "metadata": {"m": d}}, json_values),
)
messages = st.builds(
    lambda mid, ps, md: {"messageId": mid, "role": "ROLE_USER", "parts": ps, "metadata": md},
    st.text(min_size=1),
    st.lists(parts, min_size=1, max_size=4),
    st.dictionaries(st.text(), json_values, max_size=3),
)


@given(messages)
def test_valid_messages_pass_unchanged(msg: dict[str, Any]) -> None:
    before = jsontext.dumps(msg)
    req = requests.parse_send({"message": jsontext.loads(before)})
    assert jsontext.dumps(req.message) == before
    assert req.return_immediately is False


_HOWS = ["no-kind", "two-kinds", "role", "no-parts", "bad-text", "bad-raw", "id"]


@given(messages, st.sampled_from(_HOWS))
def test_broken_messages_are_refused_naming_the_field(msg: dict[str, Any], how: str) -> None:
    field = {
        "no-kind": "message.parts[0]",
        "two-kinds": "message.parts[0]",
        "role": "message.role",
        "no-parts": "message.parts",
        "bad-text": "message.parts[0].text",
        "bad-raw": "message.parts[0].raw",
        "id": "message.messageId",
    }[how]
    if how == "no-kind":
        msg["parts"][0] = {"mediaType": "text/plain"}
    elif how == "two-kinds":
        msg["parts"][0] = {"text": "a", "url": "b"}
    elif how == "role":
        msg["role"] = "user"
    elif how == "no-parts":
        msg["parts"] = []
    elif how == "bad-text":
        msg["parts"][0] = {"text": 5}
    elif how == "bad-raw":
        msg["parts"][0] = {"raw": "not base64!", "filename": "f.bin"}
    else:
        msg["messageId"] = ""
    with pytest.raises(InvalidParams) as err:
        requests.parse_send({"message": msg})
    assert err.value.violations[0][0] == field


@given(
    st.dictionaries(
        st.sampled_from(["jsonrpc", "id", "method", "params", "extra"]),
        st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.just({}) | st.just([]),
    )
)
def test_envelope_is_valid_or_an_invalid_request(body: dict[str, Any]) -> None:
    try:
        rid, method, params = envelope(body)
    except InvalidRequest:
        return
    assert body["jsonrpc"] == "2.0"
    assert isinstance(method, str)
    assert method
    assert rid == body["id"]
    assert isinstance(params, dict)


segment = st.text(
    alphabet=st.characters(categories=["L", "N"], include_characters="-_."), min_size=1
).filter(lambda s: s not in paths.OPERATION_HEADS)
operations = st.sampled_from(
    [(), ("message:send",), ("tasks",), ("tasks", "abc:cancel"), (".well-known", "agent-card.json")]
)


@given(segment, st.lists(segment, min_size=1, max_size=4), operations)
def test_paths_recover_workspace_agent_and_operation(
    ws: str, agent: list[str], op: tuple[str, ...]
) -> None:
    target = paths.parse("/".join([ws, *agent, *op]))
    assert target is not None
    assert (target.workspace, target.agent, target.rest) == (ws, "/".join(agent), op)
    assert paths.is_addressable(target.agent)


@given(st.integers(min_value=0, max_value=2**31 - 1))
def test_int_fields_accept_numbers_and_decimal_strings(n: int) -> None:
    assert requests.opt_int(n, "f") == n
    assert requests.opt_int(str(n), "f") == n
    assert requests.opt_int(Decimal(n), "f") == n


@pytest.mark.parametrize(
    "bad", [-1, "x", 1.5, True, [], "1.0", 2**31, "²", "1" * 5000, Decimal("1e1000000")]
)
def test_int_fields_refuse_the_rest(bad: Any) -> None:
    with pytest.raises(InvalidParams):
        requests.opt_int(bad, "f")


def test_list_request_defaults_and_limits() -> None:
    req = requests.parse_list({})
    assert (req.page_size, req.page_token, req.include_artifacts) == (50, None, False)
    assert requests.parse_list({"pageSize": "100", "includeArtifacts": "true"}).page_size == 100
    with pytest.raises(InvalidParams):
        requests.parse_list({"pageSize": 101})
    with pytest.raises(InvalidParams):
        requests.parse_list({"status": "completed"})
    with pytest.raises(InvalidParams):
        requests.parse_list({"statusTimestampAfter": "yesterday"})
    with pytest.raises(InvalidParams):  # valid text, but out of range once in UTC
        requests.parse_list({"statusTimestampAfter": "0001-01-01T00:00:00+01:00"})
    after = requests.parse_list({"statusTimestampAfter": "2026-01-01T05:00:00+05:00"})
    assert after.status_timestamp_after == "2026-01-01T00:00:00+00:00"


# -- one Part rule, two readers: the door and a program's stdout = "parts" --------------------

_B64_FORMS = [
    re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"),
    re.compile(r"(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2}==|[A-Za-z0-9_-]{3}=)?"),
    re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2,3})?"),
    re.compile(r"(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2,3})?"),
]
"""Bytes in ProtoJSON: "standard or URL-safe base64 encoding with/without paddings"."""


def emitted_form(part: Any) -> Any:
    """``part`` with the door's documented leniencies undone (docs/a2a.md, "Parts"): the
    proto name ``media_type`` renamed, a ``null`` other than data's dropped, fields A2A
    does not define dropped, and a ``raw`` in one of the four forms re-encoded as standard
    padded base64 — what the same part is in the form melchior emits."""
    if not isinstance(part, dict):
        return part
    p = {("mediaType" if k == "media_type" else k): v for k, v in part.items()}
    p = {k: v for k, v in p.items() if k in A2A_PART_KEYS and (v is not None or k == "data")}
    raw = p.get("raw")
    if isinstance(raw, str) and any(f.fullmatch(raw) for f in _B64_FORMS):
        unified = raw.replace("-", "+").replace("_", "/")
        p["raw"] = base64.b64encode(base64.b64decode(unified + "=" * (-len(raw) % 4))).decode()
    return p


def _door(part: Any) -> tuple[bool, str | None, Any]:
    """The relay's door on a message carrying ``part`` as its JSON text: accepted, the
    field it names (within the part) when not, and the part's JSON as stored."""
    body = jsontext.dumps({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [part]}})
    try:
        req = requests.parse_send(jsontext.loads(body))
    except InvalidParams as exc:
        path = exc.violations[0][0]
        assert path.startswith("message.parts[0]"), path
        return False, path.removeprefix("message.parts[0]").removeprefix(".") or None, None
    return True, None, jsontext.dumps(req.message["parts"][0])


def _program(part: Any) -> tuple[bool, str | None]:
    """The command runtime on a program that printed ``[part]``: accepted, and the field
    its reason names."""
    parts, why = stdout_parts(jsontext.dumps([part]))
    if parts is not None:
        return True, None
    reason = why.removeprefix("part 0 of its stdout: ")
    head, sep, _ = reason.partition(": ")
    return False, head if sep and head in A2A_PART_KEYS else None


_b64ish = st.text(alphabet="AQgw+/-_= !", max_size=10) | st.builds(
    lambda b, url, pad: (
        (base64.urlsafe_b64encode if url else base64.b64encode)(b)
        .decode()
        .rstrip("" if pad else "=")
    ),
    st.binary(max_size=12),
    st.booleans(),
    st.booleans(),
)
_part_values = st.none() | st.integers() | st.text(max_size=5) | _b64ish | json_values
_part_keys = st.sampled_from([*sorted(A2A_PART_KEYS), "media_type", "kind", "mimeType"])
_others = st.dictionaries(
    _part_keys.filter(lambda k: k not in ("text", "url", "data")), _part_values, max_size=3
)
_one_kind = st.builds(
    lambda k, v, rest: {k: v, **rest},
    st.sampled_from(["text", "url", "data", "raw"]),
    _part_values,
    _others,
)
generated_parts = _one_kind | st.dictionaries(_part_keys, _part_values, max_size=4) | json_values


@given(generated_parts)
def test_the_door_and_the_command_runtime_agree_modulo_the_documented_differences(
    part: Any,
) -> None:
    assume(not (isinstance(part, dict) and {"media_type", "mediaType"} <= set(part)))
    door_ok, door_field, stored = _door(part)
    program_ok, program_field = _program(emitted_form(part))
    assert (door_ok, door_field) == (program_ok, program_field), (part, emitted_form(part))
    if door_ok:  # kept as sent: values untouched, the proto name renamed
        renamed = {("mediaType" if k == "media_type" else k): v for k, v in part.items()}
        assert stored == jsontext.dumps(renamed)
    if _program(part)[0]:  # what melchior emits, the door reads unchanged
        assert _door(part) == (True, None, jsontext.dumps(part))


def test_both_spellings_of_media_type_are_refused_at_the_door_naming_it() -> None:
    assert _door({"text": "a", "media_type": "a", "mediaType": "b"})[:2] == (False, "mediaType")
