"""Group-committed accepts: concurrent sends share commits without mixing anything up."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from a2a_kit import WS, message, running
from melchior.mellan.relay.batch import Batcher
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.notify import LocalNotifier
from melchior.mellan.relay.store.base import NewTask, OverLimit, Task
from melchior.mellan.relay.store.sqlite import SQLiteStore


def test_concurrent_sends_are_distinct_and_duplicates_dedupe(tmp_path: Path) -> None:
    with running(f"sqlite://{tmp_path / 'r.db'}", receiver=False) as (server, world, _):
        h = {"A2A-Version": "1.0", "Authorization": f"Bearer {world.tokens['caller']}"}
        msgs = [message(f"echo {i}") for i in range(30)]
        msgs += [dict(m) for m in msgs[:10]]  # ten resends of the same messageIds

        async def go() -> list[Any]:
            async with httpx.AsyncClient(timeout=60) as c:

                async def one(m: dict[str, Any]) -> Any:
                    body = {"message": m, "configuration": {"returnImmediately": True}}
                    r = await c.post(f"{server.base()}/message:send", json=body, headers=h)
                    assert r.status_code == 200, r.text
                    return r.json()["task"]

                return await asyncio.gather(*(one(m) for m in msgs))

        tasks = asyncio.run(go())
        by_message = {}
        for m, t in zip(msgs, tasks, strict=True):
            assert t["history"][0]["messageId"] == m["messageId"]
            assert t["history"][0]["parts"] == m["parts"]
            by_message.setdefault(m["messageId"], set()).add(t["id"])
        assert all(len(ids) == 1 for ids in by_message.values())
        assert len({t["id"] for t in tasks}) == 30
        accepts = [r for r in server.store.audit_since(WS, 0, 10_000) if r.action == "task.accept"]
        assert sorted(r.subject for r in accepts) == sorted({t["id"] for t in tasks})


class FlakyStore(SQLiteStore):
    """The real SQLite store, refusing any batch that holds a task whose payload says so."""

    batches: list[int]

    def admit(self, tasks: Sequence[NewTask]) -> list[tuple[Task, bool] | OverLimit]:
        self.batches.append(len(tasks))
        if any(json.loads(t.payload).get("poison") for t in tasks):
            raise ValueError("poisoned")
        return super().admit(tasks)


def test_one_bad_task_does_not_sink_its_batch(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "r.db")
    store.migrate()
    store.batches = []
    store.ensure_workspace(WS)

    def task(i: int, poison: bool = False) -> NewTask:
        payload = json.dumps({"i": i, "poison": poison})
        return NewTask(WS, "a", "b", "c", payload, message_id=f"m{i}")

    async def go() -> list[Any]:
        relay = Relay(store=store, notifier=LocalNotifier(), public_url="http://x")
        b = Batcher(relay)
        async with asyncio.TaskGroup() as tg:
            consumer = tg.create_task(b.run())
            await asyncio.sleep(0)  # the consumer is running before the first accept
            jobs = [b.enqueue(task(i, poison=(i == 3))) for i in range(8)]
            results = await asyncio.gather(*jobs, return_exceptions=True)
            consumer.cancel()
        return results

    results = asyncio.run(go())
    store.close()
    assert isinstance(results[3], ValueError)
    ok = [r for i, r in enumerate(results) if i != 3]
    assert all(created for _, created in ok)
    assert [json.loads(t.payload)["i"] for t, _ in ok] == [0, 1, 2, 4, 5, 6, 7]
    assert max(store.batches) > 1  # concurrent accepts did share a commit
