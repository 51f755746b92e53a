"""The bridge as a relay caller: agents on other machines, through the relay's A2A entry.

With a mellan *agent* credential configured (``--as AGENT`` from ``mellan join``, or
``$MELLAN_TOKEN``, or the one credential stored; the precedence every mellan command
follows, :func:`melchior.mellan.commands._common.agent_credential`), the bridge offers
the agent the relay too: which remote agents and capabilities are granted to it, send
(returning at once, waiting, or streaming progress), get, and cancel. It speaks A2A 1.0
HTTP+JSON to ``{relay}/a2a/{workspace}/{agent}`` as ``mellan send`` does (docs/a2a.md).

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
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple
from urllib.parse import quote

import httpx

from melchior.envelope import (
    ANSWERED,
    DELIVERED,
    QUEUED,
    Message,
    Receipt,
    receipt,
    refused_receipt,
)
from melchior.integrations.tools import ToolSpec
from melchior.mellan import transport
from melchior.mellan.transport import ClientTls
from melchior.policy.decision import Decision, refuse
from melchior.policy.hops import HOPS_URI, Chain, check_hop, next_hop

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


def receipt_of(task: Mapping[str, Any]) -> Receipt:
    """What became of a send, from the task the relay answered with."""
    state = str(task.get("status", {}).get("state", ""))
    tid = str(task.get("id")) if task.get("id") is not None else None
    if state in ("TASK_STATE_COMPLETED", "TASK_STATE_INPUT_REQUIRED"):
        return receipt(ANSWERED, tid, task=tid, state=state)
    if state in ("TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED"):
        return receipt(DELIVERED, tid, task=tid, state=state)
    return receipt(QUEUED, tid, task=tid, state=state)


class Credential(NamedTuple):
    relay: str
    token: str
    workspace: str | None
    tls: ClientTls | None = None


def find_credential(as_agent: str | None, relay: str | None) -> Credential | None:
    """The agent credential by mellan's one rule of precedence, or None when there is none."""
    import argparse

    from melchior.mellan.commands._common import CliError, agent_credential

    try:
        found = agent_credential(argparse.Namespace(as_agent=as_agent, relay=relay))
    except CliError:
        if as_agent:
            raise
        return None
    return Credential(found.relay, found.token, found.workspace, found.tls)


class RelayCaller:
    """One agent credential's view of the relay, over one HTTP client (an AsyncDelivery)."""

    def __init__(self, cred: Credential, *, timeout: float = 30.0) -> None:
        self.cred = cred
        self.relay = cred.relay.rstrip("/")
        # verifying TLS, and no token over plain HTTP to another machine (TransportError)
        self.http = transport.async_client(
            self.relay,
            cred.token,
            cred.tls,
            headers={"A2A-Version": "1.0", "Accept": "application/json"},
            timeout=httpx.Timeout(timeout, read=None),
        )
        self._me: dict[str, Any] | None = None

    async def close(self) -> None:
        await self.http.aclose()

    # -- plumbing -------------------------------------------------------------------------

    async def _json(self, method: str, path: str, body: Any = None) -> Any:
        try:
            if body is None:
                r = await self.http.request(method, path if "://" in path else self.relay + path)
            else:
                r = await self.http.request(
                    method,
                    path if "://" in path else self.relay + path,
                    content=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json"},
                )
        except httpx.HTTPError as exc:
            raise RelayRefused(
                refuse("relay-unreachable", f"cannot reach the relay at {self.relay}: {exc}"),
                "unreachable",
            ) from None
        if not r.is_success:
            raise _refused(r)
        try:
            return json.loads(r.content) if r.content else {}
        except ValueError:
            raise RelayRefused(
                refuse(
                    "relay-answer", f"the relay answered {method} {path} with text that is not JSON"
                ),
                "bad-answer",
            ) from None

    async def me(self) -> dict[str, Any]:
        if self._me is None:
            got = await self._json("GET", "/api/whoami")
            self._me = got if isinstance(got, dict) else {}
        return self._me

    async def base(self, agent: str) -> str:
        if not isinstance(agent, str) or not agent or "\n" in agent or len(agent) > 256:
            raise RelayRefused(refuse("bad-agent", f"{agent!r} is not an agent id"), "bad-args")
        workspace = self.cred.workspace or str((await self.me()).get("workspace", ""))
        return f"{self.relay}/a2a/{quote(workspace, safe='')}/{quote(agent, safe='/')}"

    # -- what the tools do ----------------------------------------------------------------

    async def agents(self) -> dict[str, Any]:
        me = await self.me()
        subject = str(me.get("subject", ""))
        grants = await self._json("GET", f"/api/grants?caller={quote(subject, safe='')}")
        by_agent: dict[str, set[str]] = {}
        for g in grants.get("grants", []) if isinstance(grants, dict) else []:
            if g.get("caller") == subject and not g.get("revoked_at"):
                by_agent.setdefault(str(g.get("receiver")), set()).update(g.get("capabilities", []))
        out = []
        for agent in sorted(by_agent)[:MAX_AGENTS]:
            skills: dict[str, str] = {}
            try:
                card = await self._json("GET", await self.base(agent) + "/extendedAgentCard")
                for s in card.get("skills", []) if isinstance(card, dict) else []:
                    skills[str(s.get("id"))] = str(s.get("description") or s.get("name") or "")
            except RelayRefused:
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
    ) -> tuple[Receipt, dict[str, Any]]:
        """Send one task; the receipt and what the relay answered (task, or stream events)."""
        if mode not in MODES:
            raise RelayRefused(refuse("bad-mode", f"mode is one of {', '.join(MODES)}"), "bad-args")
        message: dict[str, Any] = {
            "messageId": secrets.token_hex(16),
            "role": "ROLE_USER",
            "parts": [{"text": text}],
        }
        if received is not None:
            me = str((await self.me()).get("subject", "")) or "-"
            chain = next_hop(received, me)
            decision = check_hop(chain)
            if not decision.allowed:
                raise RelayRefused(decision)
            message["metadata"] = {HOPS_URI: chain.as_dict()}
        if task:
            message["taskId"] = task
        if context:
            message["contextId"] = context
        body: dict[str, Any] = {"message": message}
        if capability:
            body["metadata"] = {"capability": capability}
        base = await self.base(agent)
        if mode == "stream":
            return await self._stream(base, body, progress)
        body["configuration"] = {"returnImmediately": mode == "return"}
        answer = await self._json("POST", base + "/message:send", body)
        found = answer.get("task", {}) if isinstance(answer, dict) else {}
        return receipt_of(found), {"task": found}

    async def _stream(
        self, base: str, body: dict[str, Any], progress: Progress | None
    ) -> tuple[Receipt, dict[str, Any]]:
        from melchior.mellan.commands.send import describe

        events: list[str] = []
        dropped = 0
        task: dict[str, Any] = {}
        followed = True
        try:
            async with asyncio.timeout(STREAM_TIMEOUT):
                async with self.http.stream(
                    "POST",
                    base + "/message:stream",
                    content=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
                ) as r:
                    if not r.is_success:
                        await r.aread()
                        raise _refused(r)
                    data: list[str] = []
                    async for line in r.aiter_lines():
                        if line.startswith("data:"):
                            data.append(line[5:].lstrip())
                            continue
                        if line or not data:
                            continue
                        event = json.loads("\n".join(data))
                        data = []
                        if "task" in event:
                            task = event["task"]
                        elif "statusUpdate" in event:
                            task.setdefault("status", {}).update(
                                event["statusUpdate"].get("status", {})
                            )
                        said = describe(event)
                        if len(events) < MAX_EVENTS:
                            events.append(said)
                        else:
                            dropped += 1
                        if progress is not None:
                            await progress(said)
        except TimeoutError:
            followed = False  # the task carries on at the relay; relay_get follows it
        except httpx.HTTPError as exc:
            raise RelayRefused(
                refuse("relay-unreachable", f"the stream from the relay broke: {exc}"),
                "unreachable",
            ) from None
        out: dict[str, Any] = {"task": task, "events": events}
        if not followed:
            out["note"] = (
                f"stopped following after {STREAM_TIMEOUT:.0f} s; relay_get reads it later"
            )
        if dropped:
            out["events_not_kept"] = dropped
        return receipt_of(task), out

    async def get(self, agent: str, task: str) -> dict[str, Any]:
        got = await self._json("GET", await self.base(agent) + f"/tasks/{quote(task, safe='')}")
        return {"task": got}

    async def cancel(self, agent: str, task: str) -> dict[str, Any]:
        got = await self._json(
            "POST", await self.base(agent) + f"/tasks/{quote(task, safe='')}:cancel"
        )
        return {"task": got}

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


def _refused(r: httpx.Response) -> RelayRefused:
    """The relay's error body as a decision: the rule named by the A2A error, its words."""
    try:
        error = json.loads(r.content).get("error", {})
    except (ValueError, AttributeError):
        error = {}
    message = str(error.get("message") or r.text[:200] or f"HTTP {r.status_code}")
    reason = ""
    for d in error.get("details", []) if isinstance(error, dict) else []:
        if isinstance(d, dict) and d.get("reason"):
            reason = str(d["reason"])
    rule = {
        401: "credential",
        403: "grant",
        404: "unknown-task",
    }.get(r.status_code, "hop-limit" if reason == "HOP_LIMIT" else "relay")
    code = "unreachable" if r.status_code == 503 else "refused"
    return RelayRefused(refuse(rule, f"{message} (HTTP {r.status_code})"), code)
