"""Bounds with real stand-in agents: four hops from what a person said, ceilings, the
webhook's stranger lines, and the verbs existing only inside a plane turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from plane_kit import load_plane, log, run, running, settle, turns, write_plane

MELCHIOR = str(Path(sys.executable).with_name("melchior"))


def test_the_fifth_hop_is_refused_in_a_chain_of_three_agents(tmp_path: Path) -> None:
    everyone = ["a", "b", "c"]
    config = load_plane(
        write_plane(
            tmp_path, [{"id": x, "talksTo": [y for y in everyone if y != x]} for x in everyone]
        )
    )
    chain = "send b: send c: send a: send b: send c: answer: too far"

    async def main() -> None:
        async with running(config) as (plane, watch):
            plane.operator_line("a", chain)
            await settle(plane)
            notes = log(plane, "note")
            assert [(n["sender"], n["recipient"], n["hop"], n["receipt"]) for n in notes] == [
                ("a", "b", 1, "delivered"),
                ("b", "c", 2, "delivered"),
                ("c", "a", 3, "delivered"),
                ("a", "b", 4, "delivered"),
                ("b", "c", 5, "refused"),
            ]
            assert len({n["chain"] for n in notes}) == 1
            assert notes[-1]["rule"] == "hop-limit"
            assert [e for e in watch.of("b", "note") if e.data and e.data.get("rule")][-1].data == {
                "receipt": "refused",
                "rule": "hop-limit",
                "to": "c",
            }
            # both are left alone: c was woken once, and b is not woken by the refusal
            assert len(turns(config, "c")) == 1
            assert len(turns(config, "b")) == 2
            # the next operator line starts again at 1
            plane.operator_line("b", "send c: fresh start")
            await settle(plane)
            assert log(plane, "note")[-1]["hop"] == 1
            assert log(plane, "note")[-1]["receipt"] == "delivered"

    run(main)
    told = turns(config, "b")[-1]["prompt"]
    assert "Your note to c was not sent (hop-limit): this would be hop 5" in told


def test_an_answer_past_the_fourth_hop_is_refused_and_wakes_nobody(tmp_path: Path) -> None:
    config = load_plane(
        write_plane(tmp_path, [{"id": "a", "talksTo": ["b"]}, {"id": "b", "talksTo": ["a"]}])
    )

    async def main() -> None:
        async with running(config) as (plane, _w):
            plane.operator_line("a", "send b: send a: send b: send a: answer: deep")
            await settle(plane)
            answers = [x for x in log(plane, "answer") if x["rule"] != "no-answer"]
            assert [(x["sender"], x["recipient"], x["hop"], x["receipt"]) for x in answers] == [
                ("a", "b", 5, "refused")
            ]
            assert answers[0]["rule"] == "hop-limit"
            assert answers[0]["text"] == "deep"
            assert len(turns(config, "b")) == 2

    run(main)


def test_a_spent_ceiling_stops_the_turns_and_the_sender_is_told(tmp_path: Path) -> None:
    config = load_plane(
        write_plane(
            tmp_path, [{"id": "planner", "talksTo": ["ledger"]}, {"id": "ledger", "turns": 1}]
        )
    )

    async def main() -> None:
        async with running(config) as (plane, _w):
            plane.operator_line("planner", "send ledger: first")
            await settle(plane)
            assert plane.status("ledger").state == "spent"
            assert plane.status("ledger").ceiling == "1/1 turns"
            plane.operator_line("planner", "send ledger: second")
            await settle(plane)
            last = log(plane, "note")[-1]
            assert (last["receipt"], last["rule"]) == ("refused", "ceiling")
            assert "ledger has reached its ceiling: it has taken 1 of its 1 turns" in last["reason"]
            plane.operator_line("ledger", "are you there?")
            await settle(plane)
            assert log(plane, "operator")[-1]["text"] == "are you there?"
            assert log(plane)[-1]["rule"] == "ceiling"

    run(main)
    assert len(turns(config, "ledger")) == 1
    plane_turns = turns(config, "planner")
    assert (
        "Your note to ledger was not sent (ceiling)" in plane_turns[-1]["prompt"]
        or len(plane_turns) == 2
    )


def test_the_schema_lists_send_to_and_team_only_inside_a_plane_turn(tmp_path: Path) -> None:
    config = load_plane(write_plane(tmp_path, [{"id": "solo"}]))

    async def main() -> None:
        async with running(config) as (plane, _w):
            plane.operator_line("solo", "hello")
            await settle(plane)

    run(main)
    inside = {alt["title"] for alt in turns(config, "solo")[0]["schema"]["oneOf"]}
    env = {k: v for k, v in os.environ.items() if not k.startswith("MELCHIOR_PLANE_")}
    outside = json.loads(
        subprocess.run(
            [MELCHIOR, "tool", "--schema"], env=env, capture_output=True, check=True
        ).stdout
    )
    assert {"send_to", "team"} <= inside
    assert {alt["title"] for alt in outside["oneOf"]} == inside - {"send_to", "team"}
    refused = subprocess.run(
        [MELCHIOR, "tool", "--verb=send_to", "--to=x", "--message=y"],
        env=env,
        capture_output=True,
        check=False,
    )
    assert refused.returncode == 2
    assert b"unknown verb 'send_to'" in refused.stdout


def test_the_plane_verbs_import_no_sqlite_asyncio_or_textual(tmp_path: Path) -> None:
    roster = tmp_path / "roster.json"
    roster.write_text(json.dumps({"team": [{"id": "b", "may_write": True, "door": "talks-to"}]}))
    code = (
        "import sys; from melchior.commands import tool; "
        "ns = tool.parse_fast(['--verb=send_to', '--to=b', '--message=hi']); tool.run(ns); "
        "bad = [m for m in ('sqlite3', 'asyncio', 'textual') if m in sys.modules]; "
        "sys.stderr.write(repr(bad))"
    )
    env = {
        **os.environ,
        "MELCHIOR_PLANE_AGENT": "a",
        "MELCHIOR_PLANE_ROSTER": str(roster),
        "MELCHIOR_PLANE_OUTBOX": str(tmp_path / "out.ndjson"),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stderr == "[]"
    assert json.loads(done.stdout)["result"][0]["receipt"] == "queued"
    (line,) = (tmp_path / "out.ndjson").read_text().splitlines()
    assert json.loads(line)["to"] == "b"
    assert json.loads(line)["text"] == "hi"
