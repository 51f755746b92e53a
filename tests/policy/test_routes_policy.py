"""The pure rules behind task routes and receivers' self-descriptions, on generated input:
whatever is allowed is safe to store, show and put in a session key; whatever is refused
names its field; nothing raises."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.mellan.relay.caches.presence import MAX_ADAPTERS, receiver_info
from melchior.mellan.relay.surfaces.http import ApiError
from melchior.policy.task_routes import (
    ADAPTERS,
    FIELD,
    MAX_CWD,
    MAX_OPTIONS,
    check_route,
    session_key,
)

DECLARED = frozenset({"repo.review", "incident.inspect"})
text = st.text(max_size=300)


@given(
    adapter=st.one_of(st.sampled_from(ADAPTERS), text),
    capability=st.one_of(st.sampled_from(sorted(DECLARED)), text),
    session=st.one_of(st.none(), text),
    cwd=st.one_of(st.none(), text, text.map(lambda t: "/" + t)),
    profile=st.one_of(st.none(), text),
    size=st.integers(0, 2 * MAX_OPTIONS),
)
def test_check_route_allows_only_what_is_safe(
    adapter: str,
    capability: str,
    session: str | None,
    cwd: str | None,
    profile: str | None,
    size: int,
) -> None:
    d = check_route(
        agent="private/ops", capability=capability, adapter=adapter, declared=DECLARED,
        session=session, cwd=cwd, profile=profile, options_bytes=size,
    )  # fmt: skip
    if not d.allowed:
        assert d.rule in FIELD
        assert f"field '{FIELD[d.rule]}'" in d.reason
        return
    assert adapter in ADAPTERS
    assert capability in DECLARED
    assert size <= MAX_OPTIONS
    if session is not None:
        assert adapter != "provider"
        assert 0 < len(session) <= 256
        assert all(ch.isascii() and (ch.isalnum() or ch in "._:@+=-") for ch in session)
        key = session_key("private/ops", session)
        assert key.startswith("route-session:private/ops:")
        assert key.endswith(session)
    if profile is not None:
        assert all(ch.isascii() and (ch.isalnum() or ch in "._-") for ch in profile)
    if cwd is not None:
        assert cwd.startswith("/")
        assert len(cwd) <= MAX_CWD
        assert not any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in cwd)


def test_named_refusals() -> None:
    base: dict[str, Any] = {
        "agent": "a", "capability": "repo.review", "adapter": "codex", "declared": DECLARED,
        "session": None, "cwd": None, "profile": None, "options_bytes": 2,
    }  # fmt: skip
    assert check_route(**base).allowed
    for change, rule in (
        ({"adapter": "bash"}, "unknown-adapter"),
        ({"capability": "other"}, "unknown-capability"),
        ({"adapter": "provider", "session": "s"}, "fresh-run"),
        ({"session": "a b"}, "bad-session"),
        ({"session": "-leading-dash"}, "bad-session"),  # never a flag on a command line
        ({"profile": "../x"}, "bad-profile"),
        ({"cwd": "./here"}, "relative-cwd"),
        ({"cwd": "/a\x00b"}, "relative-cwd"),
        ({"options_bytes": MAX_OPTIONS + 1}, "options-too-large"),
    ):
        assert check_route(**(base | change)).rule == rule, change


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(text, inner, max_size=8),
    max_leaves=40,
)


@given(
    raw=st.one_of(
        json_values,
        st.fixed_dictionaries(
            {},
            optional={
                "name": json_values,
                "version": json_values,
                "adapters": json_values,
                "running": json_values,
                "concurrency": json_values,
            },
        ),
    ),
    wait=st.floats(0, 60),
)
def test_receiver_info_is_bounded_or_refused_by_field(raw: Any, wait: float) -> None:
    refused: ApiError | None = None
    try:
        info = receiver_info(raw, wait)
    except ApiError as exc:
        refused = exc
    if refused is not None:
        assert refused.status == 400
        assert refused.extra["field"].startswith("receiver")
        return
    assert set(info) <= {"name", "version", "adapters", "running", "concurrency", "wait"}
    assert info["wait"] == wait
    assert len(info.get("name", "")) <= 100
    assert len(info.get("version", "")) <= 50
    assert len(info.get("adapters", [])) <= MAX_ADAPTERS
    for key in ("running", "concurrency"):
        if key in info:
            assert isinstance(info[key], int)
            assert 0 <= info[key] <= 100_000


@pytest.mark.parametrize("raw", [{"running": True}, {"adapters": [""]}, {"name": 5}, [1]])
def test_receiver_info_refusals(raw: Any) -> None:
    with pytest.raises(ApiError):
        receiver_info(raw, 1.0)


def test_a_route_may_name_exactly_the_adapters_a_receiver_can_run() -> None:
    from melchior.runtimes import ADAPTERS as RUNTIMES

    assert set(ADAPTERS) == set(RUNTIMES)
