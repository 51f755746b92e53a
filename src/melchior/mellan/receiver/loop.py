"""The receiver process: claim, run, report — outbound only, under one task group.

Beside the destination agent, with no inbound listener (the optional wake webhook
aside): it long-polls the relay's receiver API with the agent credential for work,
runs each task with the configured adapter (:mod:`melchior.mellan.receiver.runner`),
and delivers each result through the spool (:mod:`melchior.mellan.receiver.reporter`).

Structured concurrency: one ``asyncio.TaskGroup`` owns everything the receiver runs —
the claim loop, each task, each report delivery, the status writer, the wake listener —
and each task runs its adapter and its lease keeper in a task group of its own. Nothing
outlives the group: stopping the receiver stops every adapter's process group and hands
running tasks back to the relay.

Order at start: check the credential (a revoked one stops here, with the reason), then
report every spooled result (first attempt of each) before claiming anything new. At
most ``concurrency`` tasks run at once; a claim asks only for free slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from typing import TextIO

from melchior import __version__
from melchior.mellan.client.receiver import (
    AsyncReceiverClient,
    ClaimedTask,
    MalformedLease,
    ReceiverError,
)
from melchior.mellan.ids import AGENT_ID
from melchior.mellan.receiver.config import ReceiverConfig
from melchior.mellan.receiver.reporter import Reporter, Revoked, backoff, revoked_reason
from melchior.mellan.receiver.runner import Shared, TaskRun, malformed
from melchior.mellan.receiver.sealed import Unsealer
from melchior.mellan.receiver.sessions import Sessions
from melchior.mellan.receiver.spool import Report, Spool
from melchior.mellan.receiver.status import Board
from melchior.mellan.receiver.wake import WakeError, serve_wake
from melchior.runtimes import RuntimeConfigError, preflight

EXIT_OK = 0
EXIT_REVOKED = 77
"""EX_NOPERM: the relay refuses our credential. The systemd unit does not restart on it."""
EXIT_CONFIG = 78
"""EX_CONFIG: the configuration is wrong. Not restarted either."""
EXIT_UNREACHABLE = 3

STATE_SOON = 0.05
"""The least time between two writes of the status file for tasks starting or ending (at
most 20 a second, however many tasks a second the receiver runs)."""
STATE_EVERY = 0.5
"""How often other changes (progress, reports pending) are written, at most."""
STATE_HEARTBEAT = 5.0


class _Refused(Exception):
    """The relay refuses to hand this receiver work for a reason retrying cannot fix."""


class _Stopped(Exception):
    """The claim loop ended because the receiver is stopping."""


class Receiver:
    def __init__(self, config: ReceiverConfig, out: TextIO | None = sys.stdout) -> None:
        self.config = config
        self.client = AsyncReceiverClient(config.relay, config.token, tls=config.client_tls())
        self.spool = Spool(config.spool_dir)
        self.board = Board(config.state_file, config.name, config.relay, out)
        self.sessions = Sessions(config.state_dir / "sessions.json")
        self.reporter = Reporter(self.client, self.spool, self.board.say)
        self.wake = asyncio.Event()
        self.slot_free = asyncio.Event()
        self.stopping: str | None = None
        self.exit_code = EXIT_OK
        self.running = 0
        self._main: asyncio.Task[int] | None = None
        self._supervising = False
        self._told_poll = False
        self._delivering: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.shared = Shared(
            config=config,
            client=self.client,
            spool=self.spool,
            board=self.board,
            sessions=self.sessions,
            agent=config.name,
            revoked=self.revoked,
            unsealer=Unsealer(config, self.client),
        )

    def say(self, line: str) -> None:
        self.board.say(line)

    def stop(self, reason: str, code: int = EXIT_OK) -> None:
        """Stop claiming and end the receiver (running tasks are stopped and handed back)."""
        if self.stopping is None:
            self.stopping = reason
            self.exit_code = code
            self.board.stopped = reason
            self.board.claiming = False
            self.board.dirty = True
            self.say(f"stopping: {reason}")
        if self._main is not None and self._supervising:
            self._main.cancel()

    def revoked(self, reason: str) -> None:
        self.stop(reason, EXIT_REVOKED)

    async def run(self) -> int:
        """Run until stopped; the exit status (0, or why it had to stop)."""
        self._main = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop, f"signal {sig.name}")
        try:
            try:  # the coding agents' CLIs first: a release out of range is a config error
                local = self.config.allow.adapters, self.config.adapters
                clis = await asyncio.to_thread(preflight, *local)
            except RuntimeConfigError as exc:
                self.say(f"cannot start: {exc}")
                return EXIT_CONFIG
            try:
                me = await self.client.whoami()
            except ReceiverError as exc:
                if exc.status == 401:
                    self.say(f"stopping: {revoked_reason(exc)}")
                    return EXIT_REVOKED
                self.say(f"cannot start: {exc}")
                return EXIT_UNREACHABLE
            if me.get("kind") != "agent":
                self.say("cannot start: the credential is not an agent credential (mellan join)")
                return EXIT_CONFIG
            subject = me.get("subject")
            if not isinstance(subject, str) or not AGENT_ID.match(subject):
                self.say(
                    f"cannot start: the relay names this agent {subject!r:.80}, not an agent id"
                )
                return EXIT_CONFIG
            self.board.agent = self.shared.agent = subject
            self.say(
                f"receiver for {self.board.agent} on {self.config.relay} (pid {os.getpid()}, "
                f"{self.config.concurrency} at a time, adapters "
                f"{', '.join(sorted(self.config.allow.adapters)) or 'none'})"
                + "".join(f"; {cli}" for cli in clis)
            )
            for notice in self.config.notices:
                self.say(notice)
            try:
                await self._supervise()
            except asyncio.CancelledError:
                if self.stopping is None:
                    raise
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.board.save)
            await self.client.aclose()
        return self.exit_code

    async def _supervise(self) -> None:
        """Everything the receiver runs, under its one task group."""
        self._supervising = True
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._keep_state())
                if self.config.wake is not None:
                    tg.create_task(serve_wake(self.config.wake, self.wake, self.say))
                await self._report_spooled(tg)
                await self._claim_loop(tg)
                raise _Stopped  # asked to stop before the group was watched: end it all
        except* _Stopped:
            pass
        except* _Refused as group:
            self._supervising = False
            self.stop(str(group.exceptions[0]), EXIT_CONFIG)
        except* WakeError as group:
            self._supervising = False
            self.stop(str(group.exceptions[0]), EXIT_CONFIG)
        except* Revoked as group:
            first = group.exceptions[0]
            assert isinstance(first, Revoked)
            self._supervising = False
            self.stop(first.reason, EXIT_REVOKED)
        finally:
            self._supervising = False

    async def _keep_state(self) -> None:
        """Write the status file: at once when a task starts or ends (``Board.urgent``;
        at most every ``STATE_SOON``), other changes at most every ``STATE_EVERY``, and
        every ``STATE_HEARTBEAT`` anyway (its ``updated_at`` says the receiver is alive)."""
        urged = asyncio.Event()
        self.board.on_urgent = urged.set
        last = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(urged.wait(), STATE_EVERY)
            urged.clear()
            now = time.monotonic()
            if self.board.urgent and now - last < STATE_SOON:
                await asyncio.sleep(STATE_SOON - (now - last))
                now = time.monotonic()
            due = self.board.dirty and now - last >= STATE_EVERY
            if self.board.urgent or due or now - last >= STATE_HEARTBEAT:
                last = now
                try:
                    await asyncio.to_thread(self.board.save)
                except OSError as exc:
                    self.say(f"cannot write the status file {self.board.path}: {exc}")

    def _deliver(
        self, tg: asyncio.TaskGroup, report: Report, first: asyncio.Event | None = None
    ) -> None:
        async def go() -> None:
            self.board.reporting += 1
            self.board.dirty = True
            try:
                await self.reporter.deliver(report, first)
            finally:
                self.board.reporting -= 1
                self.board.dirty = True
                if self._delivering.get(key) is me:
                    del self._delivering[key]

        # A report for a turn supersedes one still being delivered for it (the task came
        # back under a new lease while the old report was retrying): one delivery per turn.
        key = (report.task_id, report.turn)
        old = self._delivering.get(key)
        if old is not None:
            old.cancel()
        me = tg.create_task(go())
        self._delivering[key] = me

    async def _report_spooled(self, tg: asyncio.TaskGroup) -> None:
        """Every spooled report gets its first attempt before anything new is claimed."""
        await asyncio.to_thread(self.spool.collect)
        pending = await asyncio.to_thread(self.spool.pending)
        if not pending:
            return
        self.say(f"reporting {len(pending)} spooled result(s) before claiming new work")
        firsts = []
        for report in pending:
            first = asyncio.Event()
            firsts.append(first)
            self._deliver(tg, report, first)
        for first in firsts:
            await first.wait()

    async def _sleep(self, seconds: float) -> None:
        """Sleep, or less when a wake-up arrived since the last claim was sent."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), seconds)

    async def _claim_loop(self, tg: asyncio.TaskGroup) -> None:
        failures = 0
        while self.stopping is None:
            free = self.config.concurrency - self.running
            if free <= 0:
                self.slot_free.clear()
                await self.slot_free.wait()
                continue
            self.board.claiming = True
            self.wake.clear()  # a wake-up from now on is news to the claim after this one
            sent = time.monotonic()
            try:
                leases = await self.client.claim(
                    limit=free,
                    wait=self.config.wait,
                    lease_seconds=self.config.lease_seconds,
                    worker=self.config.worker,
                    extra={"receiver": self._about()},
                    agent=self.shared.agent,
                )
            except ReceiverError as exc:
                if exc.status == 401:
                    raise Revoked(revoked_reason(exc)) from exc
                if exc.status == 403:  # an owner credential, or no client certificate (mTLS)
                    raise _Refused(
                        f"the relay refuses this receiver's claims: {exc.reason} ({exc.code})"
                    ) from exc
                failures += 1
                delay = backoff(failures)
                if failures == 1 or failures % 10 == 0:
                    self.say(f"cannot claim ({exc}); retrying in {delay:.1f} s")
                await self._sleep(delay)
                continue
            if failures:
                self.say("the relay answers again")
            failures = 0
            for lease in leases:
                if isinstance(lease, MalformedLease):
                    await self._malformed(tg, lease)
                else:  # the lease began no earlier than this (the relay held the claim)
                    self._start(tg, lease, sent + lease.waited)
            if not leases and self.config.wait == 0:
                self.board.claiming = False
                if not self._told_poll:
                    self._told_poll = True
                    self.say(
                        f"no work; claiming again every {self.config.poll:g} s "
                        "(sooner on a wake-up)"
                    )
                await self._sleep(self.config.poll)

    def _about(self) -> dict[str, object]:
        """What the receiver says about itself with each claim (the relay shows it)."""
        return {
            "name": self.config.name,
            "version": __version__,
            "adapters": sorted(self.config.allow.adapters),
            "running": self.running,
            "concurrency": self.config.concurrency,
        }

    async def _malformed(self, tg: asyncio.TaskGroup, lease: MalformedLease) -> None:
        """A lease that fails its checks is never run: reported as a failure naming the
        field when its task can be named, else left to run out."""
        report = malformed(lease)
        if report is None:
            self.say(f"refused a malformed lease it cannot report ({lease.reason}); it runs out")
            return
        self.say(f"task {lease.task_id}: refused (malformed-lease): {lease.reason}")
        await asyncio.to_thread(self.spool.put, report)
        self._deliver(tg, report)

    def _start(self, tg: asyncio.TaskGroup, lease: ClaimedTask, claimed_at: float) -> None:
        self.running += 1

        async def go() -> None:
            report = None
            try:
                report = await TaskRun(self.shared, lease, claimed_at).run()
            except Exception:  # a bug must not take the other tasks down; the lease expires
                import traceback

                self.say(
                    f"task {lease.task_id}: internal error; its lease will run out and the relay "
                    f"retries it:\n{traceback.format_exc().rstrip()}"
                )
            finally:
                self.running -= 1
                self.slot_free.set()
            if report is not None:
                self._deliver(tg, report)

        tg.create_task(go())


def run(config: ReceiverConfig, out: TextIO | None = sys.stdout) -> int:
    try:
        receiver = Receiver(config, out)
    except ReceiverError as exc:  # the TLS settings do not load, or plain HTTP elsewhere
        print(f"mellan receiver: {exc.reason}", file=sys.stderr)
        return EXIT_CONFIG
    return asyncio.run(receiver.run())
