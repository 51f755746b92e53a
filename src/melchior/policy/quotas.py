"""How many notes one turn may send: three to a turn, and once each. Pure.

Every note is a turn somebody else takes and pays for out of their own ceiling, so a
turn that could write to forty agents would be forty turns nobody asked for. Two notes
to the same agent would arrive in one turn anyway, so the second is refused with the
advice to put the whole of it in one (seed 001). The same rule serves any per-turn
sender (the plane's outbox, an MCP bridge's turn): it takes the recipients already
sent to this turn and nothing about the transport.
"""

from __future__ import annotations

from collections.abc import Sequence

from melchior.policy.decision import Decision, allow, refuse

PER_TURN = 3
"""Notes one turn may send."""


def per_turn(sent_so_far: Sequence[str], recipient: str, limit: int = PER_TURN) -> Decision:
    """May one more note go to ``recipient``, after ``sent_so_far`` this turn?

    ``once-each`` is judged first: a second note to the same agent is refused even when
    the turn is also full, because its advice (put it all in one) is the useful one.
    """
    if limit < 0:
        raise ValueError("a per-turn limit is not negative")
    if recipient in sent_so_far:
        return refuse(
            "once-each",
            f"this turn already wrote to {recipient}; two notes would arrive in one turn anyway, "
            "so put all of it in one note (this one was not sent)",
        )
    if len(sent_so_far) >= limit:
        return refuse(
            "per-turn",
            f"{limit} notes a turn: this turn already wrote to {', '.join(sent_so_far)}. Each "
            "note is a turn another agent takes and pays for; this one was not sent",
        )
    return allow("per-turn", f"note {len(sent_so_far) + 1} of at most {limit} this turn")
