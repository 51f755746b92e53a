"""The vocabulary a model calls, as data, and what each word does.

``melchior tool --verb=…`` is exec'd once per request by a harness on its model's
behalf (argv transport: one JSON reply on stdout, non-zero exit when refused). The
vocabulary leaves as JSON Schema (:func:`schema`) so that no harness type enters
melchior: whoever hosts a model turns that data into whatever a tool is there.

Every verb checks the walls on the sender's side before anything is sent (and the
recipient checks again); every send returns a receipt that says what really
happened, and an unknown or stale recipient is an error, never a success.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from melchior import names
from melchior.envelope import (
    ANSWERED,
    DELIVERED,
    REFUSED,
    TELL_SORTS,
    Message,
    Receipt,
    check,
    deny,
    receipt,
    receipt_from,
    refusal,
    refused_receipt,
)
from melchior.policy.decision import Decision
from melchior.policy.hops import Chain, check_hop, first_hop, next_hop
from melchior.policy.local import callee_answers, minter_ends
from melchior.policy.walls import Talk, between
from melchior.session.identity import Identity, for_tool
from melchior.session.registry import Registry
from melchior.wire.calls import Refused

ENV_CHAIN = "MAGI_MELCHIOR_CHAIN"
"""The chain ``{"chain","hop","path"}`` of the message the session is answering, if any."""


class Param(NamedTuple):
    name: str
    description: str
    type: str = "string"
    enum: tuple[str, ...] = ()


class ToolVerb(NamedTuple):
    name: str
    description: str
    required: tuple[Param, ...] = ()
    optional: tuple[Param, ...] = ()
    needs_identity: bool = True


WHO = Param("who", "the id of the session to reach, as 'who' lists it (e.g. 'beta-nu')")
MESSAGE = Param("message", "the text to send")
ABOUT_Q = Param("about", "a question handle <callee-id>@<message-id>, as 'ask' returned it")
CHAIN = Param(
    "chain",
    "JSON {chain, hop, path} of the message being answered, so the hop count carries on",
)

VOCABULARY: tuple[ToolVerb, ...] = (
    ToolVerb("who", "list the sessions you can reach from here", needs_identity=False),
    ToolVerb(
        "status",
        "what a session is doing (busy, working_for, waiting); without who: yourself",
        optional=(WHO,),
        needs_identity=False,
    ),
    ToolVerb(
        "tell",
        "send a message; the receipt says delivered, queued (recipient busy) or refused",
        required=(WHO, MESSAGE),
        optional=(
            Param(
                "sort",
                "attention (default): wants the recipient's attention; note: read when free",
                enum=TELL_SORTS,
            ),
            CHAIN,
        ),
        needs_identity=False,
    ),
    ToolVerb(
        "ask",
        "ask a question; returns the handle <id>@<message-id> to follow with task",
        required=(WHO, MESSAGE),
        optional=(CHAIN,),
    ),
    ToolVerb("answer", "answer a question that was asked of you", required=(ABOUT_Q, MESSAGE)),
    ToolVerb(
        "task",
        "follow a question: pending, or answered with the answer; a child's bare id gives "
        "its status",
        required=(
            Param("about", "<id>@<message-id> from ask, or the bare id of a child of yours"),
        ),
        optional=(WHO,),
    ),
    ToolVerb(
        "report",
        "store your report (message, or about='-' for stdin) and notify your parent; or read "
        "a report: who for pages, about='json' for the whole body, revision and digest",
        optional=(
            MESSAGE,
            Param("about", "'-': read the body from stdin; 'json': read the whole report"),
            WHO,
            Param("page", "which page to read (from 1)", type="integer"),
        ),
        needs_identity=False,
    ),
    ToolVerb("end", "end a session you started (only one you minted with fork)", required=(WHO,)),
)

BY_NAME: dict[str, ToolVerb] = {v.name: v for v in VOCABULARY}

# -- the plane's verbs: only inside a plane turn (melchior.plane.verbs) -----------------------

PLANE_ENV = "MELCHIOR_PLANE_OUTBOX"
"""Set (with the roster and the agent's id) only in a plane turn; see melchior.plane.verbs."""


class PlaneVerbs(Protocol):
    """The plane's side of its two verbs: :mod:`melchior.plane.verbs` is one.

    The plane is a layer above the vocabulary, so it is handed to :func:`perform` by
    whoever runs a request (``melchior tool``, the MCP bridge), never imported here.
    """

    @property
    def PlaneUsage(self) -> type[Exception]:
        """Raised for a malformed plane request (a :class:`Usage` here)."""
        ...

    def perform(
        self,
        verb: str,
        env: Mapping[str, str] | None = None,
        *,
        to: str | None = None,
        message: str | None = None,
        stdin: Callable[[int], bytes] = ...,
    ) -> list[Any]:
        """Run ``send_to`` or ``team`` in the plane turn ``env`` names."""
        ...


PLANE_VOCABULARY: tuple[ToolVerb, ...] = (
    ToolVerb(
        "send_to",
        "leave a note for another agent on this plane; it goes when this turn ends and wakes "
        "that agent; its answer comes back as a turn of your own (three a turn, once each)",
        required=(
            Param("to", "the agent's id, as the team lists it"),
            Param("message", "the whole request in one note ('-': read it from stdin)"),
        ),
        needs_identity=False,
    ),
    ToolVerb(
        "team",
        "who there is on this plane and whom you may write to now (read only: the operator "
        "opens doors)",
        optional=(Param("message", "a /team line: refused, with the line your operator types"),),
        needs_identity=False,
    ),
)


def vocabulary(env: Mapping[str, str] | None = None) -> tuple[ToolVerb, ...]:
    """The verbs this caller has: the plane's two are added only inside a plane turn."""
    environ = os.environ if env is None else env
    return (*VOCABULARY, *PLANE_VOCABULARY) if environ.get(PLANE_ENV) else VOCABULARY


def _param_schema(p: Param) -> dict[str, Any]:
    out: dict[str, Any] = {"type": p.type, "description": p.description}
    if p.enum:
        out["enum"] = list(p.enum)
    if p.type == "integer":
        out["minimum"] = 1
    return out


def verb_schema(v: ToolVerb) -> dict[str, Any]:
    props: dict[str, Any] = {"verb": {"const": v.name}}
    for p in (*v.required, *v.optional):
        props[p.name] = _param_schema(p)
    return {
        "title": v.name,
        "description": v.description,
        "type": "object",
        "properties": props,
        "required": ["verb", *(p.name for p in v.required)],
        "additionalProperties": False,
    }


def schema(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The whole vocabulary as one JSON Schema document (draft 2020-12). Data only."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:melchior:tool",
        "title": "melchior tool",
        "description": (
            "One request to 'melchior tool': pass each property as --NAME=VALUE. The reply is "
            'one JSON object {"ok","family","n","result"} (or "error" with a reason).'
        ),
        "oneOf": [verb_schema(v) for v in vocabulary(env)],
    }


# -- running a verb -----------------------------------------------------------------------


class Usage(Exception):
    """The request itself is malformed (exit 2), as opposed to refused (exit 1)."""


class Request(NamedTuple):
    verb: str
    who: str | None = None
    message: str | None = None
    sort: str | None = None
    about: str | None = None
    page: int | None = None
    chain: str | None = None
    stdin: Callable[[int], bytes] = lambda n: b""
    to: str | None = None


class Context:
    """What a verb needs: who is calling, the registry, and the wall setting."""

    def __init__(self, me: Identity | None, reg: Registry, talk: Talk, env: Mapping[str, str]):
        self.me = me
        self.reg = reg
        self.talk = talk
        self.env = env

    @property
    def sender(self) -> str | None:
        return self.me.id if self.me is not None else None

    def need_me(self, verb: str) -> Identity:
        if self.me is None:
            raise deny(
                "anonymous",
                f"'{verb}' needs to know which session you are: {names.ENV_ID} is not set",
            )
        if not self.reg.is_listed(self.me.id):
            raise deny(
                "not-serving",
                f"your session {self.me.id} is not listening in project {self.reg.project!r}; "
                "is its 'melchior serve' running?",
            )
        return self.me

    def reach(self, who: str | None, *, verb: str) -> str:
        """Check ``who`` exists and that the walls let us reach it; return its id."""
        if who is None:
            raise Usage(f"'{verb}' needs --who=<id>")
        try:
            names.check_id(who)
        except names.NamingError as exc:
            raise Usage(str(exc)) from None
        if not self.reg.is_listed(who):
            raise deny(
                "unknown",
                f"no session {who} in project {self.reg.project!r}; 'melchior tool --verb=who' "
                "lists the ones you can reach",
            )
        if self.me is not None:
            me = self.reg.session(self.me.id)
            target = self.reg.session(who)
            check(between(me, target, self.reg.ancestry_tree(me, target), self.talk))
        return who

    def call(self, who: str, verb: str, args: list[Any], **extra: Any) -> list[Any]:
        # Imported here: 'who', reading reports and --schema never open a socket.
        from melchior.session.client import Unreachable, call_once

        try:
            return call_once(self.reg.path(who), verb, args, sender=self.sender, who=who, **extra)
        except Unreachable as exc:
            raise deny(exc.code, exc.reason) from None

    def message(
        self, who: str | None, text: str, sort: str, chain: Chain, about: str | None = None
    ) -> Message:
        """A message from this session to ``who`` (checked to be an id), on ``chain``."""
        if who is None:
            raise Usage(f"'{_VERB_OF.get(sort, 'tell')}' needs --who=<id>")
        try:
            names.check_id(who)
        except names.NamingError as exc:
            raise Usage(str(exc)) from None
        sender = self.sender or names.ANONYMOUS
        return Message(sender, who, text, sort, chain, about=about)

    def chain(self, raw: str | None) -> Chain:
        """The chain a new message travels on: the next hop of what we are answering."""
        me = self.sender or names.ANONYMOUS
        text = raw if raw is not None else self.env.get(ENV_CHAIN)
        if not text:
            return first_hop(me)
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("it must be a JSON object")
            received = Chain.from_dict(data)
        except ValueError as exc:
            raise Usage(
                f"--chain / {ENV_CHAIN} is not a chain {{chain, hop, path}}: {exc}"
            ) from None
        return self.next_of(received)

    def next_of(self, received: Chain) -> Chain:
        """The chain of our message in answer to ``received``: one hop further, if allowed."""
        chain = next_hop(received, self.sender or names.ANONYMOUS)
        check(check_hop(chain))
        return chain


class SocketDelivery:
    """The local socket as an :class:`~melchior.envelope.Delivery`: the walls are checked on
    the sender's side before anything is sent (the recipient's serve checks again), and the
    receipt is the recipient's own — ``delivered``, ``queued`` (its harness is busy) or a
    refusal naming its rule. The sort says which socket verb carries the message."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def deliver(self, message: Message) -> Receipt:
        chain = {} if message.chain is None else {"chain": message.chain.as_dict()}
        try:
            who = self.ctx.reach(message.recipient, verb=_VERB_OF.get(message.sort, "tell"))
            if message.sort == "question":
                result = self.ctx.call(who, "ask", [message.text], **chain)
            elif message.sort == "answer":
                result = self.ctx.call(who, "answer", [message.about, message.text], **chain)
            else:
                result = self.ctx.call(who, "tell", [message.text, message.sort], **chain)
        except Refused as exc:
            return Receipt(REFUSED, message.message_id, refused_decision(exc), {"code": exc.code})
        if not result or not isinstance(result[0], dict):
            raise deny("bad-reply", f"{message.recipient} answered without a receipt")
        try:
            return receipt_from(result[0])
        except ValueError as exc:
            raise deny("bad-reply", f"{message.recipient} sent a broken receipt: {exc}") from None


_VERB_OF = {"question": "ask", "answer": "answer"}


def refused_decision(exc: Refused) -> Decision:
    """The decision a wire refusal carries (its rule, or its code when it names none)."""
    return Decision(False, str(exc.detail.get("rule", exc.code)), exc.reason)


def delivered(got: Receipt) -> Receipt:
    """A receipt for the tool's reply; a refused one becomes the tool's refusal (exit 1)."""
    if got.decision is not None:
        code = str((got.detail or {}).get("code", "refused"))
        raise refusal(got.decision, code=code)
    return got


def _handle(about: str) -> tuple[str, str]:
    try:
        return names.split_handle(about)
    except names.NamingError as exc:
        raise Usage(str(exc)) from None


def verb_who(ctx: Context, req: Request) -> list[Any]:
    """The sessions the walls let us reach that answer a connect right now.

    An entry is only a claim (a killed serve leaves its socket behind), so each one
    the walls allow is probed; a stale one is removed and not listed, which keeps
    'who' truthful without a call to each session.
    """
    tree = ctx.reg.tree()
    out: list[dict[str, Any]] = []
    for sid in ctx.reg.listed():
        node = tree.get(sid) or ctx.reg.session(sid)
        if ctx.me is not None:
            if sid == ctx.me.id:
                continue
            me = tree.get(ctx.me.id) or ctx.me.session()
            decision = between(me, node, tree, ctx.talk)
            if not decision.allowed:
                continue
            rule = decision.rule
        else:
            rule = "operator"
        out.append(
            {
                "id": sid,
                "address": str(names.Address(node.project, node.role, sid)),
                "role": node.role,
                "parent": node.parent,
                "rule": rule,
            }
        )
    answering = ctx.reg.answering([str(entry["id"]) for entry in out])
    return [entry for entry in out if entry["id"] in answering]


def verb_status(ctx: Context, req: Request) -> list[Any]:
    if req.who is None:
        me = ctx.need_me("status")
        return ctx.call(me.id, "status", [])
    who = ctx.reach(req.who, verb="status")
    return ctx.call(who, "status", [])


def verb_tell(ctx: Context, req: Request) -> list[Any]:
    if req.message is None:
        raise Usage("'tell' needs --message=<text>")
    if req.sort is not None and req.sort not in TELL_SORTS:
        # Malformed, so exit 2 before anything is sent (the recipient would refuse it too).
        raise Usage(
            f"--sort={req.sort!r} is not one of {', '.join(TELL_SORTS)}; questions go "
            "through 'ask' and reports through 'report'"
        )
    chain = ctx.chain(req.chain)
    note = ctx.message(req.who, req.message, req.sort or "attention", chain)
    got = delivered(SocketDelivery(ctx).deliver(note))
    return [{**got.as_dict(), "who": note.recipient, **chain.as_dict()}]


def verb_ask(ctx: Context, req: Request) -> list[Any]:
    ctx.need_me("ask")
    if req.message is None:
        raise Usage("'ask' needs --message=<text>")
    chain = ctx.chain(req.chain)
    question = ctx.message(req.who, req.message, "question", chain)
    got = delivered(SocketDelivery(ctx).deliver(question))
    return [{**got.as_dict(), "who": question.recipient}]


def verb_answer(ctx: Context, req: Request) -> list[Any]:
    me = ctx.need_me("answer")
    if req.about is None or req.message is None:
        raise Usage("'answer' needs --about=<id@message-id> and --message=<text>")
    callee, _mid = _handle(req.about)
    check(callee_answers(req.about, callee, me.id))
    known = ctx.call(me.id, "task", [req.about])
    asked = known[0] if known and isinstance(known[0], dict) else {}
    asker = asked.get("asker")
    if not isinstance(asker, str):
        raise deny("unknown-task", f"no one is waiting for an answer to {req.about}")
    # The answer travels one hop further than the question did, on the same chain.
    question = asked.get("chain")
    chain = (
        ctx.next_of(Chain.from_dict(question))
        if isinstance(question, dict) and req.chain is None
        else ctx.chain(req.chain)
    )
    reply = ctx.message(asker, req.message, "answer", chain, about=req.about)
    got = delivered(SocketDelivery(ctx).deliver(reply))
    return [{**got.as_dict(), "about": req.about, "who": asker, **chain.as_dict()}]


def verb_task(ctx: Context, req: Request) -> list[Any]:
    me = ctx.need_me("task")
    if req.about is None:
        raise Usage("'task' needs --about=<id@message-id> (or a child's bare id)")
    if "@" not in req.about:
        child = req.about
        if (
            names.is_id(child)
            and ctx.reg.parent_of(child) == me.id
            and (req.who is None or req.who == child)
        ):
            return ctx.call(ctx.reach(child, verb="task"), "status", [])
        raise Usage(
            f"{req.about!r} is not a task handle <id>@<message-id> from ask, nor the id of a "
            "child of yours; poll a session with --verb=status --who=<id>"
        )
    callee, _mid = _handle(req.about)
    if req.who is not None and req.who != callee:
        raise Usage(f"{req.about} was asked of {callee}, not of {req.who}")
    try:
        mine = ctx.call(me.id, "task", [req.about])
    except Refused as exc:
        if exc.code != "unknown-task":
            raise
    else:
        if mine and mine[0].get("state") == "answered":
            return [{**mine[0], **receipt(ANSWERED).as_dict()}]
    ctx.reach(callee, verb="task")
    theirs = ctx.call(callee, "task", [req.about])
    return [{"about": req.about, "state": "pending", **receipt(DELIVERED).as_dict(), **theirs[0]}]


def verb_report(ctx: Context, req: Request) -> list[Any]:
    from melchior.session import reports

    if req.message is not None or req.about == "-":
        return _submit_report(ctx, req)
    if req.about not in (None, "json"):
        raise Usage("report reads with --about=json (whole body) or submits with --about=-")
    who = ctx.need_me("report").id if req.who is None else ctx.reach(req.who, verb="report")
    report = reports.read(ctx.reg, who)
    if report is None:
        raise deny("no-report", f"{who} has not stored a report")
    try:
        return [report.whole() if req.about == "json" else report.page(req.page or 1)]
    except reports.ReportError as exc:
        raise Usage(str(exc)) from None


def _submit_report(ctx: Context, req: Request) -> list[Any]:
    from melchior.session import reports

    me = ctx.need_me("report")
    if req.message is not None and req.about == "-":
        raise Usage("give the report as --message or on stdin with --about=-, not both")
    try:
        text = (
            reports.decode_body(req.stdin(reports.MAX_REPORT + 1))
            if req.about == "-"
            else req.message or ""
        )
        report = reports.submit(ctx.reg, me.id, text)
    except reports.ReportError as exc:
        raise deny("bad-report", str(exc)) from None
    notified: dict[str, Any] | None = None
    if me.parent is not None:
        try:
            notified = ctx.call(me.parent, "report", [report.revision, report.sha256])[0]
        except Refused as exc:
            notified = {**refused_receipt(refused_decision(exc)).as_dict(), "code": exc.code}
    return [
        {
            "who": me.id,
            "revision": report.revision,
            "sha256": report.sha256,
            "stored": True,
            "parent": me.parent,
            "notified": notified,
        }
    ]


def verb_end(ctx: Context, req: Request) -> list[Any]:
    me = ctx.need_me("end")
    if req.who is None:
        raise Usage("'end' needs --who=<id>")
    minted = ctx.reg.minted(me.id, req.who)
    check(minter_ends(me.id, req.who, minted is not None))
    assert minted is not None
    who = ctx.reach(req.who, verb="end")
    result = ctx.call(who, "end", [minted.token])
    return [{**r, "who": who} for r in result]


HANDLERS: dict[str, Callable[[Context, Request], list[Any]]] = {
    "who": verb_who,
    "status": verb_status,
    "tell": verb_tell,
    "ask": verb_ask,
    "answer": verb_answer,
    "task": verb_task,
    "report": verb_report,
    "end": verb_end,
}


def context(env: Mapping[str, str], cwd: Path) -> Context:
    from melchior.session.config import read_talk

    me, reg = for_tool(env, cwd)
    return Context(me, reg, read_talk(reg.project, env), env)


def perform(
    req: Request, env: Mapping[str, str] | None = None, *, plane: PlaneVerbs | None = None
) -> list[Any]:
    """Run one request; raises Usage (malformed) or Refused (refused, with a reason).

    ``plane`` carries the plane's verbs out inside a plane turn; without it they are
    unknown verbs here."""
    from melchior.session.config import ConfigError
    from melchior.session.identity import IdentityError

    for flag in ("who", "message", "sort", "about", "chain", "to"):
        value = getattr(req, flag)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise Usage(
                    f"--{flag} is not valid UTF-8 (bad byte at character {exc.start}); "
                    "nothing was sent"
                ) from None
    environ = os.environ if env is None else env
    plane_verb = any(v.name == req.verb for v in PLANE_VOCABULARY)
    if plane is not None and environ.get(PLANE_ENV) and plane_verb:
        try:
            return plane.perform(req.verb, environ, to=req.to, message=req.message, stdin=req.stdin)
        except plane.PlaneUsage as exc:
            raise Usage(str(exc)) from None
    handler = HANDLERS.get(req.verb)
    if handler is None:
        raise Usage(f"unknown verb {req.verb!r}; the verbs are {', '.join(HANDLERS)}")
    try:
        ctx = context(environ, Path.cwd())
    except (names.NamingError, IdentityError, ConfigError) as exc:
        raise deny("setup", str(exc)) from None
    return handler(ctx, req)
