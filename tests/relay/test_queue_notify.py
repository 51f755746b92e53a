"""PgNotifier: LISTEN/NOTIFY wake-ups between replicas, debounced, surviving a cut."""

from __future__ import annotations

import asyncio
import multiprocessing as mp

import psycopg
import pytest

from melchior.mellan.relay.notify import receiver_topic
from melchior.mellan.relay.server.pgnotify import PgNotifier
from melchior.mellan.relay.store import open_store
from storekit import RECEIVER, WS, new_task, seed

pytestmark = pytest.mark.postgres


def _publish_from_other_process(url: str, topic: str) -> None:
    """A second replica in its own process: start a notifier, publish, stop."""

    async def main() -> None:
        n = PgNotifier(url)
        await n.start()
        n.publish(topic)
        await asyncio.sleep(0.2)  # let the debounced flush go out before stopping
        await n.stop()

    asyncio.run(main())


def test_wakes_a_waiter_in_another_process(pg_url: str) -> None:
    async def main() -> None:
        b = PgNotifier(pg_url)
        await b.start()
        try:
            assert b.listening
            waiter = asyncio.create_task(b.wait("task:x", 60))
            other = asyncio.create_task(b.wait("task:other", 0.3))
            await asyncio.sleep(0)
            proc = mp.get_context("spawn").Process(
                target=_publish_from_other_process, args=(pg_url, "task:x")
            )
            proc.start()
            assert await waiter is True
            assert await other is False  # a different topic is not woken
            await asyncio.to_thread(proc.join, 60)
            assert proc.exitcode == 0
        finally:
            await b.stop()

    asyncio.run(main())


def test_store_change_wakes_other_replica_from_worker_thread(pg_url: str) -> None:
    store = open_store(pg_url)
    seed(store)

    async def main() -> None:
        a, b = PgNotifier(pg_url), PgNotifier(pg_url)
        await a.start()
        await b.start()
        store.set_publisher(a.publish)  # replica A's store publishes via A
        try:
            waiter = asyncio.create_task(b.wait(receiver_topic(WS, RECEIVER), 60))
            await asyncio.sleep(0)
            await asyncio.to_thread(store.enqueue, new_task())  # as the relay does
            assert await waiter is True
            assert len(store.claim(WS, RECEIVER, "r")) == 1  # woken: re-read the store
        finally:
            await a.stop()
            await b.stop()

    asyncio.run(main())
    store.close()


def test_publishes_are_debounced(pg_url: str) -> None:
    async def main() -> None:
        raw = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
        await raw.execute('LISTEN "mellan"')
        a = PgNotifier(pg_url, debounce=0.05)
        await a.start()
        try:
            for _ in range(200):
                a.publish("task:hot")
            a.publish("task:cold")
            got: list[str] = []
            async for note in raw.notifies(timeout=1.0):
                got.append(note.payload)
            assert sorted(set(got)) == ["task:cold", "task:hot"]
            assert len(got) < 20  # 201 publishes became a handful of notifications
            assert a.sent < 20
        finally:
            await a.stop()
            await raw.close()

    asyncio.run(main())


def test_listener_cut_wakes_waiters_and_reconnects(pg_url: str) -> None:
    async def main() -> None:
        a, b = PgNotifier(pg_url), PgNotifier(pg_url, reconnect_delay=0.05)
        await a.start()
        await b.start()
        try:
            pid = b.listener_pid()
            assert pid is not None
            waiter = asyncio.create_task(b.wait("task:any", 60))
            await asyncio.sleep(0)
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as adm:
                await adm.execute("SELECT pg_terminate_backend(%s)", (pid,))
            assert await waiter is True  # woken to re-read: it may have missed something
            for _ in range(2000):  # reconnects on its own (bounded by tries, not time)
                if b.reconnects >= 1 and b.listening:
                    break
                await asyncio.sleep(0.01)
            assert b.reconnects >= 1
            assert b.listener_pid() not in (None, pid)
            again = asyncio.create_task(b.wait("task:after", 60))
            await asyncio.sleep(0)
            a.publish("task:after")
            assert await again is True
        finally:
            await a.stop()
            await b.stop()

    asyncio.run(main())


def test_a_replica_drops_its_own_notifications_coming_back(pg_url: str) -> None:
    """A publish wakes this replica's waiters at once, and only once: its NOTIFY coming back
    on its own LISTEN connection wakes nobody again (each echo woke every waiter of the
    topic a second time — a blocking send's read, a receiver's empty claim). Other
    replicas are still woken. Ordered, not timed: the echo was committed before the other
    replica's marker, and notifications arrive in commit order, so once the marker has
    woken us the echo has been seen."""

    async def main() -> None:
        a, b = PgNotifier(pg_url), PgNotifier(pg_url)
        await a.start()
        await b.start()
        try:
            first = a.listen("task:x", 60)
            from_a = b.listen("task:x", 60)
            a.publish("task:x")
            assert await first is True  # locally, at once
            again = a.listen("task:x", 60)  # would be woken by the echo
            assert await from_a is True  # the other replica hears it
            marker = a.listen("task:marker", 60)
            for _ in range(2000):  # a's NOTIFY has committed (bounded by tries)
                if a.sent >= 1:
                    break
                await asyncio.sleep(0.01)
            assert a.sent >= 1
            b.publish("task:marker")
            assert await marker is True  # b's notification reached a ...
            assert not again.done()  # ... and a's own, before it, woke nobody
            assert a.echoes >= 1
            again.cancel()
        finally:
            await a.stop()
            await b.stop()

    asyncio.run(main())
