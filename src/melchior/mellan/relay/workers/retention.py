"""The replica's retention job: finished tasks older than ``--retain-days`` are deleted.

Runs in the app's lifespan task group when the operator asked for retention (by default
the relay keeps every task). Every ``interval`` it goes through the workspaces and purges
batch after batch (:meth:`~.store.base.Store.purge_finished`: a batch is one transaction,
oldest finished first, audit kept) until a batch comes back short, pausing between
batches so receivers and callers get the database too. Every replica runs the job;
the store lets one purge at a time and the others skip their turn (``busy``), so
several replicas never fight over the same rows. A database outage is logged and the
job tries again at its next round.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from melchior.mellan.relay.store.base import Record

if TYPE_CHECKING:
    from melchior.mellan.relay.context import Relay

log = logging.getLogger("melchior.mellan.retention")

DAY = 86400.0
INTERVAL = 3600.0
"""Seconds between rounds."""
PAUSE = 0.05
"""Seconds between two batches of one round."""

PURGE = Record(
    actor="system:retention",
    action="task.purge",
    rule="retention",
    reason="finished longer ago than the relay's --retain-days",
)


async def purge_round(relay: Relay, retain_days: float, *, batch: int = 500) -> int:
    """One round over every workspace; the number of tasks deleted."""
    total = 0
    workspaces = await relay.call(relay.store.workspaces)
    for workspace in workspaces:
        while True:
            done = await relay.call(
                relay.store.purge_finished, workspace, retain_days * DAY, limit=batch,
                record=PURGE,
            )  # fmt: skip
            total += done.deleted
            if done.busy:
                log.info("retention: another replica is purging; skipping this round")
                return total
            if done.deleted < batch:
                break
            await asyncio.sleep(PAUSE)
    return total


async def keep_tasks_for(
    relay: Relay, retain_days: float, *, interval: float = INTERVAL, first: float = 30.0
) -> None:
    """Purge every ``interval`` seconds, the first round ``first`` seconds after start."""
    delay = first
    while True:
        await asyncio.sleep(delay)
        delay = interval
        try:
            deleted = await purge_round(relay, retain_days)
        except Exception as exc:
            log.warning("retention round failed (will retry in %.0f s): %s", interval, exc)
            continue
        if deleted:
            log.info("retention: deleted %d task(s) finished over %g day(s) ago",
                     deleted, retain_days)  # fmt: skip
