"""A provider model as a plane agent: its ``send_to`` tool call becomes a note like any other."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from melchior.policy.fence import unfence
from plane_kit import AGENT, load_plane, log, run, running, settle, turns
from provider_kit import LoopbackServer, call_stream, sequence, served, text_stream


def test_a_model_writes_to_a_stand_in_and_reads_its_answer_next_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_KEY", "sk-test")
    args = json.dumps({"to": "ledger", "message": "answer: 42 euros"})
    handler = sequence(
        served(call_stream("send_to", args)),
        served(text_stream("I asked ledger.")),
        served(text_stream("Ledger says 42 euros.", cost=0.01)),
    )
    with LoopbackServer(handler) as server:
        (tmp_path / "PLANE.toml").write_text(
            f"""
[[agents]]
id = "planner"
description = "plans"
talksTo = ["ledger"]
runtime = "provider"
options = {{ provider = "fake", kind = "openai", base_url = "{server.url}/v1", \
api_key_env = "FAKE_KEY", model = "m-1" }}
ceiling = {{ turns = 10, cost_usd = 0.01 }}

[[agents]]
id = "ledger"
description = "keeps the books"
runtime = "command"
options = {{ argv = {json.dumps([sys.executable, str(AGENT)])} }}
""",
            encoding="utf-8",
        )
        config = load_plane(tmp_path / "PLANE.toml")

        async def main() -> None:
            async with running(config) as (plane, _w):
                plane.operator_line("planner", "what did we spend in August?")
                await settle(plane)
                kinds = [(e["kind"], e.get("receipt")) for e in log(plane) if e["kind"] != "turn"]
                assert kinds == [
                    ("operator", None),
                    ("note", "delivered"),
                    ("answer", "delivered"),
                ]
                done = [e["text"] for e in log(plane, "turn") if e["recipient"] == "planner"]
                assert done == ["I asked ledger. ", "Ledger says 42 euros. "]
                # the reported cost counts against the ceiling
                assert plane.status("planner").state == "spent"
                assert plane.status("planner").ceiling == "2/10 turns, $0.01/$0.01"

        run(main)
    (ledger,) = turns(config, "ledger")
    assert "A message from planner" in ledger["prompt"]
    third = server.requests[2].json()["messages"][-1]["content"]
    assert unfence(third[third.index("The text between") :]) == ("ledger", "answer", "42 euros")
