"""How a relay runs a store call off the event loop (``Relay.call``): handed to its thread
before the loop runs anything else, in the caller's context, and never abandoned by a
cancelled caller — with a real store on both backends.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.notify import LocalNotifier
from melchior.mellan.relay.requestid import current_id
from melchior.mellan.relay.store.base import Store, StoreUnavailable
from storekit import WS, db_url_fixture, store_fixture

__all__ = ["db_url_fixture", "store_fixture"]


@pytest.fixture
def relay(store: Store) -> Relay:
    return Relay(store=store, notifier=LocalNotifier(), public_url="http://relay.invalid")


def test_a_store_call_is_in_its_thread_before_the_loop_runs_anything_else(relay: Relay) -> None:
    """The call's first step hands it to its thread: with only that step taken (the
    coroutine driven by hand, nothing else of the loop run), the store is read. anyio's
    ``run_in_threadpool`` yielded to the loop twice before it queued the call, so each
    store call of a request waited behind all the loop's ready work, twice, first."""
    ran = threading.Event()
    got: list[Any] = []

    def read() -> None:
        got.append(relay.store.get_task(WS, "no-such-task"))
        ran.set()

    async def go() -> bool:
        coro = relay.call(read)
        coro.send(None)  # the first step only: the loop runs nothing else meanwhile
        try:
            return ran.wait(30)  # the loop's thread is held here: only the worker can set it
        finally:
            coro.close()

    assert asyncio.run(go()) is True
    assert got == [None]


def test_a_store_call_runs_in_the_callers_context(relay: Relay) -> None:
    """The request id set by the request is what the call sees (its audit records carry it)."""

    async def go() -> str | None:
        current_id.set("req-1")
        return await relay.call(current_id.get)

    assert asyncio.run(go()) == "req-1"


def test_a_cancelled_caller_ends_at_once_and_its_store_call_runs_to_its_end(
    relay: Relay,
) -> None:
    """Cancelled while its call runs, the caller is cancelled at once (a relay stopping is
    not held by a slow query), and the call runs on to its end in its thread, as it did
    under ``run_in_threadpool``: a commit is never cut short by a caller going away."""
    started, release, ended = threading.Event(), threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(30)
        ended.set()
        return "done"

    async def go() -> None:
        task = asyncio.ensure_future(relay.call(slow))
        assert await asyncio.to_thread(started.wait, 30)  # the call is running
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not ended.is_set()  # still running
        release.set()
        assert await asyncio.to_thread(ended.wait, 30)  # and it ends in its thread

    asyncio.run(go())


def test_an_unavailable_store_is_counted_and_raised(relay: Relay) -> None:
    def down() -> None:
        raise StoreUnavailable("the database is away")

    async def go() -> None:
        with pytest.raises(StoreUnavailable):
            await relay.call(down)

    asyncio.run(go())
    assert relay.metrics.db_errors.value() == 1
