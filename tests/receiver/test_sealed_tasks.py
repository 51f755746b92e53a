"""Sealed tasks end to end, on both backends: ``mellan send --seal --wait`` through a real
relay to a real ``mellan receiver run``, which opens the task before its adapter and seals
the result back; the caller prints the plaintext, and the relay's database holds neither
the payload nor the result. Then the relay turns hostile — its database is written
directly, as a malicious relay would — and every forgery (altered ciphertext, a routing
field the seal was not bound to, a key it was not sealed to, a replay into another task,
a swapped caller key) is refused by the receiver naming its rule, the task failed and
never run, the error what the caller reads."""

from __future__ import annotations

import asyncio
import json
import secrets
import stat
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from mcp_kit import base_env, start
from melchior.mellan.client.caller import AsyncRelayClient, RelayClient
from melchior.mellan.client.errors import RelayError
from melchior.mellan.client.views import COMPLETED, INPUT_REQUIRED, TaskView
from melchior.mellan.keys import load_keypair
from melchior.mellan.relay.store.base import Store
from melchior.mellan.sealed_tasks import KeyRing
from melchior.mellan.sealing import KeyPair, envelope_of
from receiver_kit import CALLER, CAPABILITY, RECEIVER
from relay_proc import db_url_fixture, owner_fixture, relay_fixture, store_fixture
from sealed_kit import Sealed, sealed_fixture
from storekit import assert_holds_none, database_text, rewrite_payload_in

__all__ = ["db_url_fixture", "owner_fixture", "relay_fixture", "sealed_fixture", "store_fixture"]


def test_a_sealed_task_runs_end_to_end_and_the_relay_holds_no_plaintext(
    sealed: Sealed, store: Store, db_url: str
) -> None:
    secret = "ledger " + secrets.token_hex(12)
    out = sealed.codex(
        "send", RECEIVER, secret, "--capability", CAPABILITY, "--seal", "--wait", "--as", CALLER
    )
    # the adapter read the plaintext (the worker upper-cases it); the caller opened the result
    assert f"done: {secret.upper()} (turn 1)" in out, out
    shown = json.loads(
        sealed.codex(
            "send",
            RECEIVER,
            secret + " again",
            "--capability",
            CAPABILITY,
            "--seal",
            "--wait",
            "--json",
            "--as",
            CALLER,
        )
    )
    task = shown["task"]
    meta = task["metadata"]["https://melchior.dev/ext/sealed/v1"]
    assert meta["sealed"] is True
    assert meta["opened"] is True
    assert meta["to"] == sealed.ops_key.fingerprint
    assert meta["from"] == sealed.codex_keys.public.fingerprint
    assert f"done: {secret.upper()} AGAIN" in json.dumps(task["status"]["message"])
    # the relay holds ciphertext only: not the payload, not the result
    assert_holds_none(db_url, secret, secret.upper())  # nor the worker's answer
    rows = [t for t in store.list_tasks("default") if t.caller == CALLER]
    assert len(rows) == 2
    assert all("ext/sealed/v1" in (t.result or "") for t in rows)


def test_forgeries_by_the_relay_are_refused_by_the_receiver_and_never_run(
    sealed: Sealed, store: Store
) -> None:
    # a genuine sealed task first: the receiver pins local/codex's key and opens it
    secret = "mailbox " + secrets.token_hex(8)
    sealed.codex(
        "send", RECEIVER, secret, "--capability", CAPABILITY, "--seal", "--wait", "--as", CALLER
    )
    (genuine,) = [t for t in store.list_tasks("default") if t.caller == CALLER]

    # the ciphertext altered: the caller's signature no longer verifies
    message = sealed.sealed("altered")
    envelope = envelope_of(message)
    assert envelope is not None
    body = envelope["sealed"]
    envelope["sealed"] = ("A" if body[0] != "A" else "B") + body[1:]
    said = sealed.refused(sealed.forged(store, message), "signature")
    assert "altered" in said

    # a routing field the seal was not bound to: sealed for deploy, routed as inspect
    moved = sealed.refused(sealed.forged(store, sealed.sealed("moved", capability="deploy")),
                           "binding")  # fmt: skip
    assert "capability differs" in moved
    assert "'deploy'" in moved

    # sealed to a key that is not the receiver's
    stranger = KeyPair.generate().public
    wrong = sealed.refused(sealed.forged(store, sealed.sealed("wrong", to=stranger)), "recipient")
    assert stranger.fingerprint in wrong

    # the genuine task's payload handed out again as another task
    replayed = json.loads(genuine.payload)
    replay = sealed.refused(sealed.forged(store, replayed), "replay")
    assert genuine.id in replay

    # the relay swaps local/codex's key and forges with the new one: the receiver's pin holds
    forger = KeyPair.generate()
    store.set_agent_key("default", CALLER, forger.public.text(), forger.public.fingerprint)
    swapped = sealed.refused(sealed.forged(store, sealed.sealed("swap", sender=forger)), "key")
    assert sealed.codex_keys.public.fingerprint in swapped
    assert forger.public.fingerprint in swapped


def test_a_sealed_task_asks_back_and_the_sealed_answer_is_its_next_turn(
    sealed: Sealed, db_url: str
) -> None:
    """Through the async client (the library path): the question comes back sealed and
    opens, the caller's answer is sealed to the same task, and its result opens too."""
    secret = "customer " + secrets.token_hex(8)

    async def converse() -> tuple[TaskView, TaskView]:
        keys = KeyRing(sealed.codex.home / "config" / "mellan")
        async with AsyncRelayClient(
            sealed.net.relay.url, sealed.net.caller_token, keys=keys
        ) as client:
            asked = await client.send(
                RECEIVER, f"ask about {secret}", capability=CAPABILITY, seal=True, wait=True
            )
            answered = await client.send(
                RECEIVER, f"history of {secret}", capability=CAPABILITY, task=asked.id,
                seal=True, wait=True,
            )  # fmt: skip
            return asked, answered

    asked, answered = asyncio.run(converse())
    assert asked.state == INPUT_REQUIRED
    assert "which one?" in asked.answer
    assert asked.seal is not None
    assert answered.id == asked.id
    assert answered.state == COMPLETED
    assert f"done: HISTORY OF {secret.upper()} (turn 2)" in answered.answer
    # a fresh run reads the earlier turn opened, and a note for the answer sealed away
    (earlier,) = json.loads(answered.answer.split("\n")[0])
    assert earlier["text"] == f"ask about {secret}"
    assert "sealed to the caller" in earlier["answer"]
    assert_holds_none(db_url, secret, secret.upper())  # nor the worker's answer


def test_the_mcp_bridge_sends_sealed_and_reads_the_opened_answer(
    sealed: Sealed, runtime_dir: Path, db_url: str
) -> None:
    """The agent's MCP bridge as the caller: ``relay_send`` with ``seal`` uses the key
    'mellan join' stored beside the credential the bridge acts with."""
    env = base_env(runtime_dir, sealed.codex.home / "config", CLAUDE_CODE_SESSION_ID="sealed")
    secret = "incident " + secrets.token_hex(8)
    ask = {"agent": RECEIVER, "message": secret, "capability": CAPABILITY}

    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            me = await start(stack, env, "--as", CALLER)
            waited = await me.one("relay_send", **ask, mode="wait", seal=True)
            assert waited["receipt"] == "answered"
            assert f"done: {secret.upper()}" in json.dumps(waited["task"]["status"]["message"])
            meta = waited["task"]["metadata"]["https://melchior.dev/ext/sealed/v1"]
            assert meta["opened"] is True
            clear = await me.error("relay_send", **ask)
            assert clear["rule"] == "grant"
            assert "requires sealed sends" in clear["reason"]
            streamed = await me.one("relay_send", **ask, mode="stream", seal=True)
            assert streamed["receipt"] == "answered", streamed
            assert f"done: {secret.upper()}" in streamed["events"][-1]
            assert f"done: {secret.upper()}" in json.dumps(streamed["task"]["status"]["message"])

    asyncio.run(scenario())
    assert secret.encode() not in database_text(db_url)


def test_a_sealed_stream_tells_the_states_and_opens_the_answer_at_its_end(
    sealed: Sealed, db_url: str
) -> None:
    """``mellan send --seal --stream``: the states as they happen, the answer opened (its
    metadata says so), nothing readable at the relay; the async client streams the same."""
    secret = "ledger " + secrets.token_hex(8)
    send = ("send", RECEIVER, secret, "--capability", CAPABILITY, "--seal", "--stream")
    lines = sealed.codex(*send, "--as", CALLER).splitlines()
    assert lines[0].startswith("task "), lines
    assert f"done: {secret.upper()} (turn 1)" in lines[-1], lines
    events = [
        json.loads(line) for line in sealed.codex(*send, "--json", "--as", CALLER).splitlines()
    ]
    final = events[-1]["statusUpdate"]
    assert final["status"]["state"] == "TASK_STATE_COMPLETED"
    assert final["metadata"]["https://melchior.dev/ext/sealed/v1"]["opened"] is True
    assert f"done: {secret.upper()}" in json.dumps(final["status"]["message"])
    assert "extensions" not in final["status"]["message"]  # opened, not the envelope
    first = events[0]["task"]["metadata"]["https://melchior.dev/ext/sealed/v1"]
    assert first["to"] == sealed.ops_key.fingerprint

    async def stream() -> list[str]:
        async with AsyncRelayClient(
            sealed.net.relay.url, sealed.net.caller_token, keys=sealed.keys()
        ) as client:
            return [e.state async for e in client.stream(
                RECEIVER, secret, capability=CAPABILITY, seal=True)]  # fmt: skip

    states = asyncio.run(stream())
    assert states[-1] == COMPLETED
    assert_holds_none(db_url, secret, secret.upper())  # nor the worker's answer


def test_a_sealed_task_read_later_opens_with_the_callers_own_request(
    sealed: Sealed, store: Store, db_url: str
) -> None:
    """A send that did not wait: the result read later, by another client (another
    process), opens — the caller's own sealed request, proved by its signature, says how;
    a relay that rewrites that request's bound fields gets a refusal, not an answer."""
    secret = "mailbox " + secrets.token_hex(8)
    accepted = json.loads(
        sealed.codex(
            "send", RECEIVER, secret, "--capability", CAPABILITY, "--seal", "--json", "--as", CALLER
        )
    )
    task_id = accepted["task"]["id"]
    sealed.net.settled(task_id)
    with RelayClient(sealed.net.relay.url, sealed.net.caller_token, keys=sealed.keys()) as client:
        later = client.wait(RECEIVER, task_id)
    assert later.state == COMPLETED
    assert f"done: {secret.upper()} (turn 1)" in later.answer
    assert later.raw["metadata"]["https://melchior.dev/ext/sealed/v1"]["opened"] is True
    # a machine without the caller's keys reads nothing, and says why
    elsewhere = KeyRing(sealed.net.home / "elsewhere")
    with (
        RelayClient(sealed.net.relay.url, sealed.net.caller_token, keys=elsewhere) as client,
        pytest.raises(RelayError, match="sealed and cannot be opened here"),
    ):
        client.get(RECEIVER, task_id)
    # the relay rewrites the stored request's bound capability: the signature is the caller's
    (row,) = [t for t in store.list_tasks("default") if t.id == task_id]
    payload = json.loads(row.payload)
    message = payload.get("message", payload)
    envelope = envelope_of(message)
    assert envelope is not None
    envelope["bound"]["capability"] = "deploy"
    rewrite_payload_in(db_url, task_id, json.dumps(payload))
    with (
        RelayClient(sealed.net.relay.url, sealed.net.caller_token, keys=sealed.keys()) as client,
        pytest.raises(RelayError, match="signature"),
    ):
        client.get(RECEIVER, task_id)


def test_a_key_rotated_with_a_task_in_flight_opens_it_and_callers_must_trust_the_new_one(
    sealed: Sealed, store: Store
) -> None:
    """``mellan agent rotate-key``: a task sealed to the old key and still queued opens
    with the retired key and its result comes back; the caller's pin refuses the new key
    (nothing sent) until its operator trusts the new fingerprint; after that new sends are
    sealed to it, and the earlier result still opens."""
    sealed.receiver.stop()
    before = "before " + secrets.token_hex(8)
    queued = json.loads(
        sealed.codex(
            "send", RECEIVER, before, "--capability", CAPABILITY, "--seal", "--json", "--as", CALLER
        )
    )
    queued_id = queued["task"]["id"]

    out = sealed.ops("agent", "rotate-key", RECEIVER)
    old = sealed.ops_key.fingerprint
    agents = sealed.ops.home / "config" / "mellan" / "agents"
    new = load_keypair(agents, RECEIVER).public.fingerprint
    assert new != old
    assert f"key {new} registered; {old} retired" in out
    assert f"mellan key trust {RECEIVER} {new}" in out
    retired = agents / "private" / "ops.retired"
    assert stat.S_IMODE(retired.stat().st_mode) == 0o600
    assert not (agents / "private" / "ops.key.new").exists()
    with sealed.net.relay.client(sealed.net.caller_token) as http:
        assert http.get(f"/api/keys/{RECEIVER}").json()["fingerprint"] == new

    # the queued task, sealed to the retired key, opens and completes
    sealed.restart()
    assert sealed.net.settled(queued_id)["state"] == "succeeded"
    with RelayClient(sealed.net.relay.url, sealed.net.caller_token, keys=sealed.keys()) as client:
        assert f"done: {before.upper()}" in client.get(RECEIVER, queued_id).answer

    # the caller's pin refuses the new key: nothing is sent
    after = "after " + secrets.token_hex(8)
    send = ("send", RECEIVER, after, "--capability", CAPABILITY, "--seal", "--wait", "--as", CALLER)
    refused = sealed.codex(*send, code=1)
    assert f"pinned {old}, offered {new}" in refused
    assert f"mellan key trust {RECEIVER} {new}" in refused
    assert all(after not in (t.payload or "") for t in store.list_tasks("default"))

    # trusted (after checking with the owner): sealed to the new key, and it completes
    assert "trusted" in sealed.codex("key", "trust", RECEIVER, new)
    assert f"done: {after.upper()}" in sealed.codex(*send)
    with RelayClient(sealed.net.relay.url, sealed.net.caller_token, keys=sealed.keys()) as client:
        assert f"done: {before.upper()}" in client.get(RECEIVER, queued_id).answer
