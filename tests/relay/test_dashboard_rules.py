"""The dashboard's pure parts: session standing, origin and CSRF decisions, where sign-in may
lead, the pictures' directions and escaping, a task's timeline, activity depth."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from melchior.mellan.relay.store.base import (
    Activity,
    Agent,
    AuditRecord,
    Capability,
    Grant,
    Task,
    TaskEvent,
    TaskState,
    TaskTurn,
)
from melchior.mellan.relay.surfaces.dashboard import pictures, timeline
from melchior.mellan.relay.surfaces.dashboard.pages import capability_lines
from melchior.mellan.relay.surfaces.dashboard.sessions import csrf_for, safe_next
from melchior.policy.sessions import csrf_token_matches, same_origin, session_stands

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SVG = "{http://www.w3.org/2000/svg}"


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


offsets = st.integers(min_value=-(10**6), max_value=10**6)


@given(offsets, offsets, st.booleans())
def test_a_session_stands_exactly_while_live_unexpired_and_not_idle(
    idle: int, until: int, live: bool
) -> None:
    d = session_stands(
        now=iso(T0),
        idle_until=iso(T0 + timedelta(milliseconds=idle)),
        until=iso(T0 + timedelta(milliseconds=until)),
        credential_live=live,
    )
    assert d.allowed == (live and idle > 0 and until > 0)
    if not live:
        assert d.rule == "credential-revoked"
    elif until <= 0:
        assert d.rule == "session-expired"
    elif idle <= 0:
        assert d.rule == "session-idle"
    assert d.reason


ours = {"http://127.0.0.1:8787", "https://relay.example"}


@given(
    st.sampled_from(["GET", "HEAD", "OPTIONS", "POST", "PUT", "DELETE", "post"]),
    st.none()
    | st.sampled_from([*sorted(ours), "null", "https://evil.example", "http://127.0.0.1:1"]),
    st.none() | st.sampled_from(["same-origin", "same-site", "cross-site", "none", "SAME-ORIGIN"]),
)
def test_changes_come_only_from_our_origin(
    method: str, origin: str | None, site: str | None
) -> None:
    d = same_origin(method=method, origin=origin, fetch_site=site, ours=ours)
    if method.upper() in ("GET", "HEAD", "OPTIONS"):
        assert d.allowed
        return
    bad_site = site is not None and site.lower() != "same-origin"
    bad_origin = origin is not None and origin not in ours
    assert d.allowed == (not bad_site and not bad_origin)
    if bad_site:
        assert d.rule == "cross-site"
    elif bad_origin:
        assert d.rule == "cross-origin"


@given(st.text(min_size=1, max_size=60), st.none() | st.text(max_size=80))
def test_the_csrf_token_must_match_exactly(session_id: str, given_token: str | None) -> None:
    expected = csrf_for(session_id)
    assert csrf_token_matches(expected, expected).allowed
    d = csrf_token_matches(expected, given_token)
    assert d.allowed == (given_token == expected)
    if not given_token:
        assert d.rule == "csrf-missing"
    elif not d.allowed:
        assert d.rule == "csrf-mismatch"
    assert csrf_for(session_id) != csrf_for(session_id + "x")


@given(st.text(max_size=80))
def test_sign_in_never_leads_off_the_dashboard(target: str) -> None:
    out = safe_next(target, "/ui")
    assert out.startswith("/ui/")
    assert not out.startswith("//")
    assert "\\" not in out
    assert out == target or out == "/ui/"
    for evil in ("//evil.example/ui/", "https://evil.example/", "/ui/\\evil", "/ui/signin",
                 "/api/agents", "/ui/\nx"):  # fmt: skip
        assert safe_next(evil, "/ui") == "/ui/"
    assert safe_next("/ui/tasks?state=queued", "/ui") == "/ui/tasks?state=queued"


def test_capability_lines_read_like_the_cli() -> None:
    assert capability_lines("a.b\n\n  c = Do C \nd=e=f\n") == [
        "a.b",
        {"id": "c", "description": "Do C"},
        {"id": "d", "description": "e=f"},
    ]


def _agent(i: str, *caps: str) -> Agent:
    return Agent("w", i, "", tuple(Capability(c) for c in caps), iso(T0))


def _grant(caller: str, receiver: str, *caps: str, revoked: bool = False) -> Grant:
    return Grant(f"g-{caller}-{receiver}", "w", caller, receiver, caps, iso(T0),
                 iso(T0) if revoked else None)  # fmt: skip


def test_the_network_draws_each_direction_from_caller_to_receiver() -> None:
    agents = [_agent("a/<one>", "x"), _agent("b&two", "y"), _agent("c", "z")]
    grants = [
        _grant("a/<one>", "b&two", "y"),
        _grant("b&two", "a/<one>", "x"),
        _grant("c", "b&two", "y"),
        _grant("c", "b&two", "y2"),
        _grant("b&two", "c", "z", revoked=True),
    ]
    svg = ET.fromstring(str(pictures.network(agents, grants)))  # well-formed: ids escaped
    boxes = {
        g.get("data-agent"): g.find(f"{SVG}rect")
        for g in svg.iter(f"{SVG}g")
        if g.get("class") == "agent"
    }
    assert set(boxes) == {"a/<one>", "b&two", "c"}

    def centre(agent: str) -> tuple[float, float]:
        r = boxes[agent]
        assert r is not None
        return (float(r.get("x", 0)) + float(r.get("width", 0)) / 2,
                float(r.get("y", 0)) + float(r.get("height", 0)) / 2)  # fmt: skip

    edges = [g for g in svg.iter(f"{SVG}g") if g.get("class") == "grant"]
    drawn = {(g.get("data-caller"), g.get("data-receiver")): g for g in edges}
    assert set(drawn) == {("a/<one>", "b&two"), ("b&two", "a/<one>"), ("c", "b&two")}
    for (caller, receiver), g in drawn.items():
        line = g.find(f"{SVG}line")
        assert line is not None
        assert line.get("marker-end") == "url(#arrowhead)"
        start = (float(line.get("x1", 0)), float(line.get("y1", 0)))
        end = (float(line.get("x2", 0)), float(line.get("y2", 0)))
        # the line starts at the caller's box and its arrowhead ends at the receiver's
        dist = lambda p, q: ((p[0] - q[0]) ** 2 + (p[1] - q[1]) ** 2) ** 0.5  # noqa: E731
        assert dist(start, centre(caller)) < dist(start, centre(receiver))
        assert dist(end, centre(receiver)) < dist(end, centre(caller))
    label = drawn[("c", "b&two")].find(f"{SVG}text")
    assert label is not None
    assert label.text == "y, y2"  # one arrow per direction, capabilities merged
    # a pair granted both ways: two separate lines, not one double-headed one
    there = drawn[("a/<one>", "b&two")].find(f"{SVG}line")
    back = drawn[("b&two", "a/<one>")].find(f"{SVG}line")
    assert there is not None
    assert back is not None
    assert (there.get("x1"), there.get("y1")) != (back.get("x2"), back.get("y2"))
    desc = svg.find(f"{SVG}desc")
    assert desc is not None
    assert "c may ask b&two for y, y2" in (desc.text or "")


def test_empty_and_single_networks_still_draw() -> None:
    for agents in ([], [_agent("solo")]):
        svg = ET.fromstring(str(pictures.network(agents, [])))
        assert "no grants" in (svg.find(f"{SVG}desc").text or "")  # type: ignore[union-attr]


def test_activity_depth_walks_back_from_now_and_charts_draw() -> None:
    act = Activity(
        start=iso(T0), end=iso(T0 + timedelta(hours=4)), bucket_seconds=3600,
        accepted=(3, 0, 2, 1), finished={"succeeded": (1, 1, 0, 2), "failed": (0, 0, 1, 0)},
        open_now=2,
    )  # fmt: skip
    # open at each bucket's end: 2 now; before the last bucket 2 - 1 + 2 = 3; then 3 - 2 + 1
    assert act.depth == (3, 2, 3, 2)
    levels = list(act.depth)
    assert levels[-1] == 2
    level = 2
    for k in range(3, 0, -1):
        level = level - act.accepted[k] + sum(col[k] for col in act.finished.values())
        assert levels[k - 1] == max(level, 0)
    for chart in (pictures.throughput(act), pictures.depth(act)):
        svg = ET.fromstring(str(chart))
        assert svg.find(f"{SVG}title") is not None
    bars = ET.fromstring(str(pictures.throughput(act))).findall(f"{SVG}rect")
    assert sorted(b.get("class", "") for b in bars) == sorted(
        ["bar succeeded"] * 3 + ["bar failed"]
    )


def _task(**kw: object) -> Task:
    base: dict[str, object] = dict(
        id="t1", workspace="w", caller="a", receiver="b", capability="x", context_id="c",
        state=TaskState.SUCCEEDED, payload='{"n":1.10}', metadata="{}", message_id=None,
        session_key=None, chain="", hop=1, path=(), attempt=1, max_attempts=3, lease_epoch=1,
        lease_owner=None, lease_expires_at=None, result='{"r": 12345678901234567890}',
        error=None, created_at=iso(T0), updated_at=iso(T0),
    )  # fmt: skip
    base.update(kw)
    return Task(**base)  # type: ignore[arg-type]


def _rec(seq: int, action: str, ms: int, allowed: bool = True, **detail: object) -> AuditRecord:
    at = iso(T0 + timedelta(milliseconds=ms))
    return AuditRecord(seq, "w", at, "agent:b", action, "t1", allowed, "r", action, dict(detail))


def test_the_timeline_orders_every_step_with_payloads_as_stored() -> None:
    records = [
        _rec(1, "task.accept", 0),
        _rec(2, "task.claim", 10, expires_at=iso(T0 + timedelta(seconds=30))),
        _rec(3, "task.progress", 20),
        _rec(4, "task.complete", 30, epoch=1),
    ]
    events = [TaskEvent(9, "t1", iso(T0 + timedelta(milliseconds=20)), "status", '{"s":"x"}')]
    steps = timeline.steps(_task(), records, events)
    assert [s.title for s in steps] == ["accepted", "claimed", "progress: status", "completed"]
    assert steps[0].body == '{"n":1.10}'
    assert steps[2].body == '{"s":"x"}'
    assert steps[3].body == '{"r": 12345678901234567890}'


def test_the_timeline_shows_a_renewed_lease_and_refusals() -> None:
    claimed_until = iso(T0 + timedelta(seconds=30))
    later = iso(T0 + timedelta(seconds=90))
    leased = _task(state=TaskState.LEASED, result=None, lease_expires_at=later, lease_owner="rx")
    records = [_rec(2, "task.claim", 10, expires_at=claimed_until),
               _rec(3, "task.cancel", 40, allowed=False)]  # fmt: skip
    steps = timeline.steps(leased, records, [])
    assert [s.title for s in steps] == ["accepted", "claimed", "cancel refused", "renewed"]
    assert steps[0].body == '{"n":1.10}'  # no accept record: the row's own birth
    assert not steps[2].allowed
    assert "runs until" in steps[3].text
    not_renewed = _task(state=TaskState.LEASED, result=None, lease_expires_at=claimed_until)
    assert "renewed" not in [s.title for s in timeline.steps(not_renewed, records, [])]


def test_each_turn_keeps_its_message_and_result() -> None:
    turn1 = TaskTurn("t1", 1, '{"q":1}', TaskState.INPUT_REQUIRED, '{"ask":"which?"}', None, 1,
                     iso(T0 + timedelta(milliseconds=30)))  # fmt: skip
    live = _task(turn=2, payload='{"a":"db-1"}', result='{"done":true}', lease_epoch=2)
    records = [
        _rec(1, "task.accept", 0),
        _rec(2, "task.claim", 10),
        _rec(3, "task.input_required", 30, epoch=1),
        _rec(5, "task.claim", 50),
        _rec(6, "task.complete", 60, epoch=2),
        _rec(7, "task.complete", 70),  # the same report again, answered "duplicate"
    ]
    records[5] = AuditRecord(7, "w", iso(T0 + timedelta(milliseconds=70)), "agent:b",
                             "task.complete", "t1", True, "lease",
                             "task.complete under epoch 2: duplicate", {"epoch": 2})  # fmt: skip
    steps = timeline.steps(live, records, [], [turn1])
    assert [s.title for s in steps] == [
        "accepted", "claimed", "input asked", "answered", "claimed", "completed",
        "completed (reported again)",
    ]  # fmt: skip
    bodies = {s.title: s.body for s in steps if s.body is not None}
    assert bodies == {
        "accepted": '{"q":1}',
        "input asked": '{"ask":"which?"}',
        "answered": '{"a":"db-1"}',
        "completed": '{"done":true}',
    }
