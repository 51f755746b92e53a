"""PLANE.toml is strict: every mistake is an error naming the key and where it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from melchior.plane.config import PlaneConfigError, parse

GOOD = """
[[agents]]
id = "planner"
talksTo = ["ledger"]
runtime = "command"
options = { argv = ["true"] }

[[agents]]
id = "ledger"
description = "keeps the books"
runtime = "command"
options = { argv = ["true"] }
ceiling = { turns = 5, cost_usd = 1.5 }
"""


def test_a_good_plane(tmp_path: Path) -> None:
    config = parse(GOOD, tmp_path / "PLANE.toml")
    assert config.ids == ("planner", "ledger")
    assert config.by_id["planner"].talks_to == ("ledger",)
    assert config.by_id["planner"].workspace == tmp_path / "agents" / "planner"
    assert config.state == tmp_path / ".plane" / "state.db"
    ledger = config.by_id["ledger"].ceiling
    assert (ledger.turns, ledger.cost_usd) == (5, 1.5)
    assert ledger.reached(4, 1.5) == "it has spent $1.50 of its $1.50"
    assert ledger.reached(5, 0) == "it has taken 5 of its 5 turns"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("talksTo", "talksto"), r"unknown key agents\[0\] \(planner\)\.talksto"),
        (('id = "ledger"', 'id = "planner"'), "agent id 'planner' is used twice"),
        (('["ledger"]', '["ghost"]'), "talksTo names 'ghost', which is not an agent here"),
        (('["ledger"]', '["planner"]'), "talksTo names itself"),
        (('id = "planner"', 'id = "@planner"'), r"agents\[0\]\.id must be a word"),
        (('argv = ["true"] }\n\n', 'argv = ["true"], shell = true }\n\n'), "unknown option shell"),
        (('runtime = "command"', 'runtime = "hermes"'), "no runtime adapter is named 'hermes'"),
        (("turns = 5", "turns = 0"), r"ceiling\.turns must be a whole number"),
        (("cost_usd = 1.5", "cost_usd = -1"), r"ceiling\.cost_usd must be a positive number"),
        (
            (
                '[[agents]]\nid = "planner"',
                "[plane]\nstate_dir = 'x'\n[[agents]]\nid = \"planner\"",
            ),
            r"unknown key plane\.state_dir",
        ),
    ],
)
def test_mistakes_are_named(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    text = GOOD.replace(*change, 1)
    assert text != GOOD
    with pytest.raises(PlaneConfigError, match=message):
        parse(text, tmp_path / "PLANE.toml")


def test_the_webhook_listens_on_loopback_only(tmp_path: Path) -> None:
    hook = '[webhook]\nlisten = "0.0.0.0"\nport = 8787\n'
    with pytest.raises(PlaneConfigError, match=r"webhook\.listen must be a loopback address"):
        parse(hook + GOOD, tmp_path / "PLANE.toml")
    config = parse('[webhook]\nport = 0\ntoken_env = "T"\n' + GOOD, tmp_path / "PLANE.toml")
    assert config.webhook is not None
    assert config.webhook.token_env == "T"
    with pytest.raises(PlaneConfigError, match=r"unknown key webhook\.token"):
        parse('[webhook]\ntoken = "secret"\n' + GOOD, tmp_path / "PLANE.toml")
    with pytest.raises(PlaneConfigError, match="at least one agent"):
        parse("[plane]\n", tmp_path / "PLANE.toml")
    with pytest.raises(PlaneConfigError, match="not valid TOML"):
        parse("[[agents]\n", tmp_path / "PLANE.toml")


def test_one_plane_at_a_time_on_one_state(tmp_path: Path) -> None:
    from melchior.plane.state import State, StateBusy

    first = State(tmp_path / "state.db")
    with pytest.raises(StateBusy, match="another plane is running"):
        State(tmp_path / "state.db")
    State(tmp_path / "state.db", readonly=True).close()  # readers need no lock
    first.close()
    State(tmp_path / "state.db").close()
