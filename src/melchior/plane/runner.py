"""The turn loop: one worker per agent, one turn per agent at a time, all owned by one group.

Each agent has a queue of wake-ups in the state database (an operator's line, a
webhook's line, a peer's note, an answer). Its worker takes the oldest, checks the
ceiling, writes the roster, runs the turn through the agent's runtime
(:func:`melchior.runtimes.runtime_for`) with the turn's environment, then reads the
outbox through :class:`~melchior.plane.delivery.TurnDelivery` and routes the turn's
answer by its origin (:func:`melchior.policy.routing.route_answer`). Different agents'
turns run at the same time; the workers live in one :class:`asyncio.TaskGroup` that
:meth:`Plane.run` owns and awaits.

Operator input (console, headless script) and webhook input call :meth:`Plane.operator_line`
and :meth:`Plane.webhook_line` on the same event loop; they write the state and wake the
worker, never run a turn themselves.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import NamedTuple

from melchior.envelope import Message, Receipt
from melchior.plane import outbox as outbox_file
from melchior.plane import prompts, roster, verbs
from melchior.plane.config import PlaneConfig
from melchior.plane.delivery import Emit, Event, TurnDelivery, carry, ceiling_refusal, release
from melchior.plane.state import Held, Input, State
from melchior.plane.verbs import ENV_AGENT, ENV_OUTBOX, ENV_ROSTER
from melchior.policy.doors import (
    OPERATOR,
    TeamCommand,
    mentions,
    operator_changes_team,
    team_command,
)
from melchior.policy.routing import Origin, note_chain, route_answer
from melchior.runtimes import Progress, Runtime, Turn, TurnResult, runtime_for

ENV_CHAIN = "MAGI_MELCHIOR_CHAIN"
"""The chain of what woke the turn, for ``melchior tool --verb=tell`` (same name, same count)."""
MAX_LINE = 64 * 1024
"""The longest operator or webhook line taken."""


class AgentStatus(NamedTuple):
    agent: str
    state: str  # idle | running | waiting (a held question) | spent
    turns: int
    cost: float
    ceiling: str
    pending: int
    questions: int


class Plane:
    """A running plane: its configuration, state, runtimes and watchers."""

    def __init__(self, config: PlaneConfig, state: State | None = None) -> None:
        self.config = config
        self.state = state if state is not None else State(config.state)
        self.runtimes: dict[str, Runtime] = {
            a.id: runtime_for(a.runtime, a.options) for a in config.agents
        }
        self.listeners: list[Emit] = []
        self._wake: dict[str, asyncio.Event] = {a: asyncio.Event() for a in config.ids}
        self._running: set[str] = set()
        self._quiet = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._turn_tasks: dict[str, asyncio.Task[TurnResult]] = {}
        self._stopping: set[str] = set()

    # -- watching ---------------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        for listener in list(self.listeners):
            listener(event)

    def status(self, agent: str) -> AgentStatus:
        cfg = self.config.by_id[agent]
        turns, cost = self.state.spent(agent)
        questions = len(self.state.waiting(agent))
        if agent in self._running:
            what = "running"
        elif questions:
            what = "waiting"
        elif cfg.ceiling.reached(turns, cost):
            what = "spent"
        else:
            what = "idle"
        return AgentStatus(
            agent,
            what,
            turns,
            cost,
            cfg.ceiling.describe(turns, cost),
            len(self.state.pending(agent)),
            questions,
        )

    def questions(self, agent: str | None = None) -> list[Held]:
        return self.state.waiting(agent)

    # -- input ------------------------------------------------------------------------------

    def _check_agent(self, agent: str) -> None:
        if agent not in self.config.by_id:
            raise KeyError(
                f"there is no agent {agent!r}; the agents are {', '.join(self.config.ids)}"
            )

    def operator_line(self, agent: str, line: str) -> str:
        """A line the operator typed at ``agent``'s prompt. ``/team`` lines act at once;
        any other line queues a turn, with the ``@`` mentions it makes (for that turn only).
        Returns what the console shows for it."""
        self._check_agent(agent)
        line = line[:MAX_LINE]
        cmd = team_command(line, OPERATOR)
        if cmd is not None:
            return self._team(agent, cmd)
        named = mentions(line, self.config.ids, OPERATOR) - {agent}
        with self.state.tx():
            self.state.enqueue(agent, "operator", line, mentions=sorted(named))
            self.state.log("operator", recipient=agent, text=line)
        self.emit(Event(agent, "operator", line, {"mentions": sorted(named)}))
        self._kick(agent)
        return f"> {line}"

    def webhook_line(self, agent: str, line: str, source: str = "webhook") -> int:
        """A line from outside, at stranger trust: it wakes ``agent`` and opens no door —
        no ``@`` mention is read from it and no ``/team`` acted on (``policy.doors``
        reads neither below operator trust), so its turn carries no mentions."""
        self._check_agent(agent)
        line = line[:MAX_LINE]
        with self.state.tx():
            input_id = self.state.enqueue(agent, "webhook", line, sender=source)
            self.state.log("webhook", sender=source, recipient=agent, text=line)
        self.emit(Event(agent, "webhook", line, {"source": source}))
        self._kick(agent)
        return input_id

    def _team(self, agent: str, cmd: TeamCommand) -> str:
        cfg = self.config.by_id[agent]
        opened = self.state.opened(agent)
        d = operator_changes_team(
            agent, cmd, roster=set(self.config.ids), talks_to=set(cfg.talks_to), opened=opened
        )
        if not d.allowed:
            text = f"{cmd.line()}: {d.reason}"
        elif cmd.action == "open":
            self.state.open_door(agent, cmd.name or "", "team")
            self.state.log("team", sender=agent, recipient=cmd.name, rule="team", reason=d.reason)
            text = f"{cmd.line()}: {d.reason}"
        elif cmd.action == "drop":
            self.state.drop_door(agent, cmd.name or "")
            self.state.log("team", sender=agent, recipient=cmd.name, rule="drop", reason=d.reason)
            text = f"{cmd.line()}: {d.reason}"
        else:
            text = self.team_listing(agent)
        self.emit(Event(agent, "team", text))
        return text

    def team_listing(self, agent: str) -> str:
        cfg = self.config.by_id[agent]
        opened = self.state.opened(agent)
        rows = []
        for other in self.config.agents:
            if other.id == agent:
                continue
            how = (
                "talksTo"
                if other.id in cfg.talks_to
                else "/team"
                if other.id in opened
                else "no door"
            )
            rows.append(
                f"{other.id} ({how}){': ' + other.description if other.description else ''}"
            )
        return f"/team at {agent}: " + "; ".join(rows)

    def answer(self, held_id: int, key: str) -> Receipt | None:
        """The operator's key for held note ``held_id`` (``y`` yes, anything else no)."""
        result = release(self.config, self.state, self.emit, held_id, key)
        if result is not None:
            for agent in self.config.ids:
                self._kick(agent)
            self._check_quiet()
        return result

    # -- running ----------------------------------------------------------------------------

    def _kick(self, agent: str) -> None:
        self._quiet.clear()
        self._wake[agent].set()

    def _check_quiet(self) -> None:
        if not self._running and not any(self.state.pending(a) for a in self.config.ids):
            self._quiet.set()

    async def quiet(self) -> None:
        """Wait until no turn runs and none is queued (held questions do not count)."""
        self._check_quiet()
        await self._quiet.wait()

    def recover(self) -> None:
        """After a restart: turns that were running are not run again; say so."""
        self._interrupted(self.state.interrupted())
        for held in self.state.waiting():
            self.emit(
                Event(
                    held.sender,
                    "question",
                    f"write to {held.recipient}? y / n",
                    {"held": held.id, "to": held.recipient},
                )
            )

    def _interrupted(self, inputs: list[Input]) -> None:
        for inp in inputs:
            text = f"{inp.agent}'s turn was interrupted when the plane stopped; it is not run again"
            self.state.log(
                "turn", recipient=inp.agent, receipt="refused", rule="interrupted", reason=text
            )
            self.state.notice(inp.agent, "Your last turn was interrupted when the plane stopped.")
            if inp.kind == "note" and inp.sender:
                self.state.notice(inp.sender, f"{text}, so your note to it got no answer.")
            self.emit(Event(inp.agent, "error", text))

    async def run(self) -> None:
        """Run every agent's worker until :meth:`stop` (or the task is cancelled)."""
        self.recover()
        async with asyncio.TaskGroup() as group:
            self._tasks = [group.create_task(self._worker(a)) for a in self.config.ids]
            for agent in self.config.ids:
                if self.state.pending(agent):
                    self._kick(agent)
            self._check_quiet()

    def stop_turn(self, agent: str) -> bool:
        """The operator stops ``agent``'s running turn (its process tree is killed as on
        a plane stop) and the plane goes on. False when no turn of ``agent`` runs."""
        self._check_agent(agent)
        task = self._turn_tasks.get(agent)
        if task is None or task.done():
            return False
        self._stopping.add(agent)
        task.cancel()
        return True

    RERUNNABLE = ("failed", "interrupted", "stopped")
    """Turn states the operator may run again (ctrl+r): one that did not finish."""

    def rerun(self, agent: str) -> str:
        """Queue ``agent``'s last turn again when it failed, was interrupted or stopped
        — the operator's choice, since a coding agent may already have acted; returns
        what the console shows (why not, when it is not run)."""
        self._check_agent(agent)
        last = self.state.last_turn(agent)
        if last is None:
            return f"ctrl+r: {agent} has had no turn to run again"
        turn, state, inp = last
        if state not in self.RERUNNABLE:
            return (
                f"ctrl+r: {agent}'s last turn {state}; only a failed, interrupted or "
                "stopped turn is run again"
            )
        with self.state.tx():
            self.state.enqueue(
                agent,
                inp.kind,
                inp.text,
                sender=inp.sender,
                chain=inp.chain,
                mentions=inp.mentions,
                message_id=inp.message_id,
            )
            self.state.log(
                "turn",
                recipient=agent,
                receipt="queued",
                rule="operator-rerun",
                reason=f"the operator runs the {state} turn again",
                turn=turn,
            )
        self._kick(agent)
        return f"ctrl+r: the {state} turn ({inp.kind}) is queued again"

    def queued(self, agent: str) -> str:
        """What waits for ``agent``: its queued wake-ups and its held questions."""
        self._check_agent(agent)
        rows = []
        for i, inp in enumerate(self.state.pending(agent), start=1):
            source = f" from {inp.sender}" if inp.sender and inp.sender != inp.kind else ""
            first = inp.text.splitlines()[0][:70] if inp.text else ""
            rows.append(f"{i}. {inp.kind}{source}: {first}")
        held = self.state.waiting(agent)
        head = f"queued for {agent}: {len(rows)} turn(s), {len(held)} question(s) held"
        return "\n".join([head, *rows, *(f"held: write to {h.recipient}?" for h in held)])

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def _worker(self, agent: str) -> None:
        wake = self._wake[agent]
        while True:
            inp = self.state.next_input(agent)
            if inp is None:
                self._check_quiet()
                await wake.wait()
                wake.clear()
                continue
            spent = ceiling_refusal(self.config, self.state, agent)
            if spent is not None:
                self._refuse_input(inp, spent.reason)
                continue
            self._running.add(agent)
            self.emit(Event(agent, "state", "running"))
            try:
                await self._turn(agent, inp)
            except Exception as exc:  # a broken workspace must not stop the other agents
                self._broken_turn(inp, exc)
            finally:
                self._running.discard(agent)
                self.emit(Event(agent, "state", "idle"))

    def _broken_turn(self, inp: Input, exc: Exception) -> None:
        reason = f"the plane could not run the turn: {type(exc).__name__}: {exc}"
        with self.state.tx():
            self.state.set_input(inp.id, "failed")
            self.state.log(
                "turn", recipient=inp.agent, receipt="failed", rule="plane-error", reason=reason
            )
            if inp.kind == "note" and inp.sender:
                self.state.notice(inp.sender, f"{inp.agent}'s turn on your note failed: {reason}")
        self.emit(Event(inp.agent, "error", reason))

    def _refuse_input(self, inp: Input, reason: str) -> None:
        with self.state.tx():
            self.state.set_input(inp.id, "refused")
            self.state.log(
                inp.kind,
                sender=inp.sender,
                recipient=inp.agent,
                receipt="refused",
                rule="ceiling",
                reason=reason,
                chain=inp.chain,
                message_id=inp.message_id,
                text=inp.text,
            )
            if inp.kind in ("note", "answer") and inp.sender:
                self.state.notice(
                    inp.sender, f"Your {inp.kind} to {inp.agent} was not taken: {reason}"
                )
        self.emit(Event(inp.agent, "error", f"{inp.kind} not taken: {reason}"))

    def _workspace(self, agent: str) -> Path:
        ws = self.config.by_id[agent].workspace
        (ws / roster.DIR / "outbox").mkdir(parents=True, exist_ok=True, mode=0o700)
        return ws

    async def _turn(self, agent: str, inp: Input) -> None:
        cfg = self.config.by_id[agent]
        origin = Origin(inp.kind, inp.sender, inp.chain)
        mentioned = frozenset(inp.mentions) if inp.kind == "operator" else frozenset()
        told = self.state.untold(agent)
        turn = self.state.begin_turn(agent, inp.id)
        self.state.mark_told([i for i, _ in told])
        ws = self._workspace(agent)
        roster_path = roster.write(
            ws,
            roster.build(
                agent,
                [(a.id, a.description) for a in self.config.agents],
                talks_to=set(cfg.talks_to),
                opened=self.state.opened(agent),
                mentioned=mentioned,
                turn=turn,
            ),
        )
        box = ws / roster.DIR / "outbox" / f"{turn}.ndjson"
        box.unlink(missing_ok=True)
        env = {ENV_AGENT: agent, ENV_OUTBOX: str(box), ENV_ROSTER: str(roster_path)}
        if inp.chain is not None and inp.kind in ("note", "answer"):
            env[ENV_CHAIN] = json.dumps(inp.chain.as_dict())
        prompt = prompts.compose(inp.kind, agent, inp.text, inp.sender, [t for _, t in told])
        message = Message(
            inp.sender or inp.kind,
            agent,
            inp.text,
            sort=inp.kind if inp.kind in ("note", "answer") else "attention",
            chain=inp.chain,
            message_id=inp.message_id,
        )
        # The agent's own count, the one its status line and ceiling show ("3/50 turns"):
        # the plane-wide id stays in the log as ``turn`` and in the outbox's file name.
        number = self.state.spent(agent)[0]
        source = f" from {inp.sender}" if inp.sender and inp.sender != inp.kind else ""
        self.emit(
            Event(
                agent,
                "turn",
                f"turn {number} ({inp.kind}{source})",
                {"turn": turn, "number": number, "kind": inp.kind},
            )
        )

        async def progress(p: Progress) -> None:
            self.emit(Event(agent, "progress", p.text, {"kind": p.kind}))

        running = asyncio.ensure_future(
            self.runtimes[agent].run(
                Turn(prompt=prompt, cwd=ws, message=message, env=env, plane=verbs), progress
            )
        )
        self._turn_tasks[agent] = running
        try:
            result = await running
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if agent in self._stopping and (current is None or not current.cancelling()):
                self._stopped_by_operator(agent, turn, inp)
                return

            # Stopped mid-turn: the process group is gone; record it as a crash would be
            # found on the next start (never run again, whoever waited is told).
            with self.state.tx():
                self.state.end_turn(turn, "interrupted", "", "the plane stopped", None)
                self.state.set_input(inp.id, "running")
                self._interrupted(self.state.interrupted(inp.id))
            raise
        finally:
            self._turn_tasks.pop(agent, None)
            self._stopping.discard(agent)
        cost = result.usage.get("cost_usd")
        self.state.end_turn(
            turn, result.state, result.text, result.error, float(cost) if cost else None
        )
        self.state.log(
            "turn",
            recipient=agent,
            receipt=result.state,
            turn=turn,
            reason=result.error,
            text=result.text,
        )
        if not result.ok:  # what it printed before it failed is often the why
            printed = f"\nits output:\n{result.text}" if result.text.strip() else ""
            ended = f"turn failed: {result.error}{printed}"
        else:
            ended = result.text or "(the turn ended without an answer)"
        self.emit(
            Event(
                agent,
                "done" if result.ok else "error",
                ended,
                {"turn": turn, "state": result.state},
            )
        )
        self._deliver_outbox(agent, turn, origin, mentioned, box)
        self._route(agent, turn, origin, result, inp)

    def _stopped_by_operator(self, agent: str, turn: int, inp: Input) -> None:
        """The operator's ctrl+x: the turn ends as stopped, its outbox is not read (its
        notes were not finished), and whoever waited on it is told."""
        reason = "stopped by the operator"
        with self.state.tx():
            self.state.end_turn(turn, "stopped", "", reason, None)
            self.state.set_input(inp.id, "stopped")
            self.state.log(
                "turn",
                recipient=agent,
                receipt="stopped",
                rule="operator-stop",
                turn=turn,
                reason=reason,
            )
            if inp.kind == "note" and inp.sender:
                self.state.notice(inp.sender, f"{agent}'s turn on your note was {reason}.")
        self.emit(Event(agent, "error", f"turn {reason}; its outbox was not read", {"turn": turn}))

    def _deliver_outbox(
        self, agent: str, turn: int, origin: Origin, mentioned: frozenset[str], box: Path
    ) -> None:
        read = outbox_file.read(box)
        for problem in read.problems:
            self.state.log(
                "note", sender=agent, receipt="refused", rule="outbox", reason=problem, turn=turn
            )
            self.state.notice(agent, f"Your outbox was not all read: {problem}")
            self.emit(Event(agent, "note", f"outbox refused: {problem}", {"receipt": "refused"}))
        delivery = TurnDelivery(
            self.config, self.state, self.emit, sender=agent, turn=turn, mentioned=mentioned
        )
        chain = note_chain(origin, agent)  # every note of one turn travels on one chain
        for note in read.notes:
            delivery.deliver(
                Message(
                    agent,
                    note.to,
                    note.text,
                    sort="note",
                    chain=chain,
                    message_id=note.id or secrets.token_hex(8),
                )
            )
        for name in set(delivery.sent):
            self._kick(name)

    def _route(self, agent: str, turn: int, origin: Origin, result: TurnResult, inp: Input) -> None:
        """The turn's answer goes where the turn came from; see policy.routing."""
        if origin.kind != "note" or origin.sender is None:
            return
        sender = origin.sender
        if not result.ok:
            self.state.notice(sender, f"{agent}'s turn on your note failed: {result.error}")
            self.state.log(
                "answer",
                sender=agent,
                recipient=sender,
                receipt="refused",
                rule="turn-failed",
                reason=result.error,
                turn=turn,
            )
            return
        if not result.text.strip():
            self.state.notice(sender, f"{agent} ended its turn on your note without an answer.")
            self.state.log(
                "answer",
                sender=agent,
                recipient=sender,
                receipt="refused",
                rule="no-answer",
                reason="the turn's output was empty",
                turn=turn,
            )
            return
        route, decision = route_answer(origin, agent)
        message = Message(
            agent,
            sender,
            result.text,
            sort="answer",
            chain=route.chain,
            message_id=secrets.token_hex(8),
            about=inp.message_id,
        )
        refusal = (
            decision if not decision.allowed else ceiling_refusal(self.config, self.state, sender)
        )
        if refusal is not None:
            with self.state.tx():
                self.state.log(
                    "answer",
                    sender=agent,
                    recipient=sender,
                    receipt="refused",
                    rule=refusal.rule,
                    reason=refusal.reason,
                    chain=route.chain,
                    message_id=message.message_id,
                    turn=turn,
                    text=result.text,
                )
                self.state.notice(
                    agent, f"Your answer to {sender} was not delivered: {refusal.reason}"
                )
                self.state.notice(
                    sender, f"{agent}'s answer to your note was not delivered: {refusal.reason}"
                )
            for who in (agent, sender):
                self.emit(
                    Event(
                        who,
                        "answer",
                        f"answer {agent} → {sender} refused ({refusal.rule})",
                        {"receipt": "refused", "rule": refusal.rule},
                    )
                )
            return
        carry(self.state, self.emit, message, rule="origin", turn=turn)
        self._kick(sender)
