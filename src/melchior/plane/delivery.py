"""The plane's outbox as one more :class:`~melchior.envelope.Delivery`.

After a turn each note in its outbox becomes a :class:`~melchior.envelope.Message` on
its hop chain and goes through :meth:`TurnDelivery.deliver`, which returns a truthful
:class:`~melchior.envelope.Receipt`:

- ``refused`` with the policy :class:`~melchior.policy.Decision` — the per-turn quota
  (``once-each``, ``per-turn``), an unknown agent, the hop limit (``hop-limit``: both
  agents are left alone), the recipient's spent ceiling (``ceiling``);
- ``held`` — no door: nothing goes, the note waits for the operator's ``y / n`` on the
  sender's pane;
- ``delivered`` — the recipient's next turn is queued with the note.

Every outcome is written to the message log and told to the sender at the start of its
next turn (a notice wakes nobody), and the console hears it as an event. The order of
the checks matters and is the seed's: a note past the hop limit never raises a question.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from typing import Any, NamedTuple

from melchior.envelope import DELIVERED, HELD, Message, Receipt, receipt, refused_receipt
from melchior.plane.config import PlaneConfig
from melchior.plane.state import Held, State
from melchior.policy.decision import Decision, refuse
from melchior.policy.doors import door
from melchior.policy.hops import check_hop
from melchior.policy.quotas import per_turn


class Event(NamedTuple):
    """Something the plane tells whoever watches it (the console, the headless printer).

    ``kind``: ``operator``, ``webhook``, ``turn`` (one starts), ``progress`` (what it
    streams), ``done`` (its final output), ``answer`` and ``note`` (receipts), ``question``
    (a held note's ``y / n``), ``team``, ``error``, ``state`` (running, idle).
    """

    agent: str
    kind: str
    text: str
    data: dict[str, Any] | None = None


Emit = Callable[[Event], None]


def ceiling_refusal(config: PlaneConfig, state: State, agent: str) -> Decision | None:
    """The refusal for waking ``agent`` when its ceiling is spent, else None."""
    cfg = config.by_id[agent]
    why = cfg.ceiling.reached(*state.spent(agent))
    if why is None:
        return None
    return refuse(
        "ceiling",
        f"{agent} has reached its ceiling: {why}. Nothing more wakes it until the operator "
        "raises the ceiling in the plane's configuration",
    )


class TurnDelivery:
    """Delivers the notes of one finished turn of ``sender`` (implements ``Delivery``)."""

    def __init__(
        self,
        config: PlaneConfig,
        state: State,
        emit: Emit,
        *,
        sender: str,
        turn: int,
        mentioned: Set[str],
    ) -> None:
        self.config = config
        self.state = state
        self.emit = emit
        self.sender = sender
        self.turn = turn
        self.mentioned = frozenset(mentioned)
        self.sent: list[str] = []
        """Recipients of the notes that went this turn (delivered or held), in order."""

    def _refused(self, message: Message, decision: Decision) -> Receipt:
        self.state.log(
            "note",
            sender=message.sender,
            recipient=message.recipient,
            receipt="refused",
            rule=decision.rule,
            reason=decision.reason,
            chain=message.chain,
            message_id=message.message_id,
            turn=self.turn,
            text=message.text,
        )
        self.state.notice(
            message.sender,
            f"Your note to {message.recipient} was not sent ({decision.rule}): {decision.reason}",
        )
        self.emit(
            Event(
                message.sender,
                "note",
                f"note to {message.recipient} refused ({decision.rule}): {decision.reason}",
                {"receipt": "refused", "rule": decision.rule, "to": message.recipient},
            )
        )
        return refused_receipt(decision, message.message_id)

    def deliver(self, message: Message) -> Receipt:
        """Judge and carry one note; see the module docstring for the order of the checks."""
        to = message.recipient
        quota = per_turn(self.sent, to)
        if not quota.allowed:
            return self._refused(message, quota)
        if to not in self.config.by_id:
            return self._refused(
                message,
                refuse(
                    "unknown-agent",
                    f"there is no agent {to!r} on this plane; the agents are "
                    f"{', '.join(self.config.ids)}",
                ),
            )
        if message.chain is None:
            raise ValueError("a plane note travels on a hop chain")
        hop = check_hop(message.chain)
        if not hop.allowed:
            return self._refused(message, hop)
        d = door(
            self.sender,
            to,
            talks_to=set(self.config.by_id[self.sender].talks_to),
            opened=self.state.opened(self.sender),
            mentioned=self.mentioned,
        )
        if d.rule == "self":
            return self._refused(message, d)
        if not d.allowed:
            self.sent.append(to)  # held is not refused: it may still go, so it counts
            return self._hold(message)
        spent = ceiling_refusal(self.config, self.state, to)
        if spent is not None:
            return self._refused(message, spent)
        # Only a note that went counts toward the three (and the refusal names only
        # those): a refused one cost nobody a turn.
        self.sent.append(to)
        return carry(self.state, self.emit, message, rule=d.rule, turn=self.turn)

    def _hold(self, message: Message) -> Receipt:
        assert message.chain is not None
        assert message.message_id is not None
        with self.state.tx():
            held = self.state.hold(
                message.sender, message.recipient, message.text, message.chain, message.message_id
            )
            self.state.log(
                "note",
                sender=message.sender,
                recipient=message.recipient,
                receipt=HELD,
                rule="no-door",
                reason=f"waiting for the operator: write to {message.recipient}? y / n",
                chain=message.chain,
                message_id=message.message_id,
                turn=self.turn,
                text=message.text,
            )
        self.emit(
            Event(
                message.sender,
                "question",
                f"write to {message.recipient}? y / n",
                {"held": held, "to": message.recipient},
            )
        )
        return receipt(HELD, message.message_id, held=held)


def carry(
    state: State, emit: Emit, message: Message, *, rule: str, turn: int | None = None
) -> Receipt:
    """Queue the recipient's turn with ``message`` (a note or an answer) and record it."""
    kind = "answer" if message.sort == "answer" else "note"
    with state.tx():
        state.enqueue(
            message.recipient,
            kind,
            message.text,
            sender=message.sender,
            chain=message.chain,
            message_id=message.message_id,
        )
        state.log(
            kind,
            sender=message.sender,
            recipient=message.recipient,
            receipt=DELIVERED,
            rule=rule,
            chain=message.chain,
            message_id=message.message_id,
            turn=turn,
            text=message.text,
        )
        if kind == "note":
            state.notice(
                message.sender,
                f"Your note to {message.recipient} was delivered (hop "
                f"{message.chain.hop if message.chain else '?'}); its answer comes as a turn.",
            )
    hop = message.chain.hop if message.chain else None
    emit(
        Event(
            message.sender,
            kind,
            f"{kind} to {message.recipient} delivered (hop {hop}, {rule})",
            {"receipt": DELIVERED, "to": message.recipient, "rule": rule, "hop": hop},
        )
    )
    emit(
        Event(
            message.recipient,
            kind,
            f"{kind} from {message.sender} arrived (hop {hop}); it wakes {message.recipient}",
            {"receipt": DELIVERED, "from": message.sender, "hop": hop},
        )
    )
    return receipt(DELIVERED, message.message_id, rule=rule)


def release(
    config: PlaneConfig, state: State, emit: Emit, held_id: int, key: str
) -> Receipt | None:
    """The operator's key for a held note: ``y`` sends it and leaves the door open; every
    other key is no. None when the note is no longer waiting (answered already)."""
    yes = key == "y"
    waiting = {h.id: h for h in state.waiting()}
    held: Held | None = waiting.get(held_id)
    if held is None:
        return None
    message = Message(
        held.sender,
        held.recipient,
        held.text,
        sort="note",
        chain=held.chain,
        message_id=held.message_id,
    )
    spent = ceiling_refusal(config, state, held.recipient) if yes else None
    with state.tx():
        if state.settle_held(held_id, "sent" if yes and spent is None else "declined") is None:
            return None
        if yes and spent is None:
            state.open_door(held.sender, held.recipient, "y")
            return carry(state, emit, message, rule="operator-yes")
        decision = spent or refuse(
            "operator-no",
            f"the operator answered no to 'write to {held.recipient}? y / n'",
        )
        state.log(
            "note",
            sender=held.sender,
            recipient=held.recipient,
            receipt="refused",
            rule=decision.rule,
            reason=decision.reason,
            chain=held.chain,
            message_id=held.message_id,
        )
        state.notice(
            held.sender,
            f"Your note to {held.recipient} was not sent ({decision.rule}): {decision.reason}",
        )
    emit(
        Event(
            held.sender,
            "note",
            f"note to {held.recipient} not sent ({decision.rule})",
            {"receipt": "refused", "rule": decision.rule, "to": held.recipient},
        )
    )
    return refused_receipt(decision, held.message_id)
