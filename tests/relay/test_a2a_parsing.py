"""Properties of the A2A request readers: what they accept comes back unchanged, what they
refuse is refused with a named reason, and nothing else escapes."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.mellan.relay.surfaces.a2a import jsontext, paths, requests
from melchior.mellan.relay.surfaces.a2a.errors import InvalidParams, InvalidRequest, ParseError
from melchior.mellan.relay.surfaces.a2a.jsonrpc import envelope

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
    st.builds(lambda t: {"raw": t, "filename": "f.bin"}, st.text()),
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


@given(messages, st.sampled_from(["no-kind", "two-kinds", "role", "no-parts", "bad-text", "id"]))
def test_broken_messages_are_refused_naming_the_field(msg: dict[str, Any], how: str) -> None:
    field = {
        "no-kind": "message.parts[0]",
        "two-kinds": "message.parts[0]",
        "role": "message.role",
        "no-parts": "message.parts",
        "bad-text": "message.parts[0].text",
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
