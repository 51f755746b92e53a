"""The relay client's parsers over any input: the error decoder, the task and event
views, the line for a person. Whatever a server sends, the answer is a view or one
:class:`RelayError` with a one-line message — never another exception."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from melchior.mellan.client.errors import RelayError, refusal, stream_refusal
from melchior.mellan.client.views import TaskEvent, TaskPage, TaskView, describe, text_of

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
keys = st.sampled_from(["task", "statusUpdate", "artifactUpdate", "message", "error", "id",
                        "status", "state", "parts", "text", "artifact", "contextId"])  # fmt: skip
shaped = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=25,
)


def one_line(exc: RelayError) -> None:
    text = str(exc)
    assert text
    assert "\n" not in text
    assert "\r" not in text
    assert "\x1b" not in text


@settings(max_examples=300)
@given(st.integers(400, 599), st.binary(max_size=600))
def test_any_error_body_is_one_relay_error(status: int, body: bytes) -> None:
    exc = refusal(status, body, {"retry-after": "7"}, "GET http://127.0.0.1/x")
    assert exc.status == status
    one_line(exc)
    assert exc.retry_after == 7.0


@settings(max_examples=300)
@given(st.integers(400, 599), shaped)
def test_any_json_error_is_one_relay_error(status: int, value: Any) -> None:
    body = json.dumps({"error": value}).encode()
    exc = refusal(status, body)
    one_line(exc)
    if isinstance(value, dict) and isinstance(value.get("message"), str) and value["message"]:
        assert exc.said
    stream = stream_refusal({"error": value}, "x")
    one_line(stream)
    assert stream.text == "x"


@given(st.text(min_size=1), st.sampled_from(["PERMISSION_DENIED", "NOT_FOUND"]), st.text())
def test_the_relays_words_are_kept(sentence: str, kind: str, reason: str) -> None:
    error = {"code": 403, "status": kind, "message": sentence,
             "details": [{"@type": "x", "reason": reason, "metadata": {"k": "v"}}]}  # fmt: skip
    exc = refusal(403, json.dumps({"error": error}).encode())
    assert exc.code == kind
    assert exc.reason == reason
    assert exc.details == {"k": "v"}
    assert exc.sentence == "".join(c if c.isprintable() else " " for c in sentence)
    one_line(exc)


def built(build: Callable[[Any], object], value: Any) -> object:
    try:
        return build(value)
    except RelayError as exc:
        return exc


@settings(max_examples=400)
@given(shaped)
def test_a_view_is_built_or_refused_never_broken(value: Any) -> None:
    for build in (TaskView.of, TaskPage.of, lambda v: TaskEvent.of(v, "")):
        found = built(build, value)
        if isinstance(found, RelayError):
            assert found.code == "bad-answer"
            one_line(found)
        else:
            assert found is not None
    if isinstance(value, dict):
        assert isinstance(describe(value), str)
    assert isinstance(text_of(value), str)


@given(st.text(), st.text(), st.sampled_from(["TASK_STATE_COMPLETED", "TASK_STATE_FAILED",
                                               "TASK_STATE_WORKING"]), values)  # fmt: skip
def test_a_task_view_reads_what_it_names(tid: str, ctx: str, state: str, extra: Any) -> None:
    raw = {"id": tid, "contextId": ctx, "extra": extra,
           "status": {"state": state, "message": {"parts": [{"text": "said"}]}}}  # fmt: skip
    view = TaskView.of(raw)
    assert (view.id, view.context_id, view.state, view.answer) == (tid, ctx, state, "said")
    assert view.raw is raw
    assert view.receipt.kind == {"TASK_STATE_COMPLETED": "answered",
                                 "TASK_STATE_FAILED": "delivered"}.get(state, "queued")  # fmt: skip
    assert describe({"task": raw}) == f"task {tid} {state[11:].lower()}: said"
