"""The operator's controls in a real terminal: stopping one agent's turn without
quitting, scrolling a pane from the keyboard, and the help line."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from console_kit import Tmux, needs_tmux, tmux
from plane_kit import write_plane

pytestmark = needs_tmux
__all__ = ["tmux"]

TEAM = [{"id": "planner", "description": "plans"}, {"id": "ledger", "description": "books"}]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_x_stops_the_selected_agents_turn_and_the_plane_goes_on(
    tmp_path: Path, tmux: Tmux
) -> None:
    config = write_plane(tmp_path, TEAM)
    tmux.start(config)
    tmux.wait_for(lambda s: "planner · idle" in s, "the panes")
    tmux.type("sleep: 300")
    tmux.key("Enter")
    screen = tmux.wait_for(lambda s: re.search(r"\(pid (\d+)\)", s) is not None, "the turn's pid")
    match = re.search(r"\(pid (\d+)\)", screen)
    assert match is not None
    pid = int(match.group(1))
    assert alive(pid)
    tmux.key("C-x")
    tmux.wait_for(lambda s: "turn stopped by the operator" in s, "the turn stopped")
    for _ in range(100):  # the process tree is killed (a hang guard, not a threshold)
        if not alive(pid):
            break
        time.sleep(0.1)
    assert not alive(pid)
    tmux.type("answer: still here")
    tmux.key("Enter")
    tmux.wait_for(lambda s: "<< still here" in s, "the next turn runs")
    tmux.key("C-x")
    tmux.wait_for(lambda s: "ctrl+x: no turn of planner is running" in s, "nothing to stop")
    tmux.key("C-q")
    tmux.wait_for(lambda s: "exit-status-0" in s, "a clean exit")


def test_page_keys_scroll_the_pane_and_the_help_line_lists_the_controls(
    tmp_path: Path, tmux: Tmux
) -> None:
    config = write_plane(tmp_path, TEAM)
    tmux.start(config)
    tmux.wait_for(lambda s: "planner · idle" in s, "the panes")
    tmux.type("print: 70")
    tmux.key("Enter")
    screen = tmux.wait_for(lambda s: "output line 70 " in s, "the end of the output")
    assert "output line 1 " not in screen
    tmux.key("Home")
    screen = tmux.wait_for(lambda s: "output line 1 " in s, "the top of the pane")
    assert "output line 70 " not in screen
    tmux.key("PageDown")
    tmux.key("End")
    tmux.wait_for(lambda s: "output line 70 " in s, "the bottom again")
    tmux.key("PageUp")
    tmux.wait_for(lambda s: "output line 70 " not in s, "a page up")
    tmux.type("?")
    screen = tmux.wait_for(lambda s: "ctrl+x: stop" in s, "the help line")
    for control in ("PgUp/PgDn", "Home/End", "ctrl+n/ctrl+p", "ctrl+q: quit"):
        assert control in screen
    tmux.type("why?")  # in a line, ? is just a character
    tmux.wait_for(lambda s: "why?" in s, "the question mark typed")
    tmux.key("C-q")


def test_ctrl_r_runs_a_stopped_turn_again_and_ctrl_o_shows_the_queue(
    tmp_path: Path, tmux: Tmux
) -> None:
    config = write_plane(tmp_path, TEAM)
    tmux.start(config)
    tmux.wait_for(lambda s: "planner · idle" in s, "the panes")
    tmux.key("C-r")
    tmux.wait_for(lambda s: "planner has had no turn to run again" in s, "nothing to re-run")
    tmux.type("sleep: 300 ;; answer: done at last")
    tmux.key("Enter")
    tmux.wait_for(lambda s: "(pid " in s, "the turn running")
    tmux.type("answer: the second line")
    tmux.key("Enter")  # queued behind the running turn
    tmux.wait_for(lambda s: "> answer: the second line" in s, "the second line taken")
    tmux.key("C-o")
    screen = tmux.wait_for(lambda s: "queued for planner: 1 turn(s)" in s, "the queue")
    assert "1. operator: answer: the second line" in screen
    tmux.key("C-x")
    tmux.wait_for(lambda s: "<< the second line" in s, "the queued turn after the stop")
    tmux.key("C-r")  # the last turn completed: it is not run again, and that is said
    tmux.wait_for(lambda s: "only a failed, interrupted or stopped turn" in s, "the refusal")
    tmux.type("sleep: 300")
    tmux.key("Enter")
    tmux.wait_for(lambda s: "turn 3 (operator)" in s, "the third turn running")
    tmux.key("C-x")
    tmux.wait_for(lambda s: s.count("turn stopped by the operator") == 2, "stopped")
    tmux.key("C-r")
    tmux.wait_for(lambda s: "the stopped turn (operator) is queued again" in s, "re-queued")
    tmux.wait_for(lambda s: "turn 4 (operator)" in s, "the turn run again")
    tmux.key("C-x")
    tmux.wait_for(lambda s: s.count("turn stopped by the operator") == 3, "stopped again")
    tmux.key("C-q")


def test_ctrl_f_searches_the_pane_for_the_prompts_text(tmp_path: Path, tmux: Tmux) -> None:
    config = write_plane(tmp_path, TEAM)
    tmux.start(config)
    tmux.wait_for(lambda s: "planner · idle" in s, "the panes")
    tmux.type("print: 30")
    tmux.key("Enter")
    tmux.wait_for(lambda s: "output line 30 " in s, "the output")
    tmux.type("LINE 2")
    tmux.key("C-f")
    screen = tmux.wait_for(lambda s: "search 'LINE 2': " in s, "the search")
    assert "search 'LINE 2': 11 line(s)" in screen  # 2 and 20-29, case-insensitive
    assert "LINE 2" in screen.splitlines()[-2] + screen.splitlines()[-3]  # the prompt kept it
    tmux.key("C-q")
