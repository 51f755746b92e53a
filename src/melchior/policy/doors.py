"""Doors on a plane: who may write to whom now, and who may change that. Pure.

A note wakes another agent and spends that agent's ceiling, so every door is the
operator's to open (seed 001, "Three ways to open a door, all of them yours"):

- ``talksTo`` in the plane's configuration (rule ``talks-to``);
- ``/team NAME`` typed by the operator at an agent's prompt: one door, one way, from
  the agent the line was typed at (rule ``team``), closed again by ``/team drop NAME``;
- an ``@NAME`` in an *operator* line: that door, for that turn only (rule ``mention``).

Only operator lines count. An ``@`` or a ``/team`` arriving in a webhook body, a mail
or a peer's note is a stranger typing one, so :func:`mentions` and
:func:`team_command` read nothing from a line below operator trust. An agent may read
the team and never change it: :func:`agent_may_change_team` refuses with the exact
line the operator would type, in the pane where they are already looking.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Set
from typing import NamedTuple

from melchior.policy.decision import Decision, allow, refuse

OPERATOR = "operator"
"""Trust of a line the operator typed at the console (the only one that opens doors)."""
PEER = "peer"
"""Trust of a note another agent wrote."""
STRANGER = "stranger"
"""Trust of anything from outside: a webhook body, a mail."""
TRUST_LEVELS: tuple[str, ...] = (OPERATOR, PEER, STRANGER)

AGENT_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
"""An agent's id on a plane: a word, so it can stand in an ``@`` mention, a file name and
an environment value without quoting."""

_MENTION = re.compile(r"(?<![\w@])@([A-Za-z][A-Za-z0-9_-]{0,63})")
_TEAM = re.compile(r"/team(?:\s+(drop)\s+(\S+)|\s+(\S+))?\s*")


class TeamCommand(NamedTuple):
    """A parsed ``/team`` line: ``list`` (no name), ``open`` NAME or ``drop`` NAME."""

    action: str
    name: str | None = None

    def line(self) -> str:
        """The exact line the operator types for this command."""
        if self.action == "list":
            return "/team"
        if self.action == "drop":
            return f"/team drop {self.name}"
        return f"/team {self.name}"


def is_agent_id(name: object) -> bool:
    return isinstance(name, str) and AGENT_ID.fullmatch(name) is not None


def team_command(line: str, trust: str = OPERATOR) -> TeamCommand | None:
    """The ``/team`` command ``line`` is, or None; below operator trust it is never one."""
    if trust != OPERATOR:
        return None
    m = _TEAM.fullmatch(line.strip())
    if m is None:
        return None
    if m.group(1):
        return TeamCommand("drop", m.group(2))
    if m.group(3):
        return TeamCommand("open", m.group(3))
    return TeamCommand("list")


def mentions(line: str, known: Iterable[str], trust: str = OPERATOR) -> frozenset[str]:
    """The agents an operator line names with ``@NAME`` (only names on the roster).

    A line below operator trust mentions nobody: an ``@`` in a webhook body is a
    stranger typing one, which is what the trust levels are for.
    """
    if trust != OPERATOR:
        return frozenset()
    names = set(known)
    return frozenset(n for n in _MENTION.findall(line) if n in names)


def door(
    sender: str,
    recipient: str,
    *,
    talks_to: Set[str],
    opened: Set[str],
    mentioned: Set[str],
) -> Decision:
    """May ``sender`` write to ``recipient`` now?

    ``talks_to`` is the sender's configured list, ``opened`` the doors the operator
    opened from the sender with ``/team`` (or by answering ``y``), ``mentioned`` the
    names an operator ``@``-mentioned in the line that started this turn. Allowed with
    the rule that opened the door, or refused ``no-door`` (the note is then held and
    the operator asked).
    """
    if sender == recipient:
        return refuse("self", f"{sender} cannot write to itself; end the turn with the answer")
    if recipient in talks_to:
        return allow("talks-to", f"{sender} talks to {recipient} (the plane's configuration)")
    if recipient in opened:
        return allow("team", f"the operator opened {sender}'s door to {recipient} (/team)")
    if recipient in mentioned:
        return allow("mention", f"the operator named @{recipient} in this turn's line")
    return refuse(
        "no-door",
        f"{sender} has no door to {recipient}: the note is held and the operator is asked "
        f"'write to {recipient}? y / n' on {sender}'s pane",
    )


def may_write_now(
    sender: str,
    roster: Iterable[str],
    *,
    talks_to: Set[str],
    opened: Set[str],
    mentioned: Set[str],
) -> list[str]:
    """The roster's agents ``sender`` may write to now, in roster order."""
    return [
        name
        for name in roster
        if door(sender, name, talks_to=talks_to, opened=opened, mentioned=mentioned).allowed
    ]


def agent_may_change_team(agent: str, command: TeamCommand) -> Decision:
    """An agent may read the team (``/team``) and never change it.

    The refusal names the exact line the operator would type, and where: a door an
    agent could open itself would put the plane to work on its own say-so.
    """
    if command.action == "list":
        return allow("team-read", "any agent may read the team")
    return refuse(
        "operator-only",
        f"an agent may read /team and may never type it. To ask for this, tell your operator; "
        f"they would type, at {agent}'s prompt: {command.line()}",
    )


def operator_changes_team(
    agent: str, command: TeamCommand, *, roster: Set[str], talks_to: Set[str], opened: Set[str]
) -> Decision:
    """Judge an operator's ``/team`` line typed at ``agent``'s prompt."""
    if command.action == "list":
        return allow("team-read", "the team as it stands")
    name = command.name or ""
    if name not in roster:
        return refuse(
            "unknown-agent",
            f"there is no agent {name!r} on this plane; the agents are {', '.join(sorted(roster))}",
        )
    if name == agent:
        return refuse("self", f"{agent} cannot write to itself")
    if command.action == "open":
        return allow("team", f"{agent} may now write to {name} (one way; /team drop {name} closes)")
    if name in opened:
        return allow("team", f"{agent} may no longer write to {name}")
    if name in talks_to:
        return refuse(
            "talks-to",
            f"{agent} talks to {name} by the plane's configuration (talksTo); /team drop closes "
            "only a door opened with /team or y",
        )
    return refuse("no-door", f"no door from {agent} to {name} was opened here; nothing to drop")
