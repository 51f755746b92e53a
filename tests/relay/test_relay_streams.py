"""How an event reaches a stream: handed over by the replica that wrote it
(``relay/caches/fresh.py``), read from the store when written elsewhere, woken by the notifier's
futures, framed with keepalives (``a2a/sse.py``) — never skipped, repeated or reordered.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from a2a_kit import RECEIVER, WS, message, running
from melchior.mellan.client.receiver import ReceiverClient
from melchior.mellan.relay.caches.fresh import BIGGEST, FreshEvents
from melchior.mellan.relay.notify import LocalNotifier
from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.base import Chained, TaskEvent
from melchior.mellan.relay.surfaces.a2a import sse

# -- the hand-over table ---------------------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[TaskEvent], list[list[int]], list[bool]]:
    """Events of three tasks with global seqs, the batches (commits) they were written in,
    and which of them went through this replica (the others were written elsewhere)."""
    n = draw(st.integers(0, 60))
    tasks = [draw(st.sampled_from("abc")) for _ in range(n)]
    sizes = [draw(st.sampled_from([1, 10, 1000, BIGGEST + 1])) for _ in range(n)]
    events = [
        TaskEvent(seq=i + 1, task_id=t, at="", kind="status", body="x" * size)
        for i, (t, size) in enumerate(zip(tasks, sizes, strict=True))
    ]
    cuts = sorted(draw(st.sets(st.integers(1, max(n - 1, 1)))))
    bounds = [0, *[c for c in cuts if c < n], n]
    batches = [list(range(a, b)) for a, b in itertools.pairwise(bounds) if a < b]
    here = [draw(st.booleans()) for _ in range(n)]
    return events, batches, here


@settings(max_examples=300, deadline=None)
@given(histories(), st.integers(1, 8), st.integers(1, 3), st.integers(2000, 20000))
def test_handed_events_are_exactly_the_next_ones(
    history: tuple[list[TaskEvent], list[list[int]], list[bool]],
    per_task: int,
    tasks: int,
    budget: int,
) -> None:
    """Whatever was noted, evicted or never seen here, what ``after`` hands a follower at
    any event it may have seen is a prefix of that task's true continuation."""
    events, batches, here = history
    fresh = FreshEvents(per_task=per_task, tasks=tasks, budget=budget)
    last: dict[str, int] = {}
    chained = []
    for e in events:
        chained.append(Chained(last.get(e.task_id, 0), e))
        last[e.task_id] = e.seq
    for batch in batches:
        fresh.note([chained[i] for i in batch if here[i]])
        for task in "abc":
            mine = [e for e in events[: batch[-1] + 1] if e.task_id == task]
            for pos in [0, *(e.seq for e in mine)]:
                truth = [e for e in mine if e.seq > pos]
                handed = fresh.after(task, pos)
                assert handed == truth[: len(handed)]


def test_big_events_and_old_tasks_are_left_to_the_read() -> None:
    fresh = FreshEvents(per_task=2, tasks=2, budget=10_000)
    ev = [TaskEvent(seq=i, task_id="t", at="", kind="status", body="{}") for i in (1, 2, 3)]
    fresh.note([Chained(0, ev[0]), Chained(1, ev[1]), Chained(2, ev[2])])
    assert fresh.after("t", 0) == []  # the first fell out (two per task)
    assert fresh.after("t", 1) == [ev[1], ev[2]]
    big = TaskEvent(seq=4, task_id="t", at="", kind="status", body="x" * (BIGGEST + 1))
    fresh.note([Chained(3, big)])
    assert fresh.after("t", 3) == []
    for task in ("u", "v"):
        fresh.note([Chained(0, TaskEvent(seq=9, task_id=task, at="", kind="k", body=""))])
    assert fresh.after("t", 1) == []  # three tasks in a table of two: the oldest went


# -- a relay streaming events written here and elsewhere ------------------------------------------


def test_a_stream_gets_every_event_once_in_order_wherever_it_was_written(tmp_path: Path) -> None:
    """Events reported through this relay (handed over) alternate with events another
    replica writes (found by the read): the stream carries them all, once, in the task's
    order, then the completion."""
    db = f"sqlite://{tmp_path / 'r.db'}"
    with running(db, receiver=False) as (server, world, _):
        elsewhere = open_store(db)
        body = json.dumps({"message": message("hold"), "configuration": {}}).encode()
        headers = {
            "A2A-Version": "1.0",
            "Content-Type": "application/json",
            "Authorization": f"Bearer {world.tokens['caller']}",
        }
        seen: list[dict[str, Any]] = []
        opened = threading.Event()

        def listen() -> None:
            url = f"{server.base()}/message:stream"
            with httpx.stream("POST", url, content=body, headers=headers, timeout=60) as s:
                for line in s.iter_lines():
                    if line.startswith("data: "):
                        seen.append(json.loads(line[6:]))
                        opened.set()

        reader = threading.Thread(target=listen)
        reader.start()
        assert opened.wait(30)
        with ReceiverClient(server.url, world.tokens["receiver"]) as rc:
            (lease,) = rc.claim(wait=10, limit=1)
            for i in range(12):
                said = {"message": {"parts": [{"text": f"e{i}"}]}}
                if i % 3 == 2:
                    elsewhere.append_event(lease.task_id, "status", json.dumps(said))
                else:
                    rc.progress(lease.task_id, lease.epoch, "status", said)
            rc.complete(lease.task_id, lease.epoch, {"message": {"parts": [{"text": "done"}]}})
        reader.join(30)
        assert not reader.is_alive()
        elsewhere.close()
        texts = [
            e["statusUpdate"]["status"]["message"]["parts"][0]["text"]
            for e in seen
            if "statusUpdate" in e and "message" in e["statusUpdate"]["status"]
        ]
        stored = [json.loads(e.body)["message"]["parts"][0]["text"]
                  for e in server.store.events_after(lease.task_id)]  # fmt: skip
        assert stored == [f"e{i}" for i in range(12)]
        assert texts[: len(stored)] == [t for t in texts if t != "done"][: len(stored)]
        assert [t for t in texts if t.startswith("e")] == stored
        assert seen[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
        assert server.store.get_task(WS, lease.task_id).receiver == RECEIVER  # type: ignore[union-attr]


# -- wake-ups and frames ---------------------------------------------------------------------------


def test_a_listener_hears_a_publish_made_before_it_is_awaited() -> None:
    async def go() -> tuple[bool, bool, bool]:
        hub = LocalNotifier()
        await hub.start()
        armed = hub.listen("t", 5)
        hub.publish("t")  # between arming and awaiting: must not be missed
        woken = await armed
        quiet = await hub.wait("t", 0.01)
        gone = hub.listen("t", 5)
        gone.cancel()
        await asyncio.sleep(0)
        return woken, quiet, "t" in hub._waiters

    assert asyncio.run(go()) == (True, False, False)


def test_frames_say_alive_only_after_the_keepalive_and_turn_failures_into_error_events() -> None:
    async def source() -> AsyncIterator[dict[str, Any]]:
        yield sse.QUIET
        yield {"n": 1}
        yield sse.QUIET
        raise RuntimeError("boom")

    async def frames(keepalive: float) -> list[bytes]:
        out = []
        failed = lambda exc: {"e": str(exc)}  # noqa: E731
        async for chunk in sse._frames(source(), sse.BARE, failed, keepalive):
            out.append(chunk)
        return out

    assert asyncio.run(frames(0.0)) == [
        b": keepalive\n\n",
        b'data: {"n":1}\n\n',
        b": keepalive\n\n",
        b'event: error\ndata: {"e":"boom"}\n\n',
    ]
    quiet = [b'data: {"n":1}\n\n', b'event: error\ndata: {"e":"boom"}\n\n']
    assert asyncio.run(frames(3600.0)) == quiet
