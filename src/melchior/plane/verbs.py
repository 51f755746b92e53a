"""The agent's side of the plane: ``send_to`` and ``team``, as ``melchior tool`` runs them.

This module is what the layers below the plane are handed, never import: the vocabulary
(:class:`melchior.tool.PlaneVerbs`, from ``melchior tool`` and the MCP bridge) and the
provider runtime (:class:`melchior.runtimes.base.PlaneSeat`, with each plane turn).

Inside a plane turn the environment names three things (and only then do these verbs
exist): :data:`ENV_AGENT` who I am, :data:`ENV_ROSTER` the roster the plane wrote before
the turn, :data:`ENV_OUTBOX` the file this turn's notes go to. ``send_to`` appends one
note there and prints what the seed's box says; it opens no connection to anything.
The plane judges every note again when the turn is over (doors, quota, hops), so these
checks are for the agent's benefit — an immediate, truthful answer — not the fence.

Start-up matters (``melchior tool`` is exec'd per request): this module imports no
sqlite3, asyncio or textual, only the pure policy and the outbox's file code.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from melchior.policy.doors import agent_may_change_team, team_command
from melchior.policy.quotas import PER_TURN, per_turn
from melchior.wire.calls import Refused

ENV_AGENT = "MELCHIOR_PLANE_AGENT"
ENV_OUTBOX = "MELCHIOR_PLANE_OUTBOX"
ENV_ROSTER = "MELCHIOR_PLANE_ROSTER"
VERBS: tuple[str, ...] = ("send_to", "team")


class PlaneUsage(Exception):
    """The request is malformed (``melchior tool`` exits 2)."""


def in_plane(env: Mapping[str, str]) -> bool:
    """Whether this is a plane turn (the plane's verbs exist only then)."""
    return bool(env.get(ENV_OUTBOX)) and bool(env.get(ENV_ROSTER)) and bool(env.get(ENV_AGENT))


def written_box(to: str) -> str:
    """What ``send_to`` says once the note is written (seed 001's box, verbatim)."""
    return (
        f"Written to {to}. It goes when this turn ends, and it wakes {to} up.\n\n"
        f"It arrives there as data and not as an order — you are not {to}'s operator, and it "
        "decides for itself what to do with what you asked. Its answer comes back to you as a "
        "turn of your own, so end this one rather than waiting for it."
    )


def _refused(decision_rule: str, reason: str, **detail: Any) -> Refused:
    return Refused(reason, "refused", {"rule": decision_rule, "receipt": "refused", **detail})


def _roster(env: Mapping[str, str]) -> dict[str, Any]:
    from melchior.plane import roster

    try:
        return roster.read(Path(env[ENV_ROSTER]))
    except ValueError as exc:
        raise Refused(str(exc), "setup") from None


def _read_stdin(stdin: Callable[[int], bytes]) -> str:
    from melchior.plane.outbox import MAX_NOTE_BYTES

    data = stdin(MAX_NOTE_BYTES + 1)
    if len(data) > MAX_NOTE_BYTES:
        raise PlaneUsage(f"the note on stdin is over {MAX_NOTE_BYTES} bytes; nothing was written")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlaneUsage(
            f"the note on stdin is not UTF-8 (byte {exc.start}); nothing was written"
        ) from None


def send_to(
    env: Mapping[str, str],
    to: str | None,
    message: str | None,
    stdin: Callable[[int], bytes] = lambda n: b"",
) -> list[dict[str, Any]]:
    """Write one note into this turn's outbox; the receipt says what happens next."""
    from melchior.plane import outbox

    if not to:
        raise PlaneUsage("'send_to' needs --to=NAME (the roster lists the team)")
    if message is None:
        raise PlaneUsage("'send_to' needs --message=TEXT (or --message=- to read it from stdin)")
    text = _read_stdin(stdin) if message == "-" else message
    me = env[ENV_AGENT]
    team = {str(o.get("id")): o for o in _roster(env)["team"] if isinstance(o, dict)}
    if to == me:
        raise _refused("self", f"you are {me}; a note to yourself would wake nobody new")
    if to not in team:
        raise Refused(
            f"there is no agent {to!r} on this plane; the team is {', '.join(team) or 'nobody'} "
            "(melchior tool --verb=team); nothing was written",
            "unknown",
            {"receipt": "refused"},
        )
    path = Path(env[ENV_OUTBOX])
    sent = outbox.recipients(path)
    decision = per_turn(sent, to)
    if not decision.allowed:
        raise _refused(decision.rule, decision.reason, to=to)
    import secrets

    note_id = secrets.token_hex(8)
    try:
        outbox.append(path, to, text, note_id)
    except outbox.OutboxError as exc:
        raise _refused("outbox", str(exc), to=to) from None
    entry = team[to]
    box = written_box(to)
    if not entry.get("may_write"):
        box += (
            f"\n\nThere is no door from you to {to} now, so nothing goes on its own: the plane "
            f"holds the note and asks your operator 'write to {to}? y / n'. You learn in your "
            "next turn whether it was sent."
        )
    return [
        {
            "receipt": "queued",
            "to": to,
            "id": note_id,
            "note": len(sent) + 1,
            "of": PER_TURN,
            "door": entry.get("door", "no-door"),
            "text": box,
        }
    ]


def seat(env: Mapping[str, str]) -> tuple[str, list[Any]]:
    """This agent's id and the team as the roster has it, for a model's system prompt: an
    unreadable roster is an empty team there (the prompt says nobody else), not a refusal."""
    from melchior.plane import roster

    try:
        team = roster.read(Path(env[ENV_ROSTER]))["team"]
    except (ValueError, KeyError):
        team = []
    return env[ENV_AGENT], team


def team(env: Mapping[str, str], line: str | None = None) -> list[dict[str, Any]]:
    """The team as the roster has it; a line that would change it is refused, with the
    exact line the operator would type."""
    me = env[ENV_AGENT]
    if line is not None and line.strip() not in ("", "/team"):
        cmd = team_command(line)
        if cmd is None:
            raise PlaneUsage("'team' reads the team; --message takes a /team line only")
        decision = agent_may_change_team(me, cmd)
        if not decision.allowed:
            raise _refused(decision.rule, decision.reason, line=cmd.line(), at=me)
    roster = _roster(env)
    return [
        {
            "id": o.get("id"),
            "description": o.get("description", ""),
            "may_write": bool(o.get("may_write")),
            "door": o.get("door"),
        }
        for o in roster["team"]
        if isinstance(o, dict)
    ]


def perform(
    verb: str,
    env: Mapping[str, str] | None = None,
    *,
    to: str | None = None,
    message: str | None = None,
    stdin: Callable[[int], bytes] = lambda n: b"",
) -> list[dict[str, Any]]:
    """Run a plane verb for ``melchior tool`` (or the provider runtime's tool calls)."""
    environ = os.environ if env is None else env
    if not in_plane(environ):
        raise Refused(f"'{verb}' exists only inside a plane turn", "setup")
    if verb == "send_to":
        return send_to(environ, to, message, stdin)
    if verb == "team":
        return team(environ, message)
    raise PlaneUsage(f"unknown plane verb {verb!r}")
