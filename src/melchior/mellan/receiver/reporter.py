"""Completion delivery: report a spooled result until the relay acknowledges it.

Separate from execution on purpose (seed 002: "retries reporting that completion rather
than running the successful work again"). A report is retried with exponential backoff
(with jitter, capped) for as long as the relay is unreachable or answers 5xx/429; the
work is never run again for it. What ends a report:

============================  ==================================================
the relay's answer            what happens to the spool entry
============================  ==================================================
``ok`` / ``duplicate``        acknowledged: dropped
``lease-lost`` finished       the task already ended (another report won): dropped
``lease-lost`` cancelled      the caller cancelled it meanwhile: dropped
``lease-lost`` expired /      the lease ran out while the relay could not be told:
stale-epoch                   parked (kept, not reported) in case the task is
                              leased here again, when it is reported instead of run
``not-found``                 the task is gone or not ours: dropped
401                           our credential is revoked: the receiver stops
other 4xx                     the relay refuses the body itself (too large, …): the
                              report becomes a failure saying so, reported once
============================  ==================================================

Each of these is a line on the terminal/journal.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from melchior.mellan.client.receiver import AsyncReceiverClient, ReceiverError
from melchior.mellan.outcome import Outcome
from melchior.mellan.receiver.spool import Report, Spool

BACKOFF_FIRST = 0.5
BACKOFF_CAP = 30.0
DROP_REASONS = ("finished", "cancelled")


class Revoked(Exception):
    """The relay refuses our credential (401): stop claiming, and say why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def backoff(attempt: int) -> float:
    """Equal-jitter exponential backoff: 0.5 s doubling, capped at 30 s."""
    ceiling: float = min(BACKOFF_CAP, BACKOFF_FIRST * 2.0 ** max(0, attempt - 1))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def revoked_reason(exc: ReceiverError) -> str:
    return (
        f"the relay refuses this receiver's credential ({exc.reason}); it was revoked or "
        "expired. Ask the workspace owner for a new enrollment code ('mellan enroll AGENT'), "
        "run 'mellan join CODE --relay URL' here, and start the receiver again"
    )


class Reporter:
    """Delivers spooled reports; one call of :meth:`deliver` per report."""

    def __init__(
        self, client: AsyncReceiverClient, spool: Spool, say: Callable[[str], None]
    ) -> None:
        self.client = client
        self.spool = spool
        self.say = say

    async def deliver(self, report: Report, first_try: asyncio.Event | None = None) -> str:
        """Report until acknowledged; returns how it ended (``acknowledged``, ``dropped``,
        ``parked``). ``first_try`` is set once the first attempt has been made."""
        tid = report.task_id
        attempt = 0
        converted = False
        try:
            while True:
                attempt += 1
                try:
                    out = await self.client.report(tid, report.verb, report.body)
                except ReceiverError as exc:
                    if exc.status == 401:
                        raise Revoked(revoked_reason(exc)) from exc
                    if 400 <= exc.status < 500 and exc.status not in (408, 429):
                        if converted or report.verb == "fail":
                            self.say(
                                f"task {tid}: the relay refused the report ({exc}); dropped it"
                            )
                            await asyncio.to_thread(self.spool.drop, report)
                            return "dropped"
                        converted = True
                        report = Report(
                            tid, report.turn, report.epoch, "fail",
                            {"epoch": report.epoch, "retryable": False,
                             "error": f"the relay refused this task's result: {exc.reason}"},
                            report.spooled_at, report.session,
                        )  # fmt: skip
                        await asyncio.to_thread(self.spool.put, report)
                        continue
                    if first_try is not None:
                        first_try.set()
                    delay = backoff(attempt)
                    if attempt == 1 or attempt % 10 == 0:
                        self.say(
                            f"task {tid}: reporting failed ({exc}); retrying in {delay:.1f} s "
                            f"(the result is kept in the spool)"
                        )
                    await asyncio.sleep(delay)
                    continue
                if out.ok:
                    await asyncio.to_thread(self.spool.drop, report)
                    word = (
                        "duplicate: already recorded" if out.outcome is Outcome.DUPLICATE else "ok"
                    )
                    self.say(f"task {tid}: {report.verb} acknowledged ({word})")
                    return "acknowledged"
                if out.outcome is Outcome.LEASE_LOST and out.reason not in DROP_REASONS:
                    await asyncio.to_thread(self.spool.park, report)
                    self.say(
                        f"task {tid}: lease lost ({out.reason}) before the {report.verb} was "
                        "recorded; kept the result in case the task comes back here"
                    )
                    return "parked"
                await asyncio.to_thread(self.spool.drop, report)
                why = out.reason or out.outcome.value
                self.say(f"task {tid}: {report.verb} not recorded ({why}); dropped the spool entry")
                return "dropped"
        finally:
            if first_try is not None:
                first_try.set()
