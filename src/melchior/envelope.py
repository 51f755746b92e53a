"""One envelope, many transports: a message, what became of it, and the cut-off between them.

A message has the same fields whether it crosses a session socket, a plane outbox file,
the relay or an MCP bridge (ARCHITECTURE §1), so each rule that reads a message — the
hop budget, fencing, the walls — is written once against :class:`Message` rather than
once per transport's dict. What happened to a message is a :class:`Receipt` of one of
five kinds, and a refusal always carries the policy :class:`~melchior.policy.Decision`
that refused it, so a sender learns the rule and the reason whatever the wire.

:class:`Delivery` (and :class:`AsyncDelivery`) is the single seam between "what is
sent" and "how it travels", as a transport's ``handle_request`` is for an HTTP client:
the local socket, the relay, the plane outbox, the receiver and the MCP bridge each
implement ``deliver(message) -> Receipt`` and nothing above them knows which one ran.

No I/O and no heavy imports here: ``melchior tool`` is exec'd per request and reads
this module on its path (NamedTuples, not dataclasses or enums, for that reason).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from melchior.policy.decision import Decision
from melchior.policy.hops import Chain
from melchior.wire.calls import Refused

if TYPE_CHECKING:  # fencing draws random markers; 'status' and 'who' never need it
    from melchior.policy.fence import Fenced

# -- receipts ------------------------------------------------------------------------------

REFUSED = "refused"
"""Not sent: a policy decision said no (the receipt carries it)."""
HELD = "held"
"""Not sent yet: waiting for the operator to say yes (the plane's door question)."""
QUEUED = "queued"
"""Accepted and kept: the recipient is offline or busy and will get it later."""
DELIVERED = "delivered"
"""Handed to the recipient's harness, receiver or agent."""
ANSWERED = "answered"
"""The recipient has answered (the receipt of a question whose answer is in)."""

RECEIPT_KINDS: tuple[str, ...] = (REFUSED, HELD, QUEUED, DELIVERED, ANSWERED)
"""The one list of what can become of a message, in the order a message moves through it."""

TELL_SORTS: tuple[str, ...] = ("attention", "note")
"""Sorts a plain message may carry: wants attention now, or read when free."""
SORTS: tuple[str, ...] = (*TELL_SORTS, "question", "answer", "report", "task")
"""Every sort a message can have; questions, answers, reports and tasks come from their
own verbs (``ask``, ``answer``, ``report``; a relay task), never from a plain tell."""


class Message(NamedTuple):
    """What one agent (or an operator) sends another, whatever carries it.

    ``sender`` and ``recipient`` are the transport's own names for the two ends (a
    session address ``demo/main/beta-nu``, a relay agent ``local/codex``, a plane agent
    ``planner``). ``chain`` is the hop budget it travels on; ``about`` names what it
    answers or asks (a question handle, a task id); ``context`` groups a conversation.
    ``parts`` carries structured content verbatim for transports that have more than
    text (A2A parts); ``text`` is always the readable body.
    """

    sender: str
    recipient: str
    text: str
    sort: str = "attention"
    chain: Chain | None = None
    message_id: str | None = None
    about: str | None = None
    context: str | None = None
    parts: tuple[Any, ...] = ()
    metadata: Mapping[str, Any] | None = None

    def fenced(self, sender_name: str | None = None) -> Fenced:
        """The body fenced as a peer's data for a model to read (the one place it is done
        for every transport): a random marker the body cannot forge, and the sender."""
        from melchior.policy.fence import fence_new

        return fence_new(self.text, sender_name or self.sender, self.sort)


class Receipt(NamedTuple):
    """What became of a message. ``decision`` is set exactly when ``kind`` is refused."""

    kind: str
    message_id: str | None = None
    decision: Decision | None = None
    detail: Mapping[str, Any] | None = None

    @property
    def refused(self) -> bool:
        return self.kind == REFUSED

    def as_dict(self) -> dict[str, Any]:
        """The receipt as a reply entry: ``{"receipt": kind, ...}`` plus rule and reason
        when refused, and the message id when there is one."""
        out: dict[str, Any] = {"receipt": self.kind}
        if self.message_id is not None:
            out["message_id"] = self.message_id
        if self.decision is not None:
            out["rule"] = self.decision.rule
            out["reason"] = self.decision.reason
        if self.detail:
            out.update(self.detail)
        return out


def receipt(kind: str, message_id: str | None = None, **detail: Any) -> Receipt:
    """A receipt of ``kind`` (one of :data:`RECEIPT_KINDS`, checked: a typo is a bug)."""
    if kind not in RECEIPT_KINDS or kind == REFUSED:
        raise ValueError(f"{kind!r} is not a receipt kind (refusals come from refused())")
    return Receipt(kind, message_id, None, detail or None)


def refused_receipt(decision: Decision, message_id: str | None = None) -> Receipt:
    """The receipt of a message a policy decision refused."""
    if decision.allowed:
        raise ValueError(f"decision {decision.rule!r} allowed the message; it is no refusal")
    return Receipt(REFUSED, message_id, decision, None)


# -- refusals on the wire ---------------------------------------------------------------------


def refusal(decision: Decision, *, code: str = "refused", **detail: Any) -> Refused:
    """The one way a refusing :class:`Decision` becomes a wire refusal: the reason is the
    decision's sentence, and the detail names its rule and says ``receipt: refused`` so a
    sender's receipt is truthful on every transport. Raise what this returns."""
    if decision.allowed:
        raise ValueError(f"decision {decision.rule!r} allowed the action; it is no refusal")
    return Refused(decision.reason, code, {"rule": decision.rule, "receipt": REFUSED, **detail})


def deny(rule: str, reason: str, *, code: str | None = None, **detail: Any) -> Refused:
    """A refusal that is not a policy rule but a malformed or impossible request (bad
    arguments, an unknown verb, a harness that is gone), still made a :class:`Decision`
    so that every refusal on every wire names its rule; ``code`` defaults to the rule."""
    return refusal(Decision(False, rule, reason), code=code or rule, **detail)


def receipt_from(entry: Mapping[str, Any]) -> Receipt:
    """The receipt a reply entry carries (``{"receipt": kind, ...}``), checked: a kind
    that is not one of :data:`RECEIPT_KINDS` is a broken peer, not a receipt."""
    kind = entry.get("receipt")
    if not isinstance(kind, str) or kind not in RECEIPT_KINDS:
        raise ValueError(f"{kind!r} is not a receipt kind")
    mid = entry.get("message_id")
    detail = {k: v for k, v in entry.items() if k not in ("receipt", "message_id")}
    if kind == REFUSED:
        rule, reason = detail.pop("rule", "refused"), detail.pop("reason", "refused")
        return Receipt(REFUSED, mid, Decision(False, str(rule), str(reason)), detail or None)
    return Receipt(kind, mid if isinstance(mid, str) else None, None, detail or None)


def check(decision: Decision, *, code: str = "refused") -> Decision:
    """Pass an allowing decision through; raise the wire refusal of a refusing one."""
    if not decision.allowed:
        raise refusal(decision, code=code)
    return decision


# -- the seam under every transport ------------------------------------------------------------


class Delivery(Protocol):
    """How a message travels, for a caller that blocks (``melchior tool``, the plane)."""

    def deliver(self, message: Message) -> Receipt:
        """Send ``message``; return what became of it. A refusal is a receipt, not an
        exception; only a broken transport raises."""
        ...


class AsyncDelivery(Protocol):
    """How a message travels, for a caller on an event loop (serve, relay, receiver, MCP)."""

    async def deliver(self, message: Message) -> Receipt:
        """As :meth:`Delivery.deliver`."""
        ...
