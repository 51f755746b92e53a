"""Every wall probed through the tool and, bypassing it, straight at the socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from melchior.session.client import call_once
from melchior.wire.calls import Refused
from session_harness import Harness, Session


@pytest.fixture
def harness(runtime_dir: Path, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(runtime_dir, tmp_path / "config")
    yield h
    h.close()


def two_instances(h: Harness) -> tuple[Session, Session, Session, Session]:
    """Instance A (main a, sub a1) and instance B (main b, sub b1), two separate roots."""
    a = h.start()
    b = h.start()
    return a, a.spawn(), b, b.spawn()


def test_subagents_behind_another_front_door_are_walled(harness: Harness) -> None:
    a, a1, b, b1 = two_instances(harness)
    refused = a1.tool("--verb=tell", f"--who={b1.id}", "--message=psst")
    assert refused.rc == 1
    assert refused.error["rule"] == "instance-wall"
    assert refused.error["receipt"] == "refused"
    assert b.id in refused.error["reason"]
    # The front door is open; so is one's own instance.
    assert (
        a1.tool("--verb=tell", f"--who={b.id}", "--message=hello b").one["receipt"] == "delivered"
    )
    assert b.next_event("message")["who"] == f"demo/sub/{a1.id}"
    assert a1.tool("--verb=status", f"--who={a.id}").rc == 0
    # who lists only what can be reached.
    seen = {s["id"] for s in a1.tool("--verb=who").result}
    assert seen == {a.id, b.id}


def test_the_recipient_enforces_the_wall_too(harness: Harness) -> None:
    _a, a1, _b, b1 = two_instances(harness)
    with pytest.raises(Refused) as exc:
        call_once(b1.at, "tell", ["forged past the tool"], sender=a1.id, who=b1.id)
    assert exc.value.detail["rule"] == "instance-wall"
    # A 'from' that names no live session is refused, not trusted.
    with pytest.raises(Refused) as exc:
        call_once(b1.at, "status", [], sender="omega-xi", who=b1.id)
    assert exc.value.code == "unknown-sender"


def test_talk_run_opens_the_run_but_not_other_runs(harness: Harness) -> None:
    harness.set_talk("run")
    root = harness.start()
    m1, m2 = root.spawn("main"), root.spawn("main")
    s1, s2 = m1.spawn(), m2.spawn()
    other = harness.start().spawn()
    assert s1.tool("--verb=tell", f"--who={s2.id}", "--message=hi cousin").rc == 0
    r = s1.tool("--verb=tell", f"--who={other.id}", "--message=hi stranger")
    assert r.rc == 1
    assert r.error["rule"] == "instance-wall"
    assert "'project'" in r.error["reason"]


def test_talk_instance_keeps_cousins_apart(harness: Harness) -> None:
    root = harness.start()
    m1, m2 = root.spawn("main"), root.spawn("main")
    s1, s2 = m1.spawn(), m2.spawn()
    r = s1.tool("--verb=tell", f"--who={s2.id}", "--message=hi cousin")
    assert r.rc == 1
    assert r.error["rule"] == "instance-wall"


def test_talk_project_opens_the_project(harness: Harness) -> None:
    harness.set_talk("project")
    _a, a1, _b, b1 = two_instances(harness)
    assert a1.tool("--verb=tell", f"--who={b1.id}", "--message=hi").rc == 0


def test_a_bad_talk_setting_fails_closed(harness: Harness) -> None:
    root = harness.start()
    harness.set_talk("everyone")
    r = root.tool("--verb=who")
    assert r.rc == 1
    assert "nothing widens past the project" in r.error["reason"]


def test_the_project_wall_never_lists_another_project(
    harness: Harness, runtime_dir: Path, tmp_path: Path
) -> None:
    here = harness.start()
    elsewhere = Harness(runtime_dir, tmp_path / "config", project="other")
    try:
        there = elsewhere.start()
        assert there.id not in {s["id"] for s in here.tool("--verb=who").result}
        assert there.id not in {s["id"] for s in harness.tool("--verb=who").result}
        r = here.tool("--verb=tell", f"--who={there.id}", "--message=hi")
        assert r.rc == 1
        assert r.error["code"] == "unknown"
        # Even at the socket: a caller from another project is nobody here.
        with pytest.raises(Refused) as exc:
            call_once(here.at, "tell", ["hi"], sender=there.id, who=here.id)
        assert exc.value.code == "unknown-sender"
    finally:
        elsewhere.close()


def test_every_verb_is_walled(harness: Harness) -> None:
    _a, a1, _b, b1 = two_instances(harness)
    assert b1.tool("--verb=report", "--message=private notes").rc == 0
    attempts = [
        ("--verb=status", f"--who={b1.id}"),
        ("--verb=tell", f"--who={b1.id}", "--message=x"),
        ("--verb=ask", f"--who={b1.id}", "--message=x"),
        ("--verb=task", f"--about={b1.id}@m000000000000"),
        ("--verb=report", f"--who={b1.id}"),
        ("--verb=report", f"--who={b1.id}", "--about=json"),
    ]
    for args in attempts:
        r = a1.tool(*args)
        assert r.rc == 1, (args, r.reply)
        assert r.error["rule"] == "instance-wall", (args, r.reply)


def test_the_operator_sees_the_whole_project(harness: Harness) -> None:
    a, a1, b, b1 = two_instances(harness)
    seen = {s["id"]: s["rule"] for s in harness.tool("--verb=who").result}
    assert seen == {a.id: "operator", a1.id: "operator", b.id: "operator", b1.id: "operator"}
