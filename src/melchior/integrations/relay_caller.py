"""The bridge as a relay caller: agents on other machines, through the relay's A2A entry.

With a mellan *agent* credential configured (``--as AGENT`` from ``mellan join``, or
``$MELLAN_TOKEN``, or the one credential stored; the precedence every mellan client
follows, :func:`melchior.mellan.credentials.agent_credential`), the bridge offers the
agent the relay too: which remote agents and capabilities are granted to it, send
(returning at once, waiting, or streaming progress), get, and cancel. It speaks to the
relay through :class:`melchior.mellan.client.caller.AsyncRelayClient`, the client
``mellan send`` uses too: one error decoder, one SSE parser; what is left here is the
tools' shapes, the hop chain and turning a relay's refusal into the bridge's rule.

The hop chain crosses with the task: a send made while the model holds peer text
continues that text's chain (one hop further, this agent appended to the path) in the
task's metadata under :data:`melchior.policy.hops.HOPS_URI`, so a loop through local
sessions and remote agents is bounded by the same four hops. Each send is a
:class:`~melchior.envelope.Receipt`: ``queued`` (accepted, not finished), ``answered``
(completed or asking back), ``delivered`` (it ran and failed or was cancelled), or
``refused`` with the relay's reason.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple
from urllib.parse import quote

from melchior.envelope import Message, Receipt, refused_receipt
from melchior.integrations.tools import ToolSpec
from melchior.mellan.client.caller import AsyncRelayClient
from melchior.mellan.client.errors import BAD_ANSWER, BAD_ARGS, SEALED, RelayError
from melchior.mellan.client.views import TaskView, describe, receipt_of
from melchior.mellan.credentials import CredentialError, agent_credential
from melchior.mellan.rawjson import encode
from melchior.mellan.transport import ClientTls
from melchior.policy.decision import Decision, refuse
from melchior.policy.hops import HOPS_URI, Chain, check_hop, next_hop

__all__ = ["TOOLS", "Credential", "RelayCaller", "RelayRefused", "find_credential", "receipt_of"]

MODES = ("return", "wait", "stream")
MAX_EVENTS = 1000
"""Stream events kept for one send's answer; later ones are counted, not kept."""
MAX_AGENTS = 64
"""Receivers whose cards ``relay_agents`` reads (each a request)."""
STREAM_TIMEOUT = 600.0
"""Longest a streamed send is followed before the tool returns what it has (the task
carries on at the relay; follow it with relay_get)."""

Progress = Callable[[str], Awaitable[None]]

_AGENT = {"type": "string", "description": "the remote agent's id, as relay_agents lists it"}
_TASK = {"type": "string", "description": "the task id a send returned"}
TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "relay_agents",
        "list the agents on other machines you may send tasks to through the mellan relay, "
        "with the capabilities granted to you on each",
        {"type": "object", "properties": {}, "additionalProperties": False},
    ),
    ToolSpec(
        "relay_send",
        "send a task to an agent on another machine through the relay; mode 'return' "
        "(default: the task id at once, it waits queued if that agent is offline), 'wait' "
        "(until it completes, fails or asks back) or 'stream' (progress as it happens)",
        {
            "type": "object",
            "properties": {
                "agent": _AGENT,
                "message": {"type": "string", "description": "what you ask"},
                "capability": {"type": "string", "description": "which granted capability"},
                "mode": {"type": "string", "enum": list(MODES)},
                "task": {"type": "string", "description": "answer this task that asked back"},
                "context": {"type": "string", "description": "continue this conversation"},
                "seal": {
                    "type": "boolean",
                    "description": "encrypt the message to the agent's pinned key so the relay "
                    "cannot read it (needs capability; not with mode 'stream'); the answer "
                    "comes back sealed to you and is opened here",
                },
            },
            "required": ["agent", "message"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        "relay_get",
        "read a task you sent: its state, the answer and artifacts",
        {
            "type": "object",
            "properties": {"agent": _AGENT, "task": _TASK},
            "required": ["agent", "task"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        "relay_cancel",
        "cancel a task you sent that has not finished",
        {
            "type": "object",
            "properties": {"agent": _AGENT, "task": _TASK},
            "required": ["agent", "task"],
            "additionalProperties": False,
        },
    ),
)


class RelayRefused(Exception):
    """The relay (or the hop budget) said no; ``decision`` says which rule and why."""

    def __init__(self, decision: Decision, code: str = "refused") -> None:
        super().__init__(decision.reason)
        self.decision = decision
        self.code = code


def refused_by(exc: RelayError) -> RelayRefused:
    """A relay's refusal as the bridge's rule: the rule named by the HTTP status or the
    A2A reason, in the relay's words."""
    if exc.status is None:
        rule, code = {
            BAD_ANSWER: ("relay-answer", "bad-answer"),
            BAD_ARGS: ("bad-agent", "bad-args"),
            SEALED: ("sealed", "refused"),
        }.get(exc.code, ("relay-unreachable", "unreachable"))
        return RelayRefused(refuse(rule, str(exc)), code)
    rule = {401: "credential", 403: "grant", 404: "unknown-task"}.get(
        exc.status, "hop-limit" if exc.reason == "HOP_LIMIT" else "relay"
    )
    said = exc.sentence if exc.said else str(exc)
    code = "unreachable" if exc.status == 503 else "refused"
    return RelayRefused(refuse(rule, f"{said} (HTTP {exc.status})"), code)


def plain(value: Mapping[str, Any]) -> dict[str, Any]:
    """A view's exact JSON as plain Python values (the MCP answer is ``json.dumps``'d,
    which knows no exact decimals)."""
    found = json.loads(encode(value))
    return found if isinstance(found, dict) else {}


class Credential(NamedTuple):
    relay: str
    token: str
    workspace: str | None
    tls: ClientTls | None = None


def find_credential(as_agent: str | None, relay: str | None) -> Credential | None:
    """The agent credential by mellan's one rule of precedence, or None when there is none
    (a named agent that is not stored is an error: :class:`CredentialError`)."""
    try:
        found = agent_credential(as_agent=as_agent, relay=relay)
    except CredentialError:
        if as_agent:
            raise
        return None
    return Credential(found.relay, found.token, found.workspace, found.tls)


class RelayCaller:
    """One agent credential's view of the relay, over one client (an AsyncDelivery).

    Made with a credential the transport will not use (a token over plain HTTP to
    another machine) it raises :class:`~melchior.mellan.transport.TransportError`."""

    def __init__(self, cred: Credential, *, timeout: float = 30.0) -> None:
        self.cred = cred
        self.client = AsyncRelayClient(
            cred.relay, cred.token, workspace=cred.workspace, tls=cred.tls, timeout=timeout
        )
        self.relay = self.client.relay

    async def close(self) -> None:
        await self.client.aclose()

    async def me(self) -> dict[str, Any]:
        try:
            return plain((await self.client.whoami()).raw)
        except RelayError as exc:
            raise refused_by(exc) from None

    # -- what the tools do ----------------------------------------------------------------

    async def agents(self) -> dict[str, Any]:
        me = await self.me()
        subject = str(me.get("subject", ""))
        try:
            grants = await self.client.call("GET", f"/api/grants?caller={quote(subject, safe='')}")
        except RelayError as exc:
            raise refused_by(exc) from None
        by_agent: dict[str, set[str]] = {}
        for g in grants.get("grants", []) if isinstance(grants, dict) else []:
            if g.get("caller") == subject and not g.get("revoked_at"):
                by_agent.setdefault(str(g.get("receiver")), set()).update(g.get("capabilities", []))
        out = []
        for agent in sorted(by_agent)[:MAX_AGENTS]:
            skills: dict[str, str] = {}
            try:
                card = await self.client.call(
                    "GET", await self.client.base(agent) + "/extendedAgentCard"
                )
                for s in card.get("skills", []) if isinstance(card, dict) else []:
                    skills[str(s.get("id"))] = str(s.get("description") or s.get("name") or "")
            except RelayError:
                pass  # the grant list is the truth; a card is only the descriptions
            out.append(
                {
                    "agent": agent,
                    "capabilities": [
                        {"id": c, "description": skills.get(c, "")} for c in sorted(by_agent[agent])
                    ],
                }
            )
        return {"me": subject, "workspace": me.get("workspace"), "agents": out}

    async def send(
        self,
        agent: str,
        text: str,
        *,
        capability: str | None = None,
        mode: str = "return",
        task: str | None = None,
        context: str | None = None,
        received: Chain | None = None,
        progress: Progress | None = None,
        seal: bool = False,
    ) -> tuple[Receipt, dict[str, Any]]:
        """Send one task; the receipt and what the relay answered (task, or stream events).
        ``seal``: sealed to the agent's pinned key, its answer opened (docs/security.md)."""
        if mode not in MODES:
            raise RelayRefused(refuse("bad-mode", f"mode is one of {', '.join(MODES)}"), "bad-args")
        metadata: dict[str, Any] | None = None
        if received is not None:
            me = str((await self.me()).get("subject", "")) or "-"
            chain = next_hop(received, me)
            decision = check_hop(chain)
            if not decision.allowed:
                raise RelayRefused(decision)
            metadata = {HOPS_URI: chain.as_dict()}
        ask: dict[str, Any] = {"capability": capability, "task": task, "context": context,
                               "metadata": metadata}  # fmt: skip
        try:
            if mode == "stream":
                return await self._stream(agent, text, {**ask, "seal": seal}, progress)

            async def shown(event: Any) -> None:
                if progress is not None:
                    await progress(event.describe())

            found = await self.client.send(
                agent, text, wait=mode == "wait", on_event=shown, seal=seal, **ask
            )
        except RelayError as exc:
            raise refused_by(exc) from None
        return found.receipt, {"task": plain(found.raw)}

    async def _stream(
        self, agent: str, text: str, ask: dict[str, Any], progress: Progress | None
    ) -> tuple[Receipt, dict[str, Any]]:
        events: list[str] = []
        dropped = 0
        task: dict[str, Any] = {}
        followed = True
        try:
            async with asyncio.timeout(STREAM_TIMEOUT):
                async for event in self.client.stream(agent, text, **ask):
                    if event.kind == "task":
                        task = plain(event.raw["task"])
                    elif event.kind == "statusUpdate":
                        task["status"] = {
                            **task.get("status", {}),
                            **event.raw["statusUpdate"].get("status", {}),
                        }
                    said = describe(event.raw)
                    if len(events) < MAX_EVENTS:
                        events.append(said)
                    else:
                        dropped += 1
                    if progress is not None:
                        await progress(said)
        except TimeoutError:
            followed = False  # the task carries on at the relay; relay_get follows it
        out: dict[str, Any] = {"task": task, "events": events}
        if not followed:
            out["note"] = (
                f"stopped following after {STREAM_TIMEOUT:.0f} s; relay_get reads it later"
            )
        if dropped:
            out["events_not_kept"] = dropped
        return receipt_of(task), out

    async def get(self, agent: str, task: str) -> dict[str, Any]:
        return {"task": plain((await self._view(self.client.get, agent, task)).raw)}

    async def cancel(self, agent: str, task: str) -> dict[str, Any]:
        return {"task": plain((await self._view(self.client.cancel, agent, task)).raw)}

    async def _view(
        self, op: Callable[[str, str], Awaitable[TaskView]], agent: str, task: str
    ) -> TaskView:
        try:
            return await op(agent, task)
        except RelayError as exc:
            raise refused_by(exc) from None

    async def deliver(self, message: Message) -> Receipt:
        """The Delivery seam: ``message.recipient`` is the remote agent, its metadata may
        name a capability; the receipt says what the relay did with it."""
        meta = message.metadata or {}
        try:
            got, _ = await self.send(
                message.recipient,
                message.text,
                capability=meta.get("capability")
                if isinstance(meta.get("capability"), str)
                else None,
                received=message.chain,
            )
        except RelayRefused as exc:
            return refused_receipt(exc.decision, message.message_id)
        return got
