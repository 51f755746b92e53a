"""A task listing and its count, on both backends: ``count_tasks`` is what ``list_tasks``
would list, for every combination of filters (the listing's ``totalSize`` is counted by
the database instead of reading every row), and a big result comes back in a listing
exactly as ``get_task`` gives it, read in pieces."""

from __future__ import annotations

import itertools
import json

import pytest

from melchior.mellan.relay.store import bigtext
from melchior.mellan.relay.store.base import Capability, Store, TaskState
from storekit import (
    CALLER,
    RECEIVER,
    WS,
    db_url_fixture,
    new_task,
    store_fixture,
    wait_db_clock_past,
)

__all__ = ["db_url_fixture", "store_fixture"]

OTHER = "local/other"


STATES = [
    None,
    [TaskState.QUEUED],
    [TaskState.LEASED, TaskState.SUCCEEDED],
    [TaskState.CANCELLED],
    [],
]


def test_the_count_is_what_the_listing_lists_for_every_combination_of_filters(
    store: Store,
) -> None:
    store.add_agent(WS, OTHER, "another caller", [Capability("incident.inspect", "look")])
    stamp = ""
    for round_ in range(2):
        made = [
            store.enqueue(new_task(caller=who, context_id=ctx))[0].id
            for who, ctx in itertools.product((CALLER, OTHER), ("ctx-a", "ctx-b"))
            for _ in range(3)
        ]
        for lease in store.claim(WS, RECEIVER, "r", limit=4):
            assert store.complete(lease.task.id, lease.epoch, '{"ok": true}').ok
        for task_id in made[1::3]:
            store.cancel(WS, task_id, actor="owner:t", rule="caller")
        if round_ == 0:
            stamp = store.now()
            wait_db_clock_past(store, stamp)
    seen_counts = set()
    for caller, context, states, after in itertools.product(
        (None, CALLER, OTHER), (None, "ctx-a", "nowhere"), STATES, (None, stamp)
    ):
        filters = {
            "caller": caller,
            "receiver": RECEIVER,
            "context_id": context,
            "states": states,
            "updated_after": after,
        }
        listed = store.list_tasks(WS, limit=1000, **filters)
        assert store.count_tasks(WS, **filters) == len(listed), filters
        # a short page is full when there are matches further back (the time filter is
        # the database's, not applied to the rows after the limit)
        assert len(store.list_tasks(WS, limit=1, **filters)) == min(1, len(listed)), filters
        if after is not None:
            assert all(t.updated_at > stamp for t in listed)
        seen_counts.add(len(listed))
    assert len(seen_counts) > 4  # the filters do select: not one count for all


def test_a_big_result_in_a_listing_is_read_in_pieces_exactly(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bigtext, "PIECE", 7)
    answers = ['"é😀\\n' * 9 + '"', '"short"', '"' + "x" * 7 + '"']
    ids = []
    for answer in answers:
        task, _ = store.enqueue(new_task())
        [lease] = store.claim(WS, RECEIVER, "r")
        result = json.dumps({"message": {"parts": [{"text": answer}]}}, ensure_ascii=False)
        assert store.complete(task.id, lease.epoch, result).ok
        ids.append(task.id)
    listed = {t.id: t.result for t in store.list_tasks(WS, receiver=RECEIVER)}
    for task_id in ids:
        got = store.get_task(WS, task_id)
        assert got is not None
        assert listed[task_id] == got.result
        assert got.result is not None
        assert json.loads(got.result)["message"]["parts"][0]["text"] in answers
