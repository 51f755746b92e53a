"""The shared reader itself (``relay/watch.py``), on the real in-process notifier:
armed before each look, so a change published during a look is never lost even with no
poll for an hour; forgotten with its last follower, even one that left before the reader
ever ran; a follower that took nothing for a while gets the newest value at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from melchior.mellan.relay.metrics import Metrics
from melchior.mellan.relay.notify import LocalNotifier
from melchior.mellan.relay.watch import Watches

HOUR = 3600.0


def run(coro: object) -> None:
    async def guarded() -> None:
        await asyncio.wait_for(coro, 30)  # type: ignore[arg-type]  # a hang guard

    asyncio.run(guarded())


def test_a_publish_during_the_look_wakes_the_next_one() -> None:
    async def main() -> None:
        notifier = LocalNotifier()
        await notifier.start()
        watches = Watches(notifier, HOUR, Metrics())
        looks: list[int] = []

        async def look(prev: int | None) -> AsyncIterator[int]:
            looks.append(len(looks))
            if len(looks) == 1:
                notifier.publish("t")  # a write committing while the reader reads
            yield len(looks)

        f = watches.follow(("k", 1), "t", look, lambda v: v >= 2)
        await f.arm()
        while f.latest() < 2:
            await f.wait()
        assert looks == [0, 1]
        f.close()
        await watches.aclose()

    run(main())


def test_a_reader_left_before_it_ran_is_forgotten() -> None:
    async def main() -> None:
        notifier = LocalNotifier()
        await notifier.start()
        metrics = Metrics()
        watches = Watches(notifier, HOUR, metrics)

        async def look(prev: int | None) -> AsyncIterator[int]:
            yield 1

        f = watches.follow(("k", 1), "t", look, lambda v: False)
        assert watches.readers() == 1
        f.close()  # no loop pass in between: the reader never started
        assert watches.readers() == 0
        assert metrics.stream_readers.value(kind="k") == 0
        assert metrics.stream_followers.value(kind="k") == 0
        await watches.aclose()

    run(main())


def test_a_follower_behind_takes_the_newest_value() -> None:
    async def main() -> None:
        notifier = LocalNotifier()
        await notifier.start()
        watches = Watches(notifier, HOUR, Metrics())
        state = {"n": 0}

        async def look(prev: int | None) -> AsyncIterator[int]:
            if prev != state["n"]:
                yield state["n"]

        quick = watches.follow(("k", 1), "t", look, lambda v: v >= 5)
        slow = watches.follow(("k", 1), "t", look, lambda v: v >= 5)
        await quick.arm()
        assert quick.latest() == 0
        assert slow.latest() == 0
        seen: list[int] = []
        while not seen or seen[-1] < 5:
            state["n"] += 1
            notifier.publish("t")
            await quick.wait()
            seen.append(quick.latest())
        assert seen == [1, 2, 3, 4, 5]
        assert await slow.wait()  # five versions behind: one step to the newest
        assert slow.latest() == 5
        assert slow.ended  # final: the reader stopped
        assert quick.ended
        quick.close()
        slow.close()
        await watches.aclose()

    run(main())
