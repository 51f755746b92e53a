"""Wake-ups: a signed POST to a receiver's webhook when work is queued for its agent.

A receiver long-polls, so it learns of work within one poll anyway; a wake-up only lets
an operator run receivers that poll rarely (or sleep) and still start at once. It is
configured per agent by the owner (``mellan agent wake AGENT URL``) and is best effort
in every way:

- **Nothing of the task leaves**: the body is ``{"agent", "workspace", "queued_at"}``,
  signed with the agent's *wake secret* (HMAC-SHA256 over timestamp and body,
  ``X-Mellan-Timestamp``/``X-Mellan-Signature``, :mod:`melchior.mellan.signing`); the
  receiver then claims as usual, with its own credential.
- **Never in the send's way**: :meth:`Waker.poke` only notes the agent and returns; the
  POSTs are made by the waker's own task (run by the app's lifespan).
- **Coalesced**: at most one POST in flight per agent and at most one per
  :data:`GAP` second; pokes meanwhile are folded into one more wake-up after it. A
  thousand sends in a second cost the webhook two requests.
- **Guarded like push notifications** (:mod:`.outbound`): the URL and every address it
  resolves to are checked against :mod:`melchior.policy.outbound` (private addresses
  only if the workspace allows them, ``mellan push private on``), the request goes to
  the checked address, no redirects, bounded time and answer.
- **Not retried**: a failed wake-up is logged; the receiver's next poll finds the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import httpx

from melchior.mellan.relay.outbound import Failed, Refused, Resolver, post_checked, resolve
from melchior.mellan.relay.store.base import StoreError
from melchior.mellan.signing import sign
from melchior.mellan.transport import public_roots

if TYPE_CHECKING:
    from melchior.mellan.relay.context import Relay

log = logging.getLogger("melchior.mellan.wake")

GAP = 1.0
"""Seconds between two wake-ups of one agent, at least."""
TIMEOUT = 5.0
"""Seconds one wake-up POST may take."""
CONCURRENCY = 16
"""Wake-ups in flight per replica, at most (each agent has one at most)."""
MAX_PENDING = 10_000
"""Agents waiting for a wake-up per replica, at most; past it pokes are dropped (the
receivers still find their work by polling)."""

Key = tuple[str, str]  # (workspace, agent)


def _iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Waker:
    """One replica's wake-up sender (see the module docstring)."""

    def __init__(
        self,
        relay: Relay,
        *,
        resolver: Resolver = resolve,
        gap: float = GAP,
        timeout: float = TIMEOUT,
    ) -> None:
        self.relay = relay
        self.resolver = resolver
        self.gap = gap
        self.timeout = timeout
        self.sent = 0
        self.failed = 0
        self._pending: dict[Key, str] = {}  # agent → when its first waiting poke came
        self._inflight: set[Key] = set()
        self._last: dict[Key, float] = {}
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(CONCURRENCY)

    def poke(self, workspace: str, agent: str) -> None:
        """Work was queued for ``agent``: wake its receiver soon. Never blocks, never fails."""
        key = (workspace, agent)
        if key not in self._pending and len(self._pending) >= MAX_PENDING:
            return
        self._pending.setdefault(key, _iso_now())
        self._wake.set()

    def start(self, group: asyncio.TaskGroup) -> asyncio.Task[None]:
        return group.create_task(self.run(), name="mellan-waker")

    async def run(self) -> None:
        async with (
            httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout),
                follow_redirects=False,
                trust_env=False,
                verify=public_roots(),
            ) as http,
            asyncio.TaskGroup() as sends,
        ):
            while True:
                pause = self._dispatch(http, sends)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), pause)

    def _dispatch(self, http: httpx.AsyncClient, sends: asyncio.TaskGroup) -> float | None:
        """Start the wake-ups that may go now; seconds until the next one may (None: none
        waits on the clock, only on a poke or a send finishing)."""
        now = time.monotonic()
        pause: float | None = None
        for key in list(self._pending):
            if key in self._inflight:
                continue  # one in flight per agent; it is sent again once that one ends
            wait = self._last.get(key, -self.gap) + self.gap - now
            if wait > 0:
                pause = wait if pause is None else min(pause, wait)
                continue
            queued_at = self._pending.pop(key)
            self._inflight.add(key)
            self._last[key] = now
            sends.create_task(self._send(http, key, queued_at), name=f"wake-{key[1]}")
        if len(self._last) > MAX_PENDING:  # forget agents not woken for a while
            self._last = {k: t for k, t in self._last.items() if now - t < self.gap}
        return pause

    async def _send(self, http: httpx.AsyncClient, key: Key, queued_at: str) -> None:
        workspace, agent = key
        try:
            async with self._slots:
                target = await self.relay.call(self.relay.store.wake_target, workspace, agent)
                if target is None:
                    return
                url, secret, allow_private = target
                body = json.dumps(
                    {"agent": agent, "workspace": workspace, "queued_at": queued_at},
                    separators=(",", ":"),
                ).encode()
                headers = {
                    "Content-Type": "application/json",
                    "User-Agent": "mellan-wake/1",
                    **sign(secret, body, time.time()),
                }
                status = await post_checked(
                    http, url, body, headers, allow_private=allow_private,
                    resolver=self.resolver, timeout=self.timeout,
                )  # fmt: skip
                if not 200 <= status < 300:
                    raise Failed(f"HTTP {status}", retry=False)
                self.sent += 1
        except (Refused, Failed, StoreError) as exc:
            self.failed += 1
            log.info("wake-up of %s/%s not delivered: %s", workspace, agent, exc)
        except Exception as exc:  # a bug must not end the waker: log it, go on
            self.failed += 1
            log.exception("wake-up of %s/%s failed unexpectedly", workspace, agent, exc_info=exc)
        finally:
            self._inflight.discard(key)
            self._wake.set()
