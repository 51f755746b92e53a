"""The operator console driven in a real terminal: tmux types, tmux reads the screen.

A plane of two stand-ins runs under ``melchior plane run`` in a tmux session of a fixed
size; the test types a line at planner's prompt, sees the held note's question on
planner's pane, answers ``y`` with one key, and sees both panes and the status line
update. Skipped where tmux is not installed (.ci/run installs it).
"""

from __future__ import annotations

import time
from pathlib import Path

from console_kit import Tmux, needs_tmux, tmux
from plane_kit import write_plane

pytestmark = needs_tmux
__all__ = ["tmux"]


def test_type_a_line_answer_y_and_see_the_panes_update(tmp_path: Path, tmux: Tmux) -> None:
    config = write_plane(
        tmp_path,
        [{"id": "planner", "description": "plans"}, {"id": "ledger", "description": "books"}],
    )
    tmux.start(config, width=140, height=36)
    tmux.wait_for(lambda s: "planner · idle" in s and "ledger · idle" in s, "both panes")
    tmux("send-keys", "-t", "plane", "-l", "send ledger: answer: 42 euros")
    tmux("send-keys", "-t", "plane", "Enter")
    screen = tmux.wait_for(lambda s: "write to ledger? y / n" in s, "the held note's question")
    assert "planner → ledger · hop 1" in screen
    assert "answer: 42 euros" in screen.split("planner → ledger")[1]  # the note in the box
    assert "> send ledger: answer: 42 euros" in screen
    assert "y/n:1" in screen  # the status line counts the question
    time.sleep(0.5)  # past the guard: a key just after the box appears is not an answer
    tmux("send-keys", "-t", "plane", "-l", "y")
    screen = tmux.wait_for(lambda s: "<< 42 euros" in s, "ledger's answer")
    assert "(hop 1, operator-yes)" in screen
    screen = tmux.wait_for(
        lambda s: "answer from ledger arrived (hop 2)" in s, "the answer back at planner"
    )
    # move to ledger's pane and type there: the status line shows both agents' ceilings
    tmux("send-keys", "-t", "plane", "C-n")
    tmux.wait_for(lambda s: "▶ ledger" in s, "ledger's pane selected")
    tmux("send-keys", "-t", "plane", "-l", "/team")
    tmux("send-keys", "-t", "plane", "Enter")
    tmux.wait_for(lambda s: "/team at ledger: planner (no door)" in s, "the team listing")
    tmux.wait_for(
        lambda s: "planner: idle 2/100 turns" in s and "ledger: idle 1/100 turns" in s,
        "both ceilings on the status line",
    )
    tmux("send-keys", "-t", "plane", "C-q")
