"""What the relay pushes about a sealed task is what it holds: the states in clear, the
result as ciphertext. On both backends: a real relay process, a real ``mellan receiver``
opening the task and sealing its result back, and a real webhook on loopback (the
workspace allows private addresses, as an owner would for a webhook on a private
network). Every body the webhook hears is searched for the request's plaintext and the
result's (two different strings), and the result it carries opens with the caller's key.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from melchior.mellan.relay.store.base import Store
from melchior.mellan.sealed_tasks import open_result, result_binding
from melchior.mellan.sealing import is_sealed
from relay_proc import db_url_fixture, owner_fixture, relay_fixture, store_fixture
from sealed_kit import WORKSPACE, Sealed, sealed_fixture
from webhook_kit import Hook, ended, states

__all__ = ["db_url_fixture", "owner_fixture", "relay_fixture", "sealed_fixture", "store_fixture"]

A2A_STATES = {
    "TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", "TASK_STATE_COMPLETED",
    "TASK_STATE_INPUT_REQUIRED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED",
}  # fmt: skip


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.close()


def _messages(value: Any) -> Iterator[dict[str, Any]]:
    """Every A2A message anywhere in a pushed body (an object with ``parts`` and a role)."""
    if isinstance(value, dict):
        if isinstance(value.get("parts"), list) and "role" in value:
            yield value
        for v in value.values():
            yield from _messages(v)
    elif isinstance(value, list):
        for v in value:
            yield from _messages(v)


def test_every_push_about_a_sealed_task_carries_ciphertext_and_states_in_clear(
    sealed: Sealed, store: Store, hook: Hook
) -> None:
    store.set_push_allow_private(WORKSPACE, True)
    secret = "salary review " + secrets.token_hex(10)
    answer = f"done: {secret.upper()} (turn 1)"  # what the worker answers, sealed back
    task_id, request = sealed.send(secret, push={"url": hook.url, "token": "tok-sealed"})
    seen = hook.wait_for(ended)
    mine = [r for r in seen if r.headers.get("x-mellan-task") == task_id]
    assert mine, seen
    for r in mine:
        for plain in (secret, secret.upper(), answer):
            assert plain.encode() not in r.body, r.body
            assert json.dumps(plain)[1:-1].encode() not in r.body
    # the states, in clear and in order
    said = states(mine)
    assert said[0] == "TASK_STATE_SUBMITTED"
    assert said[-1] == "TASK_STATE_COMPLETED"
    assert set(said) <= A2A_STATES
    # no artifact travels in clear: the result's are inside its envelope (below)
    assert not [r for r in mine if "artifactUpdate" in r.json]
    # every message pushed is sealed; the completed status carries the result's envelope,
    # and it opens with the caller's key as the receiver's answer for this very task
    pushed = [m for r in mine for m in _messages(r.json)]
    assert pushed
    assert all(is_sealed(m) for m in pushed), pushed
    (final,) = [r.json["statusUpdate"] for r in mine if r is mine[-1]]
    result = final["status"]["message"]
    assert is_sealed(result)
    parts, artifacts = open_result(
        result,
        binding=result_binding(request, task=task_id, context=final["contextId"]),
        me=sealed.codex_keys,
        sender=sealed.ops_key,
    )
    assert answer in " ".join(str(p.get("text", "")) for p in parts)
    # the artifacts (the command's stdout) came inside the envelope, not beside it
    assert answer in json.dumps(artifacts)


def test_a_failed_sealed_task_pushes_no_error_text_of_the_receivers(
    sealed: Sealed, store: Store, hook: Hook
) -> None:
    """The adapter's own error ("it broke" on stderr) may quote the content: the receiver
    keeps it, and nothing the relay pushes carries it, nor the request's plaintext."""
    store.set_push_allow_private(WORKSPACE, True)
    secret = "fail " + secrets.token_hex(10)
    task_id, _ = sealed.send(secret, push={"url": hook.url})
    seen = [r for r in hook.wait_for(ended) if r.headers.get("x-mellan-task") == task_id]
    assert states(seen)[-1] == "TASK_STATE_FAILED"
    for r in seen:
        assert secret.encode() not in r.body
        assert b"it broke" not in r.body
    assert "stays on the receiver's machine" in json.dumps(seen[-1].json)
