"""One coding agent's melchior session, as its MCP server holds it: serve, inbox, turn, taint.

The bridge *is* the agent's session for as long as the agent keeps its MCP server open.
It serves the session socket with the same :class:`~melchior.session.serve.Serve` that
``melchior serve`` runs (a forked child's ``MAGI_MELCHIOR_*`` environment makes it that
child), with one difference: messages go into an :class:`~.inbox.Inbox` instead of down
a pipe, because the model reads only between tool calls. On top of that it keeps what a
pipe harness would keep for its model:

* the **turn**, as the agent's hooks mark it (``UserPromptSubmit`` starts one, ``Stop``
  or Codex's ``notify`` ends it), with its send count for the per-turn quota
  (:func:`melchior.policy.turn_quota.may_send`) and the deepest hop chain of the peer
  text read in it, which the turn's own sends continue;
* the **taint window** (:class:`~.taint.TaintWindow`), opened whenever peer text reaches
  the model.

:class:`BridgeServe` answers the session verbs as serve does, with truthful receipts
for a model that reads later (``task`` on ``<id>@<message-id>`` says ``queued`` until the
model read it, then ``delivered``), and one more verb, ``hook``, for the agent's own hook
commands only. Nothing here knows the MCP SDK: :mod:`.mcp_server` puts this behind it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from melchior import names
from melchior.envelope import refusal
from melchior.integrations import locate, present, tools
from melchior.integrations.hooks import (
    HOOK_VERB,
    context_output,
    pre_tool_output,
    stop_output,
)
from melchior.integrations.inbox import WAKING_SORTS, Entry, Inbox
from melchior.integrations.settings import Settings
from melchior.integrations.taint import TaintWindow
from melchior.plane import verbs as plane_verbs
from melchior.policy.decision import Decision, refuse
from melchior.policy.hops import Chain
from melchior.policy.taint import ToolCall
from melchior.policy.turn_quota import may_send
from melchior.policy.walls import Session, Talk
from melchior.session.identity import Identity
from melchior.session.registry import Registry
from melchior.session.serve import Output, Serve, split_about
from melchior.tool import ENV_CHAIN, Usage, perform
from melchior.wire.calls import Refused, ok, refused
from melchior.wire.codec import JSONObject

MAX_STOP_WAKES = 3
"""Times one turn may be kept going at its end by waiting messages; then they wait."""
MAX_SESSION_NOTES = 16
"""Hook session ids remembered as notes (a Codex thread id lets its notify find us)."""
TURN_CHAIN_ENV = "MELCHIOR_TURN_CHAIN"
"""The hop chain of the turn that started this agent, when a runtime started it."""
TURN_SENDER_ENV = "MELCHIOR_TURN_SENDER"
"""Set when the agent's prompts come from a peer (a runtime running it for a task)."""


class Turn:
    """The current turn as the hooks mark it. Number 0: no hook has marked one yet."""

    def __init__(self) -> None:
        self.number = 0
        self.open = False
        self.sends = 0
        self.chain: Chain | None = None
        self.wakes = 0

    def begin(self) -> None:
        self.number += 1
        self.open = True
        self.sends = 0
        self.chain = None
        self.wakes = 0

    def end(self) -> None:
        self.open = False

    @property
    def marked(self) -> int | None:
        return self.number or None

    def as_dict(self) -> dict[str, Any]:
        return {"number": self.number, "open": self.open, "sends": self.sends}


def deeper(a: Chain | None, b: Chain | None) -> Chain | None:
    """The chain further from what a person said (the one a reply must continue)."""
    if a is None:
        return b
    if b is None:
        return a
    return b if b.hop > a.hop else a


def _chain_from(text: str | None) -> Chain | None:
    if not text:
        return None
    try:
        data = json.loads(text)
        return Chain.from_dict(data) if isinstance(data, dict) else None
    except ValueError:
        return None


def project_top(directory: str) -> str:
    """The project a path belongs to: its nearest ancestor with ``.git``, else itself."""
    start = Path(directory).resolve() if os.path.isabs(directory) else Path.cwd().resolve()
    for candidate in (start, *start.parents):
        if (candidate / ".git").exists():
            return str(candidate)
    return str(start)


def call_dir(info: Mapping[str, Any], call: ToolCall, project: str) -> str:
    """The directory a tool call runs in: its own ``workdir`` (Codex's shell calls), read
    against the hook's ``cwd``, which is the agent's current directory; else the project."""
    cwd = info.get("cwd")
    base = cwd if isinstance(cwd, str) and os.path.isabs(cwd) else project
    workdir = call.input.get("workdir")
    if isinstance(workdir, str) and workdir:
        return os.path.join(base, workdir)
    return base


class Bridge:
    """The state of one bridged agent and everything that reads or changes it."""

    def __init__(
        self,
        me: Identity,
        reg: Registry,
        talk: Talk,
        settings: Settings,
        env: Mapping[str, str],
    ) -> None:
        self.me = me
        self.reg = reg
        self.settings = settings
        self.env = dict(env)
        self.inbox = Inbox()
        self.serve = BridgeServe(me, reg, talk, self)
        self.turn = Turn()
        self.taint = TaintWindow(settings.taint_calls, settings.rules)
        self.base_chain = deeper(
            _chain_from(env.get(ENV_CHAIN)), _chain_from(env.get(TURN_CHAIN_ENV))
        )
        self.prompt_source = env.get(TURN_SENDER_ENV) or None
        self.session_dir: str | None = None
        """The directory the agent's turn started in (its project, where the agent names
        none): learnt from the operator's prompt, never from a tool call's own directory."""
        self.notes: list[str] = []
        self.ended_by: str | None = None

    # -- life -----------------------------------------------------------------------------

    async def start(self) -> Path:
        """Publish the session and leave the notes its hooks look for. Done before the MCP
        SDK is even imported: the agent runs its first hook while its servers start."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, self._leave, sig)
        path = await self.serve.publish()
        self.notes = locate.write(
            self.reg.dir, locate.bridge_keys(self.env, os.getppid()), self.me.id
        )
        return path

    def _leave(self, signum: int) -> None:
        # The agent is ending us. The MCP SDK reads stdin in a thread that no cancellation
        # reaches, so rather than wait on it: leave the registry clean and go now.
        self.stop()
        os._exit(128 + signum)

    def stop(self) -> None:
        """Leave the registry: our socket and our notes, never anyone else's."""
        self.serve.unpublish()
        locate.remove(self.reg.dir, self.notes, self.me.id)

    async def watch_end(self) -> None:
        """When the session's minter ends it (``end``), leave the registry; the MCP server
        stays up for the agent, but every tool then says the session was ended."""
        await self.serve.done.wait()
        self.ended_by = self.serve.ended_by or "its minter"
        self.stop()

    def learn_session(self, session: str) -> None:
        k = locate.key("session", session)
        if k is None or k in self.notes or len(self.notes) >= MAX_SESSION_NOTES:
            return
        self.notes += locate.write(self.reg.dir, [k], self.me.id)

    # -- the vocabulary -------------------------------------------------------------------

    def received_chain(self) -> Chain | None:
        return deeper(self.base_chain, self.turn.chain)

    def quota(self) -> Decision:
        return may_send(self.turn.sends, self.settings.sends_per_turn, turn=self.turn.marked)

    def check_open(self) -> None:
        if self.ended_by is not None:
            raise refusal(
                refuse(
                    "ended",
                    f"this session ({self.me.id}) was ended by {self.ended_by}; restart the "
                    "agent's melchior MCP server to start a new one",
                )
            )

    async def run_verb(
        self, spec: tools.ToolSpec, arguments: Mapping[str, Any] | None
    ) -> JSONObject:
        """One vocabulary call, answered exactly as ``melchior tool`` prints it."""
        try:
            self.check_open()
            args = tools.check_arguments(spec, arguments)
            if spec.name in tools.SEND_VERBS:
                decision = self.quota()
                if not decision.allowed:
                    raise refusal(decision)
            received = self.received_chain()
            if received is not None and spec.name in ("tell", "ask"):
                given = _chain_from(args.get("chain"))
                if given is None or given.hop < received.hop:
                    args["chain"] = json.dumps(received.as_dict())
            req = tools.request(spec.name, args)
            result = await asyncio.to_thread(perform, req, self.tool_env(), plane=plane_verbs)
        except Usage as exc:
            return refused(str(exc), code="bad-args")
        except Refused as exc:
            return refused(exc.reason, code=exc.code, **exc.detail)
        if spec.name in tools.SEND_VERBS:
            self.turn.sends += 1
        return ok(result)

    def tool_env(self) -> dict[str, str]:
        env = {k: v for k, v in self.env.items() if not k.startswith("MAGI_MELCHIOR_")}
        env[names.ENV_PROJECT] = self.me.project
        env[names.ENV_ID] = self.me.id
        return env

    # -- handing messages to the model ----------------------------------------------------

    def hand_over(self, entries: list[Entry], via: str, budget: int | None) -> str:
        """Render ``entries`` for the model, mark the ones shown delivered, and open the
        taint window and carry their chain: from here on the model has read them."""
        text, shown = present.render(entries, self.me.id, budget)
        taken = self.inbox.take(shown, via)
        for e in taken:
            self.turn.chain = deeper(self.turn.chain, e.message.chain)
        if taken:
            self.taint.open(", ".join(sorted({e.message.sender for e in taken})))
        return text

    def channel_delivered(self, entry: Entry) -> None:
        """A channel notification put ``entry`` in front of the model."""
        self.turn.chain = deeper(self.turn.chain, entry.message.chain)
        self.taint.open(entry.message.sender)

    async def read_inbox(self, wait: float) -> tuple[str, int]:
        """The ``inbox`` tool: every waiting message, waiting up to ``wait`` s for one."""
        if wait > 0:
            await self.inbox.wait(wait)
        entries = self.inbox.peek()
        text = self.hand_over(entries, "inbox", None)
        return text, len(entries)

    # -- the agent's hooks ----------------------------------------------------------------

    def on_hook(self, event: str, info: Mapping[str, Any]) -> dict[str, Any] | None:
        agent = info.get("agent")
        deny_mode = agent == "codex"
        session = info.get("session_id") or info.get("thread_id")
        if isinstance(session, str):
            self.learn_session(session)
        if event != "UserPromptSubmit" and self.turn.number == 0:
            # Hooks are running but none marked a turn: the agent ran its first prompt's hook
            # while this server was still starting (Codex starts servers asynchronously).
            self.turn.begin()
        if event == "UserPromptSubmit":
            self.turn.begin()
            cwd = info.get("cwd")
            if isinstance(cwd, str) and os.path.isabs(cwd):
                self.session_dir = cwd
            self.taint.close()  # the operator's prompt is their answer
            if self.prompt_source is not None:
                self.taint.open(self.prompt_source)
            return self._context(event, None)
        if event == "PostToolUse":
            return self._context(event, WAKING_SORTS)
        if event == "PreToolUse":
            return self._pre_tool(info, deny_mode)
        if event == "Stop":
            if self.turn.wakes < MAX_STOP_WAKES and self.inbox.peek(WAKING_SORTS):
                self.turn.wakes += 1
                text = self.hand_over(
                    self.inbox.peek(WAKING_SORTS), f"hook:{event}", present.HOOK_BUDGET
                )
                if text:
                    return stop_output(str(agent), text)
            self.turn.end()
            self.taint.close()
            return None
        if event == "notify":
            self.turn.end()
            self.taint.close()
        return None

    def _context(self, event: str, sorts: frozenset[str] | None) -> dict[str, Any] | None:
        entries = self.inbox.peek(sorts)
        if not entries:
            return None
        text = self.hand_over(entries, f"hook:{event}", present.HOOK_BUDGET)
        return context_output(event, text) if text else None

    def _pre_tool(self, info: Mapping[str, Any], deny_mode: bool) -> dict[str, Any] | None:
        tool = info.get("tool_name")
        if not isinstance(tool, str):
            return None
        server = info.get("server") or "melchior"
        verb = (
            tool.removeprefix(f"mcp__{server}__") if tool.startswith(f"mcp__{server}__") else None
        )
        if verb in (*tools.SEND_VERBS, "relay_send"):
            decision = self.quota()
            if not decision.allowed:
                return pre_tool_output("deny", decision.reason)
            if verb != "relay_send":
                return None  # a local send is bounded by the quota and hops, not the window
        subject = info.get("tool_input")
        call = ToolCall(tool, subject if isinstance(subject, dict) else {})
        home = info.get("home") if isinstance(info.get("home"), str) else None
        named = info.get("project_dir")
        project = project_top(named if isinstance(named, str) else self.session_dir or os.getcwd())
        verdict = self.taint.judge(
            call,
            project=project,
            cwd=call_dir(info, call, project),
            home=home,
            path=str(info.get("path") or os.environ.get("PATH", "")),
            server=str(server),
            deny_mode=deny_mode,
        )
        if verdict.decision is None:
            return None
        out = pre_tool_output(verdict.decision, verdict.reason)
        if verdict.stop:
            out.update({"continue": False, "stopReason": verdict.reason})
        return out

    def status(self) -> dict[str, Any]:
        return {
            "bridge": "mcp",
            "turn": self.turn.as_dict(),
            "inbox": self.inbox.waiting,
            "sends_per_turn": self.settings.sends_per_turn,
            "taint": self.taint.status(),
        }


class QuietOutput(Output):
    """No pipe: a bridge's harness is the MCP client, and what serve would tell a pipe
    harness (``listening``, ``end``) the bridge knows itself. Never writes to stdout,
    which is the MCP wire."""

    def __init__(self) -> None:
        super().__init__(None)

    async def send(self, msg: JSONObject) -> None:
        return None


class BridgeServe(Serve):
    """serve's answers for a bridged session: same verbs, receipts that know the model.

    Its harness is the bridge's :class:`~.inbox.Inbox` (an AsyncDelivery, as serve's
    pipe harness is), so a message is ``queued`` until the model reads it."""

    def __init__(self, me: Identity, reg: Registry, talk: Talk, bridge: Bridge) -> None:
        super().__init__(me, reg, talk, QuietOutput())
        self.harness = bridge.inbox
        self.bridge = bridge

    async def on_call(self, verb: str, args: list[Any], msg: JSONObject) -> list[Any]:
        if verb != HOOK_VERB:
            return await super().on_call(verb, args, msg)
        if msg.get("from") != self.me.id:
            raise refusal(
                refuse(
                    "own-hooks",
                    f"'{HOOK_VERB}' is for {self.me.id}'s own hook commands; a session reaches "
                    "another with tell, ask and answer",
                )
            )
        if len(args) != 2 or not isinstance(args[0], str) or not isinstance(args[1], dict):
            raise Refused("hook takes [event, details]", "bad-args")
        event = args[0][:64]
        return [{"output": self.bridge.on_hook(event, args[1])}]

    def verb_status(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        self.state.busy = self.bridge.turn.open
        self.state.waiting = self.bridge.inbox.waiting
        result = super().verb_status(args, msg, caller)
        result[0].update(self.bridge.status())
        return result

    def verb_task(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        """serve's ``task``, plus the fate of a message given to this bridge: a question's
        pending entry says whether the model has read it, and a tell's handle
        ``<this-id>@<message-id>`` answers ``queued`` or ``delivered`` to its sender."""
        try:
            result = super().verb_task(args, msg, caller)
        except Refused as exc:
            if exc.code != "unknown-task" or caller is None:
                raise
            callee, mid = split_about(args[0])
            fate = self.bridge.inbox.fate(mid) if callee == self.me.id else None
            if fate is None or caller.id not in (fate.sender_id, self.me.id):
                raise
            return [{"about": args[0], "state": fate.kind, "receipt": fate.kind, "via": fate.via}]
        first = result[0] if result else {}
        if first.get("state") == "pending":
            fate = self.bridge.inbox.fate(str(args[0]))
            if fate is not None:
                first.update(receipt=fate.kind, via=fate.via)
        return result
