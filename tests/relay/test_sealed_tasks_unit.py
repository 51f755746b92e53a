"""The sealed-task agreement (mellan/sealed_tasks.py) over generated messages: a request
sealed by the caller opens at the receiver as the same clear message, for the fields the
lease gives; a result sealed back opens at the caller with its artifacts; a result moved
to another task or turn does not; and a first message opened for one task is refused as
a replay in any other, across restarts, while a redelivery of the same turn opens."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.mellan.sealed_tasks import (
    Opened,
    open_request,
    open_result,
    request_binding,
    result_binding,
    seal_request,
    seal_result,
)
from melchior.mellan.sealing import KeyPair, SealRefused, envelope_of
from melchior.policy.hops import HOPS_URI

CALLER = KeyPair.generate()
RECEIVER = KeyPair.generate()
ROUTE = {"workspace": "w", "caller": "local/codex", "receiver": "private/ops",
         "capability": "incident.inspect"}  # fmt: skip

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)
ids = st.text("abcdef0123456789-", min_size=1, max_size=20)


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    message: dict[str, Any] = {
        "messageId": draw(ids),
        "role": "ROLE_USER",
        "parts": [{"text": t} for t in draw(st.lists(text, min_size=1, max_size=3))],
    }
    if draw(st.booleans()):
        message["contextId"] = draw(ids)
    if draw(st.booleans()):
        message["taskId"] = draw(ids)
    metadata: dict[str, Any] = {}
    if draw(st.booleans()):
        metadata[HOPS_URI] = {"chain": draw(ids), "hop": 2, "path": ["local/codex"]}
    if draw(st.booleans()):
        metadata["note"] = draw(text)
    if metadata:
        message["metadata"] = metadata
    return message


@given(messages())
def test_a_sealed_request_opens_as_the_clear_message_and_hides_its_content(
    message: dict[str, Any],
) -> None:
    sealed, binding = seal_request(message, **ROUTE, to=RECEIVER.public, sender=CALLER)
    assert envelope_of(sealed) is not None
    assert "note" not in str(sealed.get("metadata"))  # only the hop chain stays clear
    again = request_binding(sealed, **ROUTE)
    assert again == binding  # the receiver rebuilds the same binding from what is clear
    opened = open_request(sealed, binding=again, me=RECEIVER, sender=CALLER.public)
    assert opened == {k: v for k, v in message.items()}
    with pytest.raises(SealRefused) as refused:
        open_request(
            sealed, binding=request_binding(sealed, **{**ROUTE, "capability": "deploy"}),
            me=RECEIVER, sender=CALLER.public,
        )  # fmt: skip
    assert refused.value.rule == "binding"


@given(messages(), text, st.lists(st.dictionaries(ids, text, max_size=2), max_size=3))
def test_a_sealed_result_opens_for_its_task_and_turn_only(
    message: dict[str, Any], answer: str, artifacts: list[dict[str, Any]]
) -> None:
    request = request_binding(message, **ROUTE)
    bound = result_binding(request, task="t-1", context="c-1")
    sealed = seal_result(
        answer, artifacts, binding=bound, to=CALLER.public, sender=RECEIVER, message_id="r"
    )
    parts, arts = open_result(sealed, binding=bound, me=CALLER, sender=RECEIVER.public)
    assert parts == [{"text": answer}]
    assert arts == artifacts
    other_task = result_binding(request, task="t-2", context="c-1")
    other_turn = result_binding(dataclasses.replace(request, message="m-2"), task="t-1",
                                context="c-1")  # fmt: skip
    for wrong in (other_task, other_turn):
        with pytest.raises(SealRefused) as refused:
            open_result(sealed, binding=wrong, me=CALLER, sender=RECEIVER.public)
        assert refused.value.rule == "binding"


def test_a_first_message_opens_in_one_task_only_and_is_remembered(tmp_path: Path) -> None:
    seen = Opened(tmp_path / "opened.json")
    seen.claim("local/codex", "m-1", "task-a", 1)
    seen.claim("local/codex", "m-1", "task-a", 1)  # a redelivery of the same turn
    seen.claim("local/other", "m-1", "task-b", 1)  # another caller's ids are its own
    with pytest.raises(SealRefused) as refused:
        Opened(tmp_path / "opened.json").claim("local/codex", "m-1", "task-b", 1)
    assert refused.value.rule == "replay"
    assert "task-a" in refused.value.reason
    with pytest.raises(SealRefused):
        seen.claim("local/codex", "m-1", "task-a", 2)  # a later turn of the same task


def test_the_opened_log_grows_by_one_line_per_message_and_is_compacted(tmp_path: Path) -> None:
    """One short appended line per message opened (the cost of a sealed turn does not grow
    with what is remembered); a torn last line is skipped; the log is compacted to one
    line per entry at start-up when it holds more, and everything is still refused."""
    path = tmp_path / "opened.json"
    seen = Opened(path)
    for i in range(50):
        seen.claim("local/codex", f"m-{i}", f"task-{i}", 1)
        assert len(path.read_text().splitlines()) == i + 1
    seen.claim("local/codex", "m-0", "task-0", 1)  # a redelivery writes nothing
    assert len(path.read_text().splitlines()) == 50
    with path.open("a") as f:
        f.write('["local/codex\\nm-0", "task-0", 1, 1.0]\n["torn')  # a duplicate, a torn line
    again = Opened(path)
    assert len(path.read_text().splitlines()) == 50  # compacted
    for i in range(50):
        with pytest.raises(SealRefused):
            again.claim("local/codex", f"m-{i}", "task-elsewhere", 1)


def test_an_opened_file_of_the_earlier_form_is_read_and_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "opened.json"
    path.write_text(json.dumps({"local/codex\nm-1": ["task-a", 1, time.time()],
                                 "local/codex\nm-old": ["task-z", 1, 0.0]}))  # fmt: skip
    seen = Opened(path)
    with pytest.raises(SealRefused):
        seen.claim("local/codex", "m-1", "task-b", 1)
    seen.claim("local/codex", "m-old", "task-b", 1)  # aged out: remembered no longer
    assert len(path.read_text().splitlines()) == 2
