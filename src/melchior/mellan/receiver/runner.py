"""One claimed task, from lease to spooled report.

The steps, each with its own reason:

1. **Spooled already?** The same turn of the same task finished here before and its
   report did not reach the relay in time (the lease ran out): report that result under
   the new lease. A success is never run twice by one receiver.
2. **Route and allow-list.** The relay hands the owner-approved route with the lease; no
   route, or a route outside the machine's own allow-list (:mod:`.wall`), is reported as a
   failure that is not retried, naming the rule.
3. **Is the lease still ours?** Time is counted from the moment the claim was sent
   (monotonic clock), plus the time the relay says it held the claim before taking the
   lease (a long-poll answered late is not a stale lease; the relay cannot say more than
   the claim's own wait): a receiver stopped or starved after the relay committed the
   claim can hold a lease that already ran out — and another receiver may have run the
   task and recorded its success meanwhile. Past the lease the turn is not started at
   all; past a third of it, the lease is renewed first and the turn starts only if that
   succeeds.
4. **Run the adapter** (:mod:`melchior.runtimes`) with its own task group: the adapter's
   turn, and a keeper that renews the lease every TTL/3. The keeper stops the turn
   (cancelling it kills the adapter's whole process group: TERM, then KILL after the
   grace) when the relay says the lease is lost — after a cancel it acknowledges with
   ``cancel-ack`` — and *self-fences* when renewals keep failing past the lease's
   expiry, so a receiver cut off from the relay stops before another may take over.
   Progress is streamed to the relay as the adapter reports it, held for
   ``progress_debounce`` and coalesced (:mod:`.progress`: a turn that ends within the
   window sends its completion alone); a progress write that says the lease is lost
   stops the turn too.
5. **Spool, then report.** The result is written durably to the spool before the
   relay hears of it; :mod:`melchior.mellan.receiver.reporter` delivers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from melchior.mellan.client.receiver import (
    AsyncReceiverClient,
    ClaimedTask,
    MalformedLease,
    ReceiverError,
)
from melchior.mellan.receiver import prompt
from melchior.mellan.receiver.config import ReceiverConfig
from melchior.mellan.receiver.progress import Outbox
from melchior.mellan.receiver.reporter import revoked_reason
from melchior.mellan.receiver.sealed import NotOpened, SealedTurn, Unsealer, earlier_turns
from melchior.mellan.receiver.sessions import Sessions
from melchior.mellan.receiver.spool import REUSABLE, Report, Spool
from melchior.mellan.receiver.status import Board, Running, short
from melchior.mellan.receiver.wall import Judged, judge
from melchior.mellan.sealing import is_sealed
from melchior.policy.allowlist import no_route
from melchior.policy.decision import Decision, refuse
from melchior.runtimes import (
    COMPLETED,
    FAILED,
    INPUT_REQUIRED,
    Progress,
    Runtime,
    RuntimeConfigError,
    Turn,
    TurnResult,
    runtime_for,
)

TEST_HOOK = "MELLAN_RECEIVER_TEST_HOOK"
"""Test-only: ``kill-after-spool`` makes the receiver SIGKILL itself right after a result
is spooled and before it is reported (the fault tests' window); ``kill-after-spool:N``
right after the N-th result is (concurrent turns whose spool writes shared a sync)."""

SESSION_WAIT = 2.0
"""Seconds a task waits for its bound session to be free on this receiver, at most."""

PROGRESS_TIMEOUT = 5.0
PROGRESS_QUIET = 5.0
"""After a progress write fails, further progress is not sent for this long (the turn is
not held up by an unreachable relay; renewals decide whether the lease stands)."""


class LeaseLost(Exception):
    """The relay says this lease is no longer ours (``reason`` as it gave it)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Shared:
    """What every task run of one receiver shares."""

    config: ReceiverConfig
    client: AsyncReceiverClient
    spool: Spool
    board: Board
    sessions: Sessions
    agent: str
    session_locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    revoked: Callable[[str], None] = lambda reason: None
    unsealer: Unsealer | None = None
    """Opens sealed tasks (:mod:`.sealed`); ``None``: a sealed task is refused."""
    spooled: int = 0
    """Results spooled so far (counted for the test hook only)."""

    def say(self, line: str) -> None:
        self.board.say(line)


def agent_message(text: str) -> dict[str, Any]:
    return {"role": "ROLE_AGENT", "parts": [{"text": text}]}


def report_of(result: TurnResult, task_id: str, turn: int, epoch: int) -> Report:
    """The report a turn's result becomes (the receiver API's complete/fail body)."""
    now = time.time()
    if result.state in (COMPLETED, INPUT_REQUIRED):
        body: dict[str, Any] = {"artifacts": [dict(a) for a in result.artifacts]}
        if result.text:
            body["message"] = agent_message(result.text)
        if result.reply:  # a blocking send gets the message back, not the task
            body["asMessage"] = True
        return Report(
            task_id, turn, epoch, "complete",
            {"epoch": epoch, "result": body, "input_required": result.state == INPUT_REQUIRED},
            now, result.session,
        )  # fmt: skip
    if result.state == FAILED:
        error = result.error or "the turn failed"
        retryable = result.retryable
    else:  # CANCELED: something other than this receiver interrupted the turn
        error = "the agent's turn was interrupted by something other than the receiver"
        retryable = result.retryable
    return Report(
        task_id, turn, epoch, "fail",
        {"epoch": epoch, "error": error, "retryable": retryable}, now, result.session,
    )  # fmt: skip


def refusal(task_id: str, turn: int, epoch: int, decision: Decision) -> Report:
    """A task this receiver will not run: failed, not retryable, naming the rule."""
    error = f"refused by the receiver ({decision.rule}): {decision.reason}"
    body = {"epoch": epoch, "error": error, "retryable": False}
    return Report(task_id, turn, epoch, "fail", body, time.time())


def malformed(lease: MalformedLease) -> Report | None:
    """The report of a lease this receiver will not run because it is malformed (None: its
    task id or epoch is unusable, so nothing can be reported; the lease runs out)."""
    if lease.task_id is None or lease.epoch is None:
        return None
    decision = refuse("malformed-lease", f"the relay handed a malformed lease: {lease.reason}")
    return refusal(lease.task_id, 0, lease.epoch, decision)


class TaskRun:
    """One lease of one task; :meth:`run` returns the report to deliver (None: nothing)."""

    def __init__(self, shared: Shared, lease: ClaimedTask, claimed_at: float) -> None:
        self.s = shared
        self.lease = lease
        self.claimed_at = claimed_at
        self.task = lease.task
        self.tid = lease.task_id
        self.epoch = lease.epoch
        self.turn = lease.turn
        self.capability = lease.capability
        self._quiet_until = 0.0
        self._outbox: Outbox | None = None
        self.sealed: SealedTurn | None = None

    def say(self, line: str) -> None:
        self.s.say(f"task {self.tid}: {line}")

    async def run(self) -> Report | None:
        spooled = await asyncio.to_thread(self.s.spool.get, self.tid, self.turn)
        if spooled is not None and spooled.kind in REUSABLE:
            report = spooled.under(self.epoch)
            await asyncio.to_thread(self.s.spool.put, report)
            self.say(
                f"turn {self.turn} already ran here ({spooled.kind}); reporting the spooled "
                "result instead of running it again"
            )
            return report
        if spooled is not None:
            await asyncio.to_thread(self.s.spool.drop, spooled)
        route = self.lease.route
        if route is None:
            return await self._refuse(no_route(self.capability, self.s.agent))
        judged = judge(route, self.capability, self.s.config)
        if not judged.decision or judged.cwd is None:
            return await self._refuse(judged.decision)
        try:  # a sealed task opens here or is never run
            self.sealed = await self._open()
        except NotOpened as exc:
            if not exc.retryable:
                return await self._refuse(exc.decision)
            self.say(f"not opened ({exc.decision.rule}): {exc.decision.reason}; handing it back")
            body = {"epoch": self.epoch, "retryable": True, "error": exc.decision.reason}
            return await self._spool(
                Report(self.tid, self.turn, self.epoch, "fail", body, time.time())
            )
        adapter = route.adapter
        session = route.session or None
        key = f"route:{session}" if session else None
        if key is None:
            return await self._execute(adapter, judged, session)
        # The relay already serialises a bound session's tasks; this lock keeps that true
        # on this machine even if the relay did not. It is not waited on for long: no
        # renewals run while waiting, and the relay hands out a session's next task only
        # after the last one ended (the wait covers the moment between a cancel-ack and
        # the end of the cancelled task's run here).
        lock = self.s.session_locks.setdefault(key, asyncio.Lock())
        try:
            await asyncio.wait_for(lock.acquire(), SESSION_WAIT)
        except TimeoutError:
            self.say(f"session {session} is busy with another task here; handing this one back")
            why = f"session {session} was busy with another task on the receiver"
            body = {"epoch": self.epoch, "retryable": True, "retry_after": SESSION_WAIT,
                    "error": why}  # fmt: skip
            return await self._spool(
                Report(self.tid, self.turn, self.epoch, "fail", body, time.time())
            )
        try:
            return await self._execute(adapter, judged, session)
        finally:
            lock.release()

    async def _open(self) -> SealedTurn | None:
        if self.s.unsealer is not None:
            return await self.s.unsealer.open(self.task, self.lease.payload, self.turn)
        if isinstance(self.lease.payload, dict) and is_sealed(self.lease.payload):
            raise NotOpened(refuse("sealed-key", "this receiver opens no sealed tasks"))
        return None

    async def _refuse(self, decision: Decision) -> Report:
        self.say(f"refused ({decision.rule}): {decision.reason}")
        return await self._spool(refusal(self.tid, self.turn, self.epoch, decision))

    async def _execute(self, adapter: str, judged: Judged, bound: str | None) -> Report | None:
        """Run the turn with the options the wall resolved (a bad option fails the turn at
        once, naming it)."""
        assert judged.cwd is not None
        cwd = judged.cwd
        try:
            runtime: Runtime = runtime_for(adapter, judged.options)
        except RuntimeConfigError as exc:
            return await self._spool(
                Report(self.tid, self.turn, self.epoch, "fail",
                       {"epoch": self.epoch, "error": str(exc), "retryable": False}, time.time())
            )  # fmt: skip
        if not await asyncio.to_thread(cwd.is_dir):
            return await self._spool(
                Report(self.tid, self.turn, self.epoch, "fail",
                       {"epoch": self.epoch, "retryable": False,
                        "error": f"the route's working directory {cwd} does not exist"},
                       time.time())
            )  # fmt: skip
        session = bound or self.s.sessions.get(self.tid)
        payload, history = self.lease.payload, self.lease.history
        if self.sealed is not None:
            payload = self.sealed.message
            try:
                history = earlier_turns(self.sealed, self.task, history)
            except NotOpened as exc:
                return await self._refuse(exc.decision)
        message, text, env = prompt.build(
            adapter, self.task, payload, history, fresh=session is None
        )
        turn = Turn(
            prompt=text,
            cwd=cwd,
            message=message,
            session=session,
            env=env,
        )
        if not await self._still_ours():
            return None
        self.s.board.start(
            Running(self.tid, self.capability, adapter, self.turn, self.lease.attempt, time.time())
        )
        self.say(
            f"started turn {self.turn} ({self.capability}, {adapter}, attempt "
            f"{self.task.get('attempt')}, from {message.sender})"
        )
        began = time.monotonic()
        try:
            outcome = await self._run_turn(runtime, turn)
        except asyncio.CancelledError:
            # the receiver is stopping: the adapter's processes are gone; hand the task back
            self.say("stopped with the receiver; handing the task back to the relay")
            await self._hand_back()
            raise
        finally:
            self.s.board.finish(self.tid)
        if isinstance(outcome, LeaseLost):
            await self._lost(outcome.reason)
            return None
        took = time.monotonic() - began
        detail = f": {short(outcome.error or '')}" if outcome.state == FAILED else ""
        self.say(f"turn {self.turn} {outcome.state} in {took:.1f} s{detail}")
        if outcome.state == INPUT_REQUIRED and outcome.session and not bound:
            await asyncio.to_thread(self.s.sessions.put, self.tid, outcome.session)
        elif outcome.state != INPUT_REQUIRED and not bound and self.s.sessions.get(self.tid):
            await asyncio.to_thread(self.s.sessions.forget, self.tid)
        report = report_of(outcome, self.tid, self.turn, self.epoch)
        if self.sealed is not None:
            report = self.sealed.report(report, self.task)
        return await self._spool(report)

    async def _still_ours(self) -> bool:
        """May the turn start under this lease? Not past the lease (counted from when the
        claim was sent, plus what the relay held it); past a third of it, only after a
        renewal says it still stands."""
        lease = self.s.config.lease_seconds
        held = time.monotonic() - self.claimed_at
        if held >= lease:
            self.say(
                f"not started: the lease may have run out ({held:.1f} s since it was taken, "
                f"lease {lease:g} s); the relay hands the task out again"
            )
            return False
        if held < lease / 3:
            return True
        sent = time.monotonic()
        try:
            out = await asyncio.wait_for(
                self.s.client.renew(self.tid, self.epoch, lease_seconds=lease),
                max(0.5, self.claimed_at + lease - sent),
            )
        except (ReceiverError, TimeoutError) as exc:
            self.say(f"not started: the lease could not be renewed first ({exc or 'timed out'})")
            return False
        if not out.ok:
            why = out.reason or out.outcome.value
            self.say(f"not started: the lease is no longer ours ({why})")
            if why == "cancelled":  # nothing ran: say so at once, freeing its session slot
                with contextlib.suppress(ReceiverError, TimeoutError):
                    await asyncio.wait_for(self.s.client.cancel_ack(self.tid, self.epoch), 10)
            return False
        self.claimed_at = sent
        return True

    async def _spool(self, report: Report) -> Report:
        await asyncio.to_thread(self.s.spool.put, report)
        hook = os.environ.get(TEST_HOOK, "")
        if hook.startswith("kill-after-spool"):
            self.s.spooled += 1
            _, _, count = hook.partition(":")
            if self.s.spooled >= int(count or 1):
                os.kill(os.getpid(), signal.SIGKILL)
        return report

    async def _emit(self, p: Progress) -> None:
        line = p.text or p.kind
        self.s.board.progress(self.tid, line)
        if p.kind != "usage":
            self.say(f"{p.kind}: {short(line, 160)}")
        if self.sealed is not None:  # a sealed turn's progress is content: it stays here
            return
        if p.kind == "status":
            kind, body = "status", {"message": agent_message(p.text)}
            if p.data:
                body["detail"] = dict(p.data)
        elif p.kind == "message":
            kind, body = "message", agent_message(p.text)
        elif p.kind == "artifact":
            if not p.data:
                return
            kind, body = "artifact", dict(p.data)
        else:  # usage: the caller sees what the turn cost, as a status line
            data = dict(p.data or {})
            said = ", ".join(f"{k} {v}" for k, v in data.items())
            kind, body = "status", {"message": agent_message(f"usage: {said}"), "usage": data}
        if self._outbox is not None:  # held and coalesced; sent by the turn's outbox task
            await self._outbox.put(kind, body)
        else:
            await self._send(kind, body)

    async def _send(self, kind: str, body: dict[str, Any]) -> None:
        """One progress event to the relay (not while quiet after a failed write)."""
        if time.monotonic() < self._quiet_until:
            return
        try:
            out = await asyncio.wait_for(
                self.s.client.progress(self.tid, self.epoch, kind, body), PROGRESS_TIMEOUT
            )
        except (ReceiverError, TimeoutError) as exc:
            self._quiet_until = time.monotonic() + PROGRESS_QUIET
            self.say(f"progress not sent ({exc or 'timed out'}); the turn goes on")
            return
        if out.lease_lost:
            raise LeaseLost(out.reason or "lease-lost")

    async def _run_turn(self, runtime: Runtime, turn: Turn) -> TurnResult | LeaseLost:
        """The adapter's turn beside the lease keeper, in one task group."""
        lost: list[LeaseLost] = []
        lease = self.s.config.lease_seconds
        interval = lease / 3

        async def keep(work: asyncio.Task[TurnResult]) -> None:
            deadline = self.claimed_at + lease
            next_at = self.claimed_at + interval
            failures = 0
            while True:
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                sent = time.monotonic()
                try:
                    out = await asyncio.wait_for(
                        self.s.client.renew(self.tid, self.epoch, lease_seconds=lease),
                        max(0.5, deadline - sent),
                    )
                except (ReceiverError, TimeoutError) as exc:
                    failures += 1
                    if isinstance(exc, ReceiverError) and exc.status == 401:
                        self.s.revoked(revoked_reason(exc))
                        lost.append(LeaseLost("revoked"))
                        work.cancel()
                        return
                    if time.monotonic() >= deadline:
                        self.say(
                            "renewals failed past the lease's expiry; stopping the turn "
                            "(self-fenced: another receiver may take the task over)"
                        )
                        lost.append(LeaseLost("self-fenced"))
                        work.cancel()
                        return
                    if failures == 1:
                        self.say(f"renewal failed ({exc or 'timed out'}); retrying")
                    next_at = time.monotonic() + min(1.0, interval)
                    continue
                failures = 0
                if out.ok:
                    deadline = sent + lease
                    next_at = sent + interval
                    continue
                lost.append(LeaseLost(out.reason or out.outcome.value))
                work.cancel()
                return

        work: asyncio.Task[TurnResult] | None = None
        outbox = self._outbox = Outbox(self._send, self.s.config.progress_debounce)
        try:
            async with asyncio.TaskGroup() as tg:
                work = tg.create_task(runtime.run(turn, self._emit))
                keeper = tg.create_task(keep(work))
                sender = tg.create_task(outbox.run())

                def ended(done: asyncio.Task[TurnResult]) -> None:
                    # The group exits only after the outbox sent what it keeps, so no
                    # progress can follow the turn's report. A stopped turn's progress is
                    # not sent at all (its lease is gone or the receiver is stopping).
                    keeper.cancel()
                    if done.cancelled():
                        sender.cancel()
                    else:
                        outbox.close()

                work.add_done_callback(ended)
        except* LeaseLost as group:
            first = group.exceptions[0]
            assert isinstance(first, LeaseLost)
            lost.insert(0, first)
        finally:
            self._outbox = None
        if lost:
            return lost[0]
        assert work is not None
        return work.result()

    async def _lost(self, reason: str) -> None:
        if reason == "cancelled":
            self.say("cancelled by the caller; the adapter was stopped")
            try:
                await asyncio.wait_for(self.s.client.cancel_ack(self.tid, self.epoch), 10)
            except (ReceiverError, TimeoutError) as exc:
                self.say(f"cancel-ack not sent ({exc or 'timed out'}); the relay's grace covers it")
        else:
            self.say(f"lease lost ({reason}); the adapter was stopped and its result dropped")

    async def _hand_back(self) -> None:
        """On shutdown: fail the turn retryably so the task is queued again at once rather
        than after its lease runs out (bounded; a relay that cannot be told waits it out)."""
        body = {"epoch": self.epoch, "retryable": True, "retry_after": 0,
                "error": "the receiver was stopped while the task ran"}  # fmt: skip
        with contextlib.suppress(ReceiverError, TimeoutError, asyncio.CancelledError):
            await asyncio.shield(asyncio.wait_for(self.s.client.report(self.tid, "fail", body), 5))
