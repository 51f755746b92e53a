"""The roster: written into an agent's workspace before every turn, read by its verbs.

An agent cannot ask the plane anything (there is no route from a turn to the plane),
so what it needs to know about the team is put where it can read it: who there is,
what each one is for, and which of them it may write to *now* — talksTo, doors the
operator opened, and this turn's ``@`` mentions. ``melchior tool --verb=team`` prints
it and ``send_to`` checks names against it; the plane judges every note again after
the turn, so a roster an agent edits changes nothing but its own view.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence, Set
from pathlib import Path
from typing import Any

from melchior.policy.doors import door
from melchior.policy.quotas import PER_TURN

DIR = ".plane"
"""The directory in each workspace that holds the roster and the turns' outboxes."""
ROSTER = "roster.json"
MAX_ROSTER_BYTES = 1 << 20


def build(
    agent: str,
    team: Sequence[tuple[str, str]],
    *,
    talks_to: Set[str],
    opened: Set[str],
    mentioned: Set[str],
    turn: int,
) -> dict[str, Any]:
    """The roster of ``agent`` for one turn; ``team`` is every (id, description) in order."""
    others = []
    for other, description in team:
        if other == agent:
            continue
        d = door(agent, other, talks_to=talks_to, opened=opened, mentioned=mentioned)
        others.append(
            {
                "id": other,
                "description": description,
                "may_write": d.allowed,
                "door": d.rule,
            }
        )
    return {
        "agent": agent,
        "turn": turn,
        "team": others,
        "may_write_to": [o["id"] for o in others if o["may_write"]],
        "notes_per_turn": PER_TURN,
        "send_to": "melchior tool --verb=send_to --to=NAME --message=TEXT (- = stdin)",
    }


def write(workspace: Path, roster: Mapping[str, Any]) -> Path:
    """Write ``roster`` into ``workspace`` (atomically) and return its path."""
    from melchior.files import atomic_write

    path = workspace / DIR / ROSTER
    data = json.dumps(roster, ensure_ascii=False, indent=1).encode("utf-8")
    atomic_write(path, data, mode=0o600, make_parent=True)
    return path


def read(path: Path) -> dict[str, Any]:
    """The roster at ``path``; ValueError saying what is wrong with it."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_ROSTER_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"the roster {path} cannot be read: {exc.strerror}") from None
    if len(data) > MAX_ROSTER_BYTES:
        raise ValueError(f"the roster {path} is too large")
    try:
        roster = json.loads(data)
    except ValueError:
        raise ValueError(f"the roster {path} is not JSON") from None
    if not isinstance(roster, dict) or not isinstance(roster.get("team"), list):
        raise ValueError(f"the roster {path} is not a roster")
    return roster
