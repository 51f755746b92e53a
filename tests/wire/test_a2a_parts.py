"""The A2A ``Part`` rule (:func:`melchior.a2a_message.part_problem`): an allow-list of
fields, exactly one kind, each field of its type — over generated JSON, it names a reason
for exactly the objects that break one of those, and never raises."""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from melchior.a2a_message import PART_KEYS, PART_KINDS, part_problem

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
_keys = st.sampled_from(sorted(PART_KEYS)) | st.text(max_size=8)


def _b64(value: Any) -> bool:
    try:
        base64.b64decode(value, validate=True)
    except ValueError:
        return False
    return True


def expected_ok(part: Any) -> bool:
    """The rule, said again as plainly as it can be."""
    if not isinstance(part, dict) or not set(part) <= PART_KEYS:
        return False
    kinds = [k for k in PART_KINDS if k in part]
    if len(kinds) != 1:
        return False
    kind = kinds[0]
    return (
        (kind == "data" or isinstance(part[kind], str))
        and (kind != "raw" or _b64(part[kind]))
        and all(isinstance(part[k], str) for k in ("filename", "mediaType") if k in part)
        and isinstance(part.get("metadata", {}), dict)
    )


@given(st.dictionaries(_keys, _json, max_size=5) | _json)
def test_a_reason_exactly_for_what_is_not_a_part(part: Any) -> None:
    problem = part_problem(part)
    assert (problem is None) == expected_ok(part), (part, problem)
    assert problem is None or problem.startswith("a part")


@given(
    kind=st.sampled_from(PART_KINDS),
    text=st.text(),
    data=_json,
    blob=st.binary(),
    name=st.none() | st.text(),
)
def test_every_kind_of_part_passes(kind: str, text: str, data: Any, blob: bytes,
                                   name: str | None) -> None:  # fmt: skip
    value = {"text": text, "url": text, "data": data,
             "raw": base64.b64encode(blob).decode()}[kind]  # fmt: skip
    part: dict[str, Any] = {kind: value, "metadata": {"k": data}}
    if name is not None:
        part |= {"filename": name, "mediaType": "text/plain"}
    assert part_problem(part) is None
