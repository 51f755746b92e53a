"""The pusher stops when the relay's shutdown cancels it, wherever that cancel lands.

A relay that took more than 20 s to stop (its test fixture then killed it) was found
waiting for its pusher: the pusher's wait cancelled its two helper futures and awaited
each under ``suppress(BaseException)``, so a cancel of the pusher itself landing during
that await was swallowed and it looped on. Here the cancel is landed at every point of
a wake-up in turn (after 0, 1, 2, … loop passes), with a real notifier: each time, the
wait must end cancelled. On the code before the fix some of these return normally."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from melchior.mellan.relay.notify import PUSH_TOPIC, LocalNotifier
from melchior.mellan.relay.workers.push import Pusher


@pytest.mark.parametrize("woken_by", ["slot", "notify"])
def test_a_cancel_landing_anywhere_in_a_wake_up_stops_the_wait(woken_by: str) -> None:
    async def scenario() -> list[int]:
        notifier = LocalNotifier()
        pusher = Pusher(cast(Any, SimpleNamespace(notifier=notifier)), poll=60)
        swallowed = []
        for passes in range(12):
            task = asyncio.create_task(pusher._wait())
            await asyncio.sleep(0)  # it listens now
            if woken_by == "slot":
                pusher._slot_freed.set()
            else:
                notifier.publish(PUSH_TOPIC)
            for _ in range(passes):
                await asyncio.sleep(0)
            task.cancel()
            try:
                await asyncio.wait_for(task, 5)
            except asyncio.CancelledError:
                continue
            swallowed.append(passes)
        return swallowed

    assert asyncio.run(scenario()) == []
