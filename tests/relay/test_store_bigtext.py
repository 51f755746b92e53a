"""A big result read back from the store in pieces, exactly, on both backends.

``get_task`` reads a result over ``bigtext.PIECE`` characters a slice at a time and keeps
a finished one (:mod:`melchior.mellan.relay.store.bigtext`). The slice size is made tiny
here so every boundary case is cheap: results around the slice size, multi-byte
characters and JSON escapes straddling a boundary, a row that changes between its
pieces, and the cache never serving a result that is no longer the row's.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from melchior.mellan.relay.store import bigtext
from melchior.mellan.relay.store.base import FollowUp, Store, TaskState
from storekit import RECEIVER, WS, db_url_fixture, new_task, store_fixture

__all__ = ["db_url_fixture", "store_fixture"]

SMALL = 7
"""The slice size of these tests, in characters."""


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bigtext, "PIECE", SMALL)


def completed(store: Store, result: str, *, input_required: bool = False) -> str:
    task, _ = store.enqueue(new_task())
    [lease] = store.claim(WS, RECEIVER, "r")
    assert store.complete(task.id, lease.epoch, result, input_required=input_required).ok
    return task.id


def read(store: Store, task_id: str) -> str | None:
    task = store.get_task(WS, task_id)
    assert task is not None
    return task.result


def as_result(text: str) -> str:
    """``text`` as the answer of a stored result, JSON-escaped as a receiver sends it."""
    return json.dumps({"message": {"parts": [{"text": text}]}}, ensure_ascii=False)


@pytest.mark.parametrize("extra", [-1, 0, 1, SMALL - 1, SMALL, SMALL + 1, 3 * SMALL + 2])
def test_results_around_the_slice_size_read_back_exactly(store: Store, extra: int) -> None:
    # "é", "😀" and "\\n" escapes at every offset: some slices start or end inside them.
    body = ('é😀\\n"' * 10)[: max(0, SMALL + extra - 2)]
    result = f'"{body}"'
    assert read(store, completed(store, result)) == result


def test_a_result_with_a_slice_ending_in_the_middle_of_every_kind_of_character(
    store: Store,
) -> None:
    for shift in range(SMALL):
        text = "a" * shift + 'é€😀\\"\t\u2028' * 5
        result = as_result(text)
        assert read(store, completed(store, result)) == result
        assert json.loads(result)["message"]["parts"][0]["text"] == text


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=60))
def test_any_answer_reads_back_byte_identical(store: Store, text: str) -> None:
    result = as_result(text)
    got = read(store, completed(store, result))
    assert got == result
    assert got is not None
    assert got.encode("utf-8") == result.encode("utf-8")


def test_a_finished_big_result_is_read_once_and_then_shared(store: Store) -> None:
    result = as_result("ü" * (5 * SMALL))
    task_id = completed(store, result)
    first, second = read(store, task_id), read(store, task_id)
    assert first == result
    assert first is second  # the second read came from the cache: the same object


def test_a_small_result_comes_with_the_row_and_is_not_kept(store: Store) -> None:
    task_id = completed(store, '"tiny"')  # 6 characters: not over the slice size
    assert read(store, task_id) == '"tiny"'
    assert store._texts.chars == 0  # type: ignore[attr-defined]


def test_the_next_turn_of_a_task_is_never_answered_from_the_cache(store: Store) -> None:
    task, _ = store.enqueue(new_task(message_id="m1"))
    [first] = store.claim(WS, RECEIVER, "r")
    asked = as_result("which one? " * 4)
    assert store.complete(task.id, first.epoch, asked, input_required=True).ok
    assert read(store, task.id) == asked
    follow = FollowUp(WS, task.id, new_task().caller, "m2", '{"text": "the blue"}', "c", 2, ("a",))
    went, moved = store.continue_task(follow)
    assert moved
    assert went is not None
    assert read(store, task.id) is None  # the new turn has no result yet
    [second] = store.claim(WS, RECEIVER, "r")
    answered = as_result("the blue!! " * 4)  # the same length as the question
    assert len(answered) == len(asked)
    assert store.complete(task.id, second.epoch, answered).ok
    again = store.get_task(WS, task.id)
    assert again is not None
    assert (again.state, again.turn, again.result) == (TaskState.SUCCEEDED, 2, answered)


def test_the_cache_keeps_within_its_budget_and_drops_the_least_recent() -> None:
    cache = bigtext.TextCache(budget=10)
    keys = [bigtext.Key(f"t{i}", 1, 1, 0) for i in range(3)]
    cache.put(keys[0], "aaaa")
    cache.put(keys[1], "bbbb")
    assert cache.get(keys[0]) == "aaaa"  # now the most recent
    cache.put(keys[2], "cccc")
    assert (cache.get(keys[0]), cache.get(keys[1]), cache.get(keys[2])) == ("aaaa", None, "cccc")
    assert cache.chars == 8
    assert (cache.holds("t0"), cache.holds("t1"), cache.holds("t2")) == (True, False, True)
    cache.put(bigtext.Key("huge", 1, 1, 0), "x" * 11)  # over the budget: never kept
    assert cache.get(bigtext.Key("huge", 1, 1, 0)) is None
    assert cache.chars == 8


def test_readers_asking_at_once_get_one_read_and_one_text(store: Store) -> None:
    """Eight threads read a finished big result at the same moment: every one gets it
    whole, all the same object, and the database was read for it once (one reader at a
    time per result; the rest find it kept)."""
    result = as_result("ö" * (20 * SMALL))
    task_id = completed(store, result)
    reads: list[int] = []
    real = store._result_pieces  # type: ignore[attr-defined]

    def counted(*args: Any) -> Any:
        reads.append(1)
        return real(*args)

    store._result_pieces = counted  # type: ignore[attr-defined]
    start = threading.Barrier(8)

    def one() -> str | None:
        start.wait()
        return read(store, task_id)

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: one(), range(8)))
    assert all(g == result for g in got)
    assert len({id(g) for g in got}) == 1
    assert len(reads) == 1
