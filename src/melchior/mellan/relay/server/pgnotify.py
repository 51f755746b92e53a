"""Wake-ups across relay replicas with PostgreSQL LISTEN/NOTIFY.

A hint, never the truth: every waiter re-reads the store when woken and also on its
own timer, so a lost, late or duplicated notification costs latency only. That is
what makes the choices below safe:

- NOTIFY is sent *after* the store's transaction commits, from this notifier's own
  connection, never inside a queue transaction: PostgreSQL serialises NOTIFY-ing
  commits on a global lock, and that lock must not sit in the claim/complete path;
- publishes are debounced: topics published within ``debounce`` seconds go out as
  one round trip, each topic once, however many tasks changed;
- one dedicated LISTEN connection per replica (not from the store's pool, which
  would hand it to queries); if it drops, every local waiter is woken to re-read
  (a notification may have been missed meanwhile), and it reconnects with backoff;
- the publishing replica wakes its own waiters at once, without the round trip, and
  drops its own notifications when they come back on its LISTEN connection (told by the
  sender's backend pid): each echo woke every waiter of the topic a second time, ~10 ms
  later — a blocking send's read and a receiver's empty claim transaction per change,
  on the path of the next task (docs/benchmarks.md, issue 25, the relay's own path).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import psycopg

from melchior.mellan.relay.notify import LocalNotifier

CHANNEL = "mellan"


class PgNotifier:
    """:class:`~melchior.mellan.relay.notify.Notifier` over LISTEN/NOTIFY on one channel.

    ``publish`` is safe from any thread (the store calls it from worker threads after
    commit); everything else runs on the event loop that called ``start``.
    """

    def __init__(
        self,
        url: str,
        *,
        channel: str = CHANNEL,
        debounce: float = 0.01,
        reconnect_delay: float = 0.25,
        keepalive: float = 5.0,
    ) -> None:
        self.url = url
        self.channel = channel
        self.debounce = debounce
        self.reconnect_delay = reconnect_delay
        self.keepalive = keepalive
        self.reconnects = 0  # how often the LISTEN connection was re-established
        self.sent = 0  # NOTIFY round trips made (after debouncing)
        self._local = LocalNotifier()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._flush_due = False
        self._listen_conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None
        self._pub_conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None
        self._pub_pid: int | None = None  # the backend our NOTIFYs come from: its echoes
        self.echoes = 0  # our own notifications seen coming back, and dropped
        self._listener: asyncio.Task[None] | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._listening = asyncio.Event()
        self._stopping = False

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._listening = asyncio.Event()
        await self._local.start()
        self._listener = asyncio.create_task(self._listen_forever(), name="mellan-pg-listen")
        # Wait briefly for the first LISTEN, so a publish right after start is not missed
        # by this replica's own listener; if the database is down we still start, and
        # waiters fall back to their timers until the listener connects.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listening.wait(), 5.0)

    async def stop(self) -> None:
        self._stopping = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self._flush()  # what was published before stop still goes out
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
        for t in list(self._flushes):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for conn in (self._listen_conn, self._pub_conn):
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
        await self._local.stop()

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    # -- Notifier -----------------------------------------------------------------------------
    def publish(self, topic: str) -> None:
        self._local.publish(topic)  # this replica: no round trip needed
        loop = self._loop
        if loop is None or self._stopping:
            return
        with self._lock:
            self._pending.add(topic)
            if self._flush_due:
                return
            self._flush_due = True
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._arm()
        else:
            loop.call_soon_threadsafe(self._arm)

    def listen(self, topic: str, timeout: float) -> asyncio.Future[bool]:
        return self._local.listen(topic, timeout)

    async def wait(self, topic: str, timeout: float) -> bool:  # noqa: ASYNC109 (the answer is woken or not)
        return await self._local.wait(topic, timeout)

    # -- internals ----------------------------------------------------------------------------
    def _arm(self) -> None:
        assert self._loop is not None
        if self._stopping:
            return
        self._timer = self._loop.call_later(self.debounce, self._spawn_flush)

    def _spawn_flush(self) -> None:
        self._timer = None
        task = asyncio.create_task(self._flush())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush(self) -> None:
        with self._lock:
            topics, self._pending = sorted(self._pending), set()
            self._flush_due = False
        if not topics:
            return
        try:
            if self._pub_conn is None or self._pub_conn.closed:
                self._pub_conn = await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, connect_timeout=5
                )
                self._pub_pid = self._pub_conn.info.backend_pid
            await self._pub_conn.execute(
                "SELECT pg_notify(%s, t) FROM unnest(%s::text[]) AS t", (self.channel, topics)
            )
            self.sent += 1
        except psycopg.Error:
            # Dropped hint: other replicas find the change on their next timed re-read.
            if self._pub_conn is not None:
                with contextlib.suppress(Exception):
                    await self._pub_conn.close()
            self._pub_conn = None

    def _wake_everyone(self) -> None:
        for topic in list(self._local._waiters):
            self._local.publish(topic)

    async def _listen_forever(self) -> None:
        delay = self.reconnect_delay
        first = True
        while not self._stopping:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, connect_timeout=5
                )
                self._listen_conn = conn
                await conn.execute(f'LISTEN "{self.channel}"')
                if not first:
                    self.reconnects += 1
                    self._wake_everyone()  # something may have changed while we were deaf
                first = False
                self._listening.set()
                delay = self.reconnect_delay
                while True:
                    async for note in conn.notifies(timeout=self.keepalive):
                        if note.pid == self._pub_pid:  # ours: woken locally when published
                            self.echoes += 1
                            continue
                        self._local.publish(note.payload)
                    await conn.execute("SELECT 1")  # a silent dead socket shows up here
            except asyncio.CancelledError:
                raise
            except psycopg.Error:
                self._listening.clear()
                self._wake_everyone()
                if self._listen_conn is not None:
                    with contextlib.suppress(Exception):
                        await self._listen_conn.close()
                    self._listen_conn = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def listener_pid(self) -> int | None:
        """The LISTEN connection's backend pid (for drills that cut it)."""
        conn = self._listen_conn
        return None if conn is None or conn.closed else conn.info.backend_pid
