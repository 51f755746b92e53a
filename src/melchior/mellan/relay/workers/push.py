"""Delivering push notifications: the outbox, POSTed to the callers' webhooks.

Every replica runs one :class:`Pusher` in its lifespan's task group. It leases due outbox
rows from the store (the store keeps them in order per config and never hands one row to
two deliverers at once), renders each as the ``StreamResponse`` objects a stream would
have shown (:mod:`.a2a.notifications`), and POSTs them one by one:

- **Authentication** as A2A defines it — ``Authorization: {scheme} {credentials}`` from
  the config's ``authentication``, ``X-A2A-Notification-Token`` with its ``token`` — plus
  an HMAC-SHA256 signature over timestamp and body (:mod:`melchior.mellan.signing`) with
  the secret of the agent that sent the task, and ``X-Mellan-Delivery``: an id stable
  across retries (``{row}.{n}``) for the receiver to drop duplicates by.
- **Safety** (:mod:`.outbound`, shared with wake-ups): the URL is checked again
  (:func:`melchior.policy.outbound.check_url`), its host resolved and every address
  checked (``check_addresses``); the request then goes to the address checked — never
  to a second lookup that could answer differently — with the original ``Host`` and TLS
  server name. No redirects; at most :data:`MAX_RESPONSE` bytes of an answer are read;
  each POST is bounded by :data:`TIMEOUT`.
- **A failing endpoint never slows the rest**: at most :data:`PER_HOST` deliveries to one
  endpoint (host and port) are in flight; a row for a busy one is handed back for a
  moment rather than waited on, so other endpoints' rows take the free slots.
- **Retries**: connection failures, timeouts, 408, 425, 429 and 5xx are retried with
  exponential backoff (:func:`backoff`) until the row is :data:`MAX_AGE` old; other 4xx
  answers and refusals by the address policy give the row up at once. A given-up row is
  kept with its last error (the task's timeline shows it); the config's next row goes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx

from melchior.mellan.relay.notify import PUSH_TOPIC, task_topic
from melchior.mellan.relay.outbound import Failed, Refused, Resolver, post_checked, resolve
from melchior.mellan.relay.store.base import PushDelivery, Store, StoreError
from melchior.mellan.relay.surfaces.a2a import jsontext
from melchior.mellan.relay.surfaces.a2a.notifications import messages
from melchior.mellan.signing import sign
from melchior.mellan.transport import public_roots

if TYPE_CHECKING:
    from melchior.mellan.relay.context import Relay

log = logging.getLogger("melchior.mellan.push")

CONCURRENCY = 32
"""Deliveries in flight per replica, at most."""
PER_HOST = 4
"""Deliveries in flight to one endpoint (host and port), at most."""
TIMEOUT = 10.0
"""Seconds one POST may take, connecting included."""
LEASE = 120.0
"""Seconds a leased row stays this replica's (a row is a few POSTs, each ≤ TIMEOUT)."""
MAX_AGE = 24 * 3600.0
"""Seconds after which a row still failing is given up."""
MAX_RESPONSE = 64 * 1024
"""Bytes of a webhook's answer read at most (only its status matters)."""
POLL = 1.0
"""Seconds between looks at the outbox when nothing wakes the pusher (other replicas'
changes, retries coming due)."""
MIN_GAP = 0.05
"""Seconds between two looks at least, however often changes wake it."""
RETRY_STATUSES = frozenset({408, 425, 429})
CONTENT_TYPE = "application/a2a+json"


def backoff(attempts: int, rng: random.Random | None = None) -> float:
    """Seconds before the next try after ``attempts`` failures: 1, 2, 4 … capped at five
    minutes, with up to 20% jitter so many failing rows do not retry in lockstep."""
    base = min(2.0 ** max(attempts - 1, 0), 300.0)
    return base * (1 + 0.2 * (rng or random).random())


def _age_seconds(created_at: str) -> float:
    made = datetime.fromisoformat(created_at.replace("Z", "+00:00"))
    return (datetime.now(UTC) - made).total_seconds()


class Pusher:
    """One replica's deliverer (see the module docstring)."""

    def __init__(
        self,
        relay: Relay,
        *,
        owner: str | None = None,
        resolver: Resolver = resolve,
        timeout: float = TIMEOUT,
        poll: float = POLL,
        retry_scale: float = 1.0,
    ) -> None:
        self.relay = relay
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.resolver = resolver
        self.timeout = timeout
        self.poll = poll
        self.retry_scale = retry_scale  # tests shorten the backoff; 1.0 in service
        self.delivered = 0
        self.failed = 0
        self._hosts: dict[str, int] = {}
        self._inflight = 0
        self._slot_freed = asyncio.Event()

    @property
    def store(self) -> Store:
        return self.relay.store

    def start(self, group: asyncio.TaskGroup) -> asyncio.Task[None]:
        return group.create_task(self.run(), name="mellan-pusher")

    async def run(self) -> None:
        """Lease and deliver until cancelled; deliveries in flight are cancelled with it
        (their rows' leases lapse and another replica, or this one restarted, sends them)."""
        limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=8)
        timeout = httpx.Timeout(self.timeout)
        async with (
            httpx.AsyncClient(
                timeout=timeout,
                limits=limits,
                follow_redirects=False,
                trust_env=False,
                verify=public_roots(),
            ) as http,
            asyncio.TaskGroup() as deliveries,
        ):
            while True:
                await self._wait()
                free = CONCURRENCY - self._inflight
                if free <= 0:
                    continue
                try:
                    if not await self.relay.call(self.store.pushes_due):
                        continue
                    rows = await self.relay.call(
                        self.store.claim_pushes, self.owner, limit=free, lease_seconds=LEASE
                    )
                except StoreError as exc:
                    log.warning("push outbox unavailable (will retry): %s", exc)
                    continue
                for row in rows:
                    self._inflight += 1
                    deliveries.create_task(self._one(http, row), name=f"push-{row.id}")

    async def _wait(self) -> None:
        """Until something may be due: a change on this replica (the store's wake-up), a
        slot freed while rows wait, or the poll interval; then MIN_GAP more, so a burst of
        changes is looked at once — and the look (a thread hop and a query) stays out of
        the way of the write that woke it, whose stream is being served right then."""
        waiter = self.relay.notifier.listen(PUSH_TOPIC, self.poll)
        freed: asyncio.Future[bool] = asyncio.ensure_future(self._slot_freed.wait())
        try:
            await asyncio.wait({waiter, freed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for f in (waiter, freed):
                f.cancel()
            # Wait for both to end, their own cancellation collected as a result; a
            # cancellation of *this* task meanwhile still propagates. (Awaiting each under
            # suppress(BaseException) swallowed it when the relay's shutdown cancelled the
            # pusher right then, and the pusher looped on: the relay never stopped.)
            await asyncio.gather(waiter, freed, return_exceptions=True)
            self._slot_freed.clear()
        await asyncio.sleep(MIN_GAP)

    async def _one(self, http: httpx.AsyncClient, row: PushDelivery) -> None:
        parts = urlsplit(row.config.url)
        host = f"{parts.hostname}:{parts.port or ''}"  # one endpoint: host and port
        try:
            if self._hosts.get(host, 0) >= PER_HOST:  # hand it back; others take the slot
                await self.relay.call(
                    self.store.push_failed, row.id, self.owner,
                    f"waiting: {PER_HOST} deliveries to {parts.netloc} are in flight",
                    retry_in=self.timeout / 2, counted=False,
                )  # fmt: skip
                return
            self._hosts[host] = self._hosts.get(host, 0) + 1
            try:
                await self._deliver(http, row)
            finally:
                self._hosts[host] -= 1
                if not self._hosts[host]:
                    del self._hosts[host]
        except Exception as exc:  # a store outage: the lease lapses and the row comes back
            log.warning("push %d: %s (the row will be retried)", row.id, exc)
        finally:
            self._inflight -= 1
            self._slot_freed.set()

    async def _deliver(self, http: httpx.AsyncClient, row: PushDelivery) -> None:
        try:
            bodies = await self.relay.call(_render, self.store, row)
            if bodies is None:
                raise Refused("the task is gone")
            for n in range(row.sent, len(bodies)):
                await self._post(http, row, n, bodies[n])
                if n + 1 < len(bodies):
                    await self.relay.call(self.store.push_sent, row.id, self.owner, n + 1)
        except Refused as exc:
            self.failed += 1
            log.info("push %d to %s given up: %s", row.id, row.config.url, exc)
            await self.relay.call(
                self.store.push_failed, row.id, self.owner, str(exc), retry_in=None
            )
        except Failed as exc:
            self.failed += 1
            retry = exc.retry and _age_seconds(row.created_at) < MAX_AGE
            wait = backoff(row.attempts + 1) * self.retry_scale if retry else None
            log.info(
                "push %d to %s failed (%s); %s", row.id, row.config.url, exc,
                f"retry in {wait:.1f} s" if wait is not None else "given up",
            )  # fmt: skip
            await self.relay.call(
                self.store.push_failed, row.id, self.owner, str(exc), retry_in=wait
            )
        else:
            self.delivered += 1
            await self.relay.call(self.store.push_delivered, row.id, self.owner)
        # the task's page on the dashboard shows its push rows: let it redraw (any replica)
        self.relay.notifier.publish(task_topic(row.config.task_id))

    async def _post(self, http: httpx.AsyncClient, row: PushDelivery, n: int, body: bytes) -> None:
        config = row.config
        headers = {
            "Content-Type": CONTENT_TYPE,
            "User-Agent": "mellan-push/1",
            "X-Mellan-Delivery": f"{row.id}.{n}",
            "X-Mellan-Task": config.task_id,
            **sign(row.secret, body, time.time()),
        }
        if config.token:
            headers["X-A2A-Notification-Token"] = config.token
        if config.auth_scheme and config.auth_credentials:
            headers["Authorization"] = f"{config.auth_scheme} {config.auth_credentials}"
        status = await post_checked(
            http, config.url, body, headers, allow_private=row.allow_private,
            resolver=self.resolver, timeout=self.timeout, max_response=MAX_RESPONSE,
        )  # fmt: skip
        if 200 <= status < 300:
            return
        if status >= 500 or status in RETRY_STATUSES:
            raise Failed(f"HTTP {status}", retry=True)
        raise Failed(f"HTTP {status} (the endpoint refuses it; not retried)", retry=False)


def _render(store: Store, row: PushDelivery) -> list[bytes] | None:
    """The row's bodies, read in a worker thread (None: the task no longer exists)."""
    config = row.config
    task = store.get_task(config.workspace, config.task_id)
    if task is None:
        return None
    turns = store.turns(task.id) if task.turn > 1 else []
    events = store.events_after(task.id, 0)
    said = messages(task, turns, events, row.before, row.mark, row.created_at)
    return [jsontext.dumpb(m) for m in said]
