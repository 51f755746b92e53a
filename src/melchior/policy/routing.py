"""Where a turn's answer goes: by where the turn came from, never by what it says. Pure.

From a turn's side a peer is one more thing that can wake it, so the answer goes back
down the channel the turn came in on (seed 001): a turn a peer's note woke answers
that peer, as the peer's next turn, one hop further on the note's chain; a turn an
operator, a webhook or an answer woke shows its answer where it came from (the pane,
the webhook's log) and wakes nobody. Nothing in the payload is read here — the text is
not even an argument — so a body cannot steer its own reply, exactly as an answer to a
webhook cannot be steered into Telegram by anything in the payload.
"""

from __future__ import annotations

from typing import NamedTuple

from melchior.policy.decision import Decision, allow, refuse
from melchior.policy.hops import Chain, check_hop, next_hop

OPERATOR = "operator"
WEBHOOK = "webhook"
NOTE = "note"
ANSWER = "answer"
ORIGIN_KINDS: tuple[str, ...] = (OPERATOR, WEBHOOK, NOTE, ANSWER)


class Origin(NamedTuple):
    """What woke a turn: its kind, who sent it (for a note or an answer), its chain."""

    kind: str
    sender: str | None = None
    chain: Chain | None = None


class Route(NamedTuple):
    """Where an answer goes: ``to`` an agent (waking it) on ``chain``, or nowhere but the
    origin's own place (``to`` None, ``place`` naming it)."""

    place: str
    to: str | None = None
    chain: Chain | None = None


def route_answer(origin: Origin, answerer: str) -> tuple[Route, Decision]:
    """The route of the answer ``answerer`` gave in the turn ``origin`` woke.

    A note's answer goes to the note's sender one hop further; past the hop limit it is
    refused and both agents are left alone (the answer stays in the answerer's pane).
    """
    if origin.kind not in ORIGIN_KINDS:
        raise ValueError(f"unknown origin kind {origin.kind!r}")
    if origin.kind != NOTE:
        return Route(origin.kind), allow("origin", f"the answer stays with the {origin.kind}")
    if origin.sender is None or origin.chain is None:
        raise ValueError("a note's origin names its sender and chain")
    if origin.sender == answerer:
        return Route("pane"), refuse("self", f"{answerer} cannot answer itself")
    chain = next_hop(origin.chain, answerer)
    decision = check_hop(chain)
    if not decision.allowed:
        return Route("pane", None, chain), decision
    return Route("agent", origin.sender, chain), allow(
        "origin", f"{answerer} was woken by {origin.sender}'s note; the answer goes back to it"
    )


def note_chain(origin: Origin, sender: str) -> Chain:
    """The chain a note written in the turn ``origin`` woke travels on.

    An operator's line (or a webhook's) starts a new count at hop 1; a note written in a
    turn a note or an answer woke is one hop further than what woke it.
    """
    from melchior.policy.hops import first_hop

    if origin.chain is None or origin.kind in (OPERATOR, WEBHOOK):
        return first_hop(sender)
    return next_hop(origin.chain, sender)
