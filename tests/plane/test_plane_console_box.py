"""The question box in a real terminal: the held note in front of the operator, one
question at a time, a key typed just as a box appears kept for the prompt, and a
half-typed line that survives every question."""

from __future__ import annotations

import re
import time
from pathlib import Path

from console_kit import Tmux, needs_tmux, tmux
from plane_kit import write_plane

pytestmark = needs_tmux
__all__ = ["tmux"]

TEAM = [
    {"id": "planner", "description": "plans"},
    {"id": "ledger", "description": "books"},
    {"id": "auditor", "description": "checks"},
]


def prompt_line(screen: str) -> str:
    """The prompt's row: the last line of the screen with a box edge on both sides."""
    rows = [r for r in screen.splitlines() if r.strip()]
    for row in reversed(rows):
        if row.strip().startswith(("▊", "▎", "│", "┃")) or "▔" not in row:
            return row
    return rows[-1]


def test_the_box_shows_the_note_and_answers_one_question_at_a_time(
    tmp_path: Path, tmux: Tmux
) -> None:
    config = write_plane(tmp_path, TEAM)
    tmux.start(config)
    tmux.wait_for(lambda s: "planner · idle" in s, "the panes")
    tmux.type("send ledger: what did August cost? ;; send auditor: please check the books")
    tmux.key("Enter")
    screen = tmux.wait_for(lambda s: "write to ledger? y / n" in s, "the first question")
    assert "planner → ledger · hop 1 · 1 more waiting" in screen
    assert "what did August cost?" in screen.split("planner → ledger")[1]
    assert "write to auditor?" not in screen  # the next is shown only after this answer
    time.sleep(0.5)  # read it; now "hello": h answers no, "ello" comes too soon for the next
    tmux.type("hello")
    screen = tmux.wait_for(lambda s: "write to auditor? y / n" in s, "the second question")
    assert "note to ledger not sent (operator-no)" in screen
    assert "planner → auditor · hop 1" in screen
    assert "more waiting" not in screen
    assert "please check the books" in screen.split("planner → auditor")[1]
    tmux.wait_for(  # the four keys behind the answer are in the prompt, not answers
        lambda s: re.search(r"\bello\b", "".join(s.splitlines()[-3:])) is not None,
        "ello in the prompt",
    )
    assert "write to auditor? y / n" in tmux.screen()
    tmux.answer("y")
    screen = tmux.wait_for(lambda s: "(hop 1, operator-yes)" in s, "the second note sent")
    assert "write to auditor? y / n" not in screen
    tmux.key("Enter")  # what stayed in the prompt is a line like any other
    tmux.wait_for(lambda s: "> ello" in s, "the kept keys sent as a line")
    tmux.key("C-q")


def test_a_half_typed_line_survives_a_question_that_comes_up_under_it(
    tmp_path: Path, tmux: Tmux
) -> None:
    config = write_plane(tmp_path, TEAM)
    tmux.start(config)
    tmux.wait_for(lambda s: "planner · idle" in s, "the panes")
    tmux.type("after 2: send ledger: the late note")
    tmux.key("Enter")
    tmux.type("abcdefgh")  # typing while the turn that will hold a note runs
    screen = tmux.wait_for(lambda s: "write to ledger? y / n" in s, "the question")
    assert "abcdefgh" in screen
    tmux.answer("n")
    screen = tmux.wait_for(lambda s: "not sent (operator-no)" in s, "the answer no")
    assert "abcdefgh" in screen
    tmux.type("ijklmnopqrstuvwx")
    tmux.wait_for(lambda s: "abcdefghijklmnopqrstuvwx" in s, "every key in the prompt")
    time.sleep(1.5)  # a status refresh or two must not touch the prompt
    tmux.key("Left", "Left", "Left")
    tmux.type("-")  # the cursor is where the operator left it
    tmux.key("Enter")
    tmux.wait_for(lambda s: "> abcdefghijklmnopqrstu-vwx" in s, "the whole line sent")
    tmux.key("C-q")


def test_editing_keys_typed_in_one_burst_apply_in_the_order_typed(
    tmp_path: Path, tmux: Tmux
) -> None:
    """Arrows, Home, Backspace and Delete mixed with letters in one write to the terminal:
    each acts where it was typed (as bindings they ran after the letters behind them)."""
    config = write_plane(tmp_path, TEAM)
    tmux.start(config)
    tmux.wait_for(lambda s: "planner · idle" in s, "the panes")
    tmux.key("s", "a", "y", " ", "c", "d", "Left", "b", "End", "e", "Home", "Delete", "Right")
    tmux.key("BSpace", "s", "a", "Left", "Left", "Left", "o", "End", "BSpace", "Enter")
    tmux.wait_for(lambda s: "> osay cbd" in s, "the line as edited")
    tmux.key("C-q")


def pane_of(screen: str, text: str) -> str | None:
    """Which pane's column ``text`` is drawn in: the one whose top-left corner (on the
    first row, with the titles) is the last left of it."""
    title, *rows = screen.splitlines()
    corners = [i for i, c in enumerate(title) if c in "╔╭"]
    agents = sorted(TEAM, key=lambda a: title.find(f"{a['id']} · "))
    for row in rows:
        at = row.find(text)
        if at >= 0:
            left = [a["id"] for corner, a in zip(corners, agents, strict=True) if corner <= at]
            return left[-1] if left else None
    return None


def test_the_consoles_keys_typed_in_one_burst_apply_in_the_order_typed(
    tmp_path: Path, tmux: Tmux
) -> None:
    """A line, Enter, ctrl+n and another line in one write to the terminal: each line goes
    to the pane selected when its Enter was typed; then text and ctrl+f in one write
    search for the whole text (as priority bindings, ctrl+n and ctrl+f ran ahead of the
    keys typed before them)."""
    config = write_plane(tmp_path, TEAM)
    tmux.start(config)
    tmux.wait_for(lambda s: "planner · idle" in s, "the panes")
    tmux.key(*"say one", "Enter", "C-n", *"say two", "Enter", "C-n", *"LINE 2", "C-f")
    screen = tmux.wait_for(
        lambda s: "> say two" in s and "> say one" in s and "search 'LINE 2'" in s,
        "both lines and the search",
    )
    assert pane_of(screen, "> say one") == "planner", screen
    assert pane_of(screen, "> say two") == "ledger", screen
    assert pane_of(screen, "search 'LINE 2'") == "auditor", screen
    tmux.key("C-q")
