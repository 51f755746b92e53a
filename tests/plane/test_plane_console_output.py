"""Long output on a pane, in a real terminal: the head and the tail with where the rest
is, the whole text in the log; a failed turn's output shown with its error; wrapped
lines keep their indent. (How long a keystroke takes to echo under a 4 MiB output is
measured by bench/plane_console_echo.py, not asserted here.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from console_kit import MELCHIOR, Tmux, needs_tmux, tmux
from plane_kit import write_plane

pytestmark = needs_tmux
__all__ = ["tmux"]

TEAM = [{"id": "planner", "description": "plans"}, {"id": "ledger", "description": "books"}]


def test_a_long_output_shows_head_and_tail_and_the_log_keeps_it_all(
    tmp_path: Path, tmux: Tmux
) -> None:
    config = write_plane(tmp_path, TEAM)
    tmux.start(config)
    tmux.wait_for(lambda s: "planner · idle" in s, "the panes")
    tmux.type("print: 80000")  # about 3.6 MB, under the 4 MiB cap
    tmux.key("Enter")
    screen = tmux.wait_for(lambda s: "output line 80000 " in s, "the tail of the output")
    assert "79920 more lines; the whole text is in `melchior plane log`" in screen
    tmux.type("still typing")  # the console still takes keys
    tmux.wait_for(lambda s: "still typing" in s, "the keys echoed")
    tmux.key("C-q")
    tmux.wait_for(lambda s: "exit-status-0" in s, "a clean exit")
    done = subprocess.run(
        [MELCHIOR, "plane", "log", str(config), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    (turn,) = [e for e in json.loads(done.stdout)["result"] if e["kind"] == "turn"]
    assert len(turn["text"].splitlines()) == 80000


def test_a_failed_turn_shows_its_output_and_wrapped_lines_keep_their_indent(
    tmp_path: Path, tmux: Tmux
) -> None:
    config = write_plane(tmp_path, TEAM)
    tmux.start(config, width=120)
    tmux.wait_for(lambda s: "planner · idle" in s, "the panes")
    tmux.type("answer: printed before the crash ;; fail")
    tmux.key("Enter")
    screen = tmux.wait_for(lambda s: "its output:" in s, "the failed turn's output")
    assert "printed before the crash" in screen.split("its output:")[1]
    long = "word " * 40
    tmux.type(long.strip())
    tmux.key("Enter")
    screen = tmux.wait_for(lambda s: "> word word" in s, "the long line")
    # the console's box only (its rows between its ║ borders): the agent's pane beside
    # it may show the same words once the note reaches it
    boxed = [r.split("║")[1] for r in screen.splitlines() if r.startswith("║") and "║" in r[1:]]
    rows = [r for r in boxed if "word word" in r]
    assert len(rows) > 1, screen  # it wrapped
    first = rows[0].index("> word") + 2
    for row in rows[1:]:
        assert row.index("word") == first, rows  # under the text, not under the prefix
    tmux.key("C-q")
