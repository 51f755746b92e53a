"""How many messages one turn of a live coding agent may send. Pure.

A coding agent bridged into melchior (``melchior mcp``) takes turns its operator
starts, and every message it sends is work another agent does and pays for. So a turn
may send at most a few (three by default), counted from the turn's start as the
agent's own hook events mark it. Unlike the plane's outbox (``policy.quotas``), a
bridged agent's messages go at once rather than when the turn ends, so two messages
to the same agent in one turn are not merged and are not refused for that; only the
count is. The turn boundary is the caller's business: this module takes numbers.
"""

from __future__ import annotations

from melchior.policy.decision import Decision, allow, refuse

SENDS_PER_TURN = 3
"""Messages one turn may send unless the operator configured another number."""

MAX_SENDS_PER_TURN = 1000
"""The largest configurable quota: a number beyond it is a typo, not a policy."""


def check_limit(limit: int) -> int:
    """A configured quota, refused when it cannot be one (negative, or absurdly large)."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ValueError(f"sends per turn must be a whole number, got {limit!r}")
    if not 0 <= limit <= MAX_SENDS_PER_TURN:
        raise ValueError(f"sends per turn must be between 0 and {MAX_SENDS_PER_TURN}, got {limit}")
    return limit


def may_send(sent_this_turn: int, limit: int = SENDS_PER_TURN, *, turn: int | None) -> Decision:
    """May one more message go, after ``sent_this_turn`` sends in turn number ``turn``?

    ``turn`` None means no turn has been marked (the agent's hooks are not installed):
    there is no boundary to count within, so nothing is refused here and the hop
    budget is the only bound. The refusal says what was counted and when it resets.
    """
    if sent_this_turn < 0:
        raise ValueError("a send count is not negative")
    if turn is None:
        return allow("per-turn", "no turn is marked (no hook events), so no per-turn count")
    if sent_this_turn >= limit:
        return refuse(
            "per-turn",
            f"this turn (turn {turn}) has already sent {sent_this_turn} message(s) and the "
            f"limit is {limit} a turn: each message is work another agent takes on and pays "
            "for. This one was not sent; the count starts again when the operator's next "
            "prompt starts a new turn",
        )
    return allow("per-turn", f"message {sent_this_turn + 1} of at most {limit} this turn")
