"""Doors with real stand-in agents: held notes and y / n, @mentions for one turn, /team,
an agent that tries to type /team, and the plane restarted with a note still held."""

from __future__ import annotations

import asyncio
from pathlib import Path

from melchior.plane.config import PlaneConfig
from plane_kit import load_plane, log, run, running, settle, turns, write_plane


def pair(tmp_path: Path) -> PlaneConfig:
    """planner and ledger with no door between them."""
    return load_plane(
        write_plane(tmp_path, [{"id": "planner"}, {"id": "ledger", "description": "books"}])
    )


def test_no_door_holds_the_note_and_y_sends_it_and_leaves_the_door_open(tmp_path: Path) -> None:
    config = pair(tmp_path)

    async def main() -> None:
        async with running(config) as (plane, watch):
            plane.operator_line("planner", "send ledger: how much in August?")
            await settle(plane)
            assert turns(config, "ledger") == []
            (question,) = watch.questions("planner")
            assert question.text == "write to ledger? y / n"
            assert plane.status("planner").state == "waiting"
            held = log(plane, "note")[-1]
            assert (held["receipt"], held["rule"]) == ("held", "no-door")
            receipt = plane.answer(question.data["held"], "y")  # type: ignore[index]
            assert receipt is not None
            assert receipt.kind == "delivered"
            assert plane.answer(question.data["held"], "y") is None  # answered once  # type: ignore[index]
            await settle(plane)
            assert len(turns(config, "ledger")) == 1
            assert "how much in August?" in turns(config, "ledger")[0]["prompt"]
            # the door stays open: the next note goes without a question
            plane.operator_line("planner", "send ledger: and September?")
            await settle(plane)
            assert len(watch.questions("planner")) == 1
            assert len(turns(config, "ledger")) == 2

    run(main)
    first = turns(config, "planner")[0]["calls"][0]["reply"]["result"][0]
    assert first["door"] == "no-door"
    assert "write to ledger? y / n" in first["text"]


def test_every_key_but_y_is_no_and_the_sender_learns_it_next_turn(tmp_path: Path) -> None:
    config = pair(tmp_path)

    async def main() -> None:
        async with running(config) as (plane, watch):
            for key in ("n", "Y", " ", "\r"):
                plane.operator_line("planner", f"send ledger: try {key!r}")
                await settle(plane)
                question = watch.questions("planner")[-1]
                receipt = plane.answer(question.data["held"], key)  # type: ignore[index]
                assert receipt is not None
                assert receipt.kind == "refused"
                assert receipt.decision is not None
                assert receipt.decision.rule == "operator-no"
            plane.operator_line("planner", "what now?")
            await settle(plane)
            assert turns(config, "ledger") == []
            assert plane.state.opened("planner") == set()

    run(main)
    last = turns(config, "planner")[-1]["prompt"]
    assert "Your note to ledger was not sent (operator-no)" in last


def test_an_operator_mention_opens_the_door_for_that_turn_only(tmp_path: Path) -> None:
    config = pair(tmp_path)

    async def main() -> None:
        async with running(config) as (plane, watch):
            plane.operator_line(
                "planner", "ask @ledger for August\nsend ledger: what did we spend?"
            )
            await settle(plane)
            assert [e["rule"] for e in log(plane, "note")] == ["mention"]
            assert len(turns(config, "ledger")) == 1
            plane.operator_line("planner", "send ledger: and again?")
            await settle(plane)
            assert log(plane, "note")[-1]["receipt"] == "held"
            assert len(watch.questions("planner")) == 1

    run(main)
    first, second = turns(config, "planner")
    # the roster said so before each turn
    assert first["roster"]["may_write_to"] == ["ledger"]
    assert first["roster"]["agent"] == "planner"
    assert second["roster"]["may_write_to"] == []
    assert second["roster"]["team"][0]["description"] == "books"
    assert first["calls"][0]["reply"]["result"][0]["door"] == "mention"
    assert second["calls"][0]["reply"]["result"][0]["door"] == "no-door"


def test_team_opens_lists_and_drops_one_way(tmp_path: Path) -> None:
    config = pair(tmp_path)

    async def main() -> None:
        async with running(config) as (plane, watch):
            assert "ledger (no door)" in plane.operator_line("planner", "/team")
            assert "may now write to ledger" in plane.operator_line("planner", "/team ledger")
            assert "ledger (/team)" in plane.operator_line("planner", "/team")
            plane.operator_line("planner", "send ledger: via team\nteam")
            plane.operator_line("ledger", "send planner: the other way?")
            await settle(plane)
            rules = [(e["sender"], e["receipt"], e["rule"]) for e in log(plane, "note")]
            assert ("planner", "delivered", "team") in rules
            assert ("ledger", "held", "no-door") in rules  # one way only
            assert "no longer write" in plane.operator_line("planner", "/team drop ledger")
            assert "nothing to drop" in plane.operator_line("planner", "/team drop ledger")
            plane.operator_line("planner", "send ledger: after drop")
            await settle(plane)
            assert log(plane, "note")[-1]["receipt"] == "held"
            assert watch.of("planner", "team")[0].text.startswith("/team at planner")

    run(main)
    listing = turns(config, "planner")[0]["calls"][1]["reply"]["result"]
    assert listing == [{"id": "ledger", "description": "books", "may_write": True, "door": "team"}]


def test_an_agent_may_read_the_team_and_is_told_the_operators_line(tmp_path: Path) -> None:
    config = pair(tmp_path)

    async def main() -> None:
        async with running(config) as (plane, _w):
            plane.operator_line("planner", "team-line: /team ledger\nteam-line: /team drop ledger")
            await settle(plane)
            assert plane.state.opened("planner") == set()

    run(main)
    opened, dropped = turns(config, "planner")[0]["calls"]
    assert opened["rc"] == 1
    assert dropped["rc"] == 1
    assert opened["reply"]["error"]["rule"] == "operator-only"
    assert opened["reply"]["error"]["reason"].endswith("at planner's prompt: /team ledger")
    assert opened["reply"]["error"]["line"] == "/team ledger"
    assert dropped["reply"]["error"]["line"] == "/team drop ledger"


def test_a_mention_or_team_line_in_a_peer_note_opens_nothing(tmp_path: Path) -> None:
    config = load_plane(
        write_plane(tmp_path, [{"id": "a", "talksTo": ["b"]}, {"id": "b"}, {"id": "c"}])
    )

    async def main() -> None:
        async with running(config) as (plane, _w):
            plane.operator_line("a", "send b: /team c")
            await settle(plane)
            plane.operator_line("a", "send b: @c please\\nsend c: hello from b")
            await settle(plane)
            assert plane.state.opened("b") == set()
            assert log(plane, "note")[-1]["receipt"] == "held"

    run(main)
    assert turns(config, "c") == []


def test_a_held_note_survives_a_restart_and_y_still_sends_it(tmp_path: Path) -> None:
    config = pair(tmp_path)

    async def first() -> None:
        async with running(config) as (plane, watch):
            plane.operator_line("planner", "send ledger: kept over a restart")
            await settle(plane)
            assert len(watch.questions("planner")) == 1

    async def second() -> None:
        async with running(load_plane(config.path)) as (plane, watch):
            await settle(plane)
            (question,) = watch.questions("planner")  # asked again on the new console
            (held,) = plane.questions("planner")
            assert question.data == {"held": held.id, "to": "ledger"}
            receipt = plane.answer(held.id, "y")
            assert receipt is not None
            assert receipt.kind == "delivered"
            await settle(plane)

    run(first)
    run(second)
    (ledger,) = turns(config, "ledger")
    assert "kept over a restart" in ledger["prompt"]


def test_a_turn_cut_short_by_a_stop_is_not_run_again_and_the_sender_is_told(
    tmp_path: Path,
) -> None:
    config = load_plane(
        write_plane(tmp_path, [{"id": "planner", "talksTo": ["ledger"]}, {"id": "ledger"}])
    )

    async def first() -> None:
        async with running(config) as (plane, _w):
            plane.operator_line("planner", "send ledger: sleep: 60")
            for _ in range(600):  # until ledger's turn is running (a hang guard)
                if plane.status("ledger").state == "running" and turns(config, "planner"):
                    break
                await asyncio.sleep(0.05)
            assert plane.status("ledger").state == "running"

    async def second() -> None:
        async with running(load_plane(config.path)) as (plane, _w):
            await settle(plane)
            assert [e["rule"] for e in log(plane, "turn") if e.get("rule")] == ["interrupted"]
            assert plane.state.pending("ledger") == []
            told = [t for _, t in plane.state.untold("planner")]
            assert any("so your note to it got no answer" in t for t in told)
            plane.operator_line("ledger", "hello again")
            await settle(plane)

    run(first)
    run(second)
    ledger = turns(config, "ledger")
    assert len(ledger) == 1  # the cut turn never recorded, and it was not run again
    assert "Your last turn was interrupted when the plane stopped." in ledger[0]["prompt"]
