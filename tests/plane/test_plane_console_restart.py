"""A console started on a plane's state from before: held notes, queued turns, turns a
crash cut short — recovered exactly as headless does, and drawn once the app runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

from console_kit import MELCHIOR, Tmux, needs_tmux, tmux
from melchior.plane.state import State
from plane_kit import load_plane, write_plane

pytestmark = needs_tmux
__all__ = ["tmux"]

TEAM = [
    {"id": "planner", "description": "plans"},
    {"id": "ledger", "description": "books"},
    {"id": "auditor", "description": "checks"},
]


def held_note(config: Path) -> None:
    """A real headless run leaves planner's note to ledger held (no door)."""
    done = subprocess.run(
        [MELCHIOR, "plane", "run", str(config), "--headless"],
        input="planner> send ledger: what did August cost?\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "write to ledger? y / n" in done.stdout


def test_a_restart_with_a_held_note_draws_the_question(tmp_path: Path, tmux: Tmux) -> None:
    config = write_plane(tmp_path, TEAM)
    held_note(config)
    tmux.start(config)
    screen = tmux.wait_for(lambda s: "write to ledger? y / n" in s, "the held question")
    assert "exit-status" not in screen
    assert "NoActiveAppError" not in screen
    tmux.answer("y")
    tmux.wait_for(lambda s: "(hop 1, operator-yes)" in s, "the note sent")
    tmux.key("C-q")
    tmux.wait_for(lambda s: "exit-status-0" in s, "a clean exit")


def test_a_restart_runs_the_queued_turns(tmp_path: Path, tmux: Tmux) -> None:
    config = write_plane(tmp_path, TEAM)
    held_note(config)
    state = State(load_plane(config).state)
    try:
        state.enqueue("auditor", "operator", "answer: the queued turn ran")
    finally:
        state.close()
    tmux.start(config)
    screen = tmux.wait_for(lambda s: "<< the queued turn ran" in s, "the queued turn's answer")
    assert "write to ledger? y / n" in screen
    tmux.key("C-q")
    tmux.wait_for(lambda s: "exit-status-0" in s, "a clean exit")


def test_a_restart_after_a_crash_mid_turn_says_the_turn_was_interrupted(
    tmp_path: Path, tmux: Tmux
) -> None:
    config = write_plane(tmp_path, TEAM)
    held_note(config)
    state = State(load_plane(config).state)
    try:  # what a plane killed with -9 mid-turn leaves: an input and a turn still running
        state.begin_turn("ledger", state.enqueue("ledger", "operator", "answer: never"))
    finally:
        state.close()
    tmux.start(config)
    screen = tmux.wait_for(
        lambda s: "interrupted when the plane stopped" in s, "the interrupted turn"
    )
    assert "write to ledger? y / n" in screen
    assert "<< never" not in screen
    tmux.key("C-q")
    tmux.wait_for(lambda s: "exit-status-0" in s, "a clean exit")
