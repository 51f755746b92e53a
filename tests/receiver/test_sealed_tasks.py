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
import dataclasses
import json
import secrets
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from mcp_kit import base_env, start
from melchior.mellan.client.caller import AsyncRelayClient, RelayClient
from melchior.mellan.client.views import COMPLETED, INPUT_REQUIRED, TaskView
from melchior.mellan.keys import load_keypair
from melchior.mellan.relay.store.base import NewTask, Store
from melchior.mellan.sealed_tasks import KeyRing, seal_request
from melchior.mellan.sealing import KeyPair, PublicKey, envelope_of
from receiver_kit import (
    CALLER,
    CAPABILITY,
    RECEIVER,
    Net,
    ReceiverProc,
    executions,
    spawn_receiver,
    worker_route,
    write_config,
)
from relay_proc import Cli, RelayProc, db_url_fixture, owner_fixture, relay_fixture, store_fixture
from storekit import database_text

__all__ = ["db_url_fixture", "owner_fixture", "relay_fixture", "store_fixture"]


@dataclasses.dataclass
class Sealed:
    net: Net
    codex: Cli
    ops: Cli
    count: Path
    receiver: ReceiverProc
    codex_keys: KeyPair
    ops_key: PublicKey

    def forged(self, store: Store, message: dict[str, Any], capability: str = CAPABILITY) -> str:
        """A task the relay made up itself: ``message`` stored as if local/codex sent it
        (without the door's dedupe key, which a relay replaying a message would not keep)."""
        task, created = store.enqueue(
            NewTask(
                workspace="default", caller=CALLER, receiver=RECEIVER, capability=capability,
                payload=json.dumps(message),
            )
        )  # fmt: skip
        assert created
        return task.id

    def sealed(self, text: str, *, capability: str = CAPABILITY, to: PublicKey | None = None,
               sender: KeyPair | None = None) -> dict[str, Any]:  # fmt: skip
        clear = {"messageId": secrets.token_hex(8), "role": "ROLE_USER", "parts": [{"text": text}]}
        message, _ = seal_request(
            clear, workspace="default", caller=CALLER, receiver=RECEIVER, capability=capability,
            to=to or self.ops_key, sender=sender or self.codex_keys,
        )  # fmt: skip
        return message

    def refused(self, task_id: str, rule: str) -> str:
        """The error the caller reads for a task the receiver refused by ``rule``."""
        found = self.net.settled(task_id)
        assert found["state"] == "failed", found
        assert f"refused by the receiver (sealed-{rule})" in (found["error"] or ""), found
        with RelayClient(self.net.relay.url, self.net.caller_token) as client:
            seen = client.get(RECEIVER, task_id)
        assert seen.failed
        assert f"sealed-{rule}" in seen.answer
        assert executions(self.count, task_id) == 0  # never run
        return seen.answer


@pytest.fixture
def sealed(relay: RelayProc, owner: Cli, tmp_path: Path) -> Iterator[Sealed]:
    owner("agent", "add", RECEIVER, "--capability", CAPABILITY, "--capability", "deploy")
    owner("agent", "add", CALLER)
    owner("grant", "add", CALLER, RECEIVER, CAPABILITY, "--sealed")
    machines = {}
    for agent in (RECEIVER, CALLER):
        cli = Cli(tmp_path / agent.replace("/", "-"))
        cli("join", owner.json("enroll", agent)["code"], "--relay", relay.url)
        machines[agent] = cli
    ops, codex = machines[RECEIVER], machines[CALLER]
    agents = {a: c.home / "config" / "mellan" / "agents" for a, c in machines.items()}

    def token(agent: str) -> str:
        return str(json.loads((agents[agent] / f"{agent}.json").read_text())["token"])

    net = Net(relay, token(CALLER), token(RECEIVER), tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    count = tmp_path / "count.txt"
    worker_route(net, work, tmp_path / "worker.py")
    (tmp_path / "receiver").mkdir()
    config = write_config(
        tmp_path / "receiver" / "receiver.toml", net, work,
        credential=agents[RECEIVER] / f"{RECEIVER}.json",
    )  # fmt: skip
    receiver = spawn_receiver(config, {**ops.env, "COUNT_FILE": str(count)})
    try:
        ops_key = load_keypair(agents[RECEIVER], RECEIVER).public
        yield Sealed(net, codex, ops, count, receiver,
                     load_keypair(agents[CALLER], CALLER), ops_key)  # fmt: skip
    finally:
        receiver.stop()


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
    held = database_text(db_url)
    assert secret.encode() not in held
    assert secret.upper().encode() not in held
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
    held = database_text(db_url)
    assert secret.encode() not in held
    assert secret.upper().encode() not in held


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
            streamed = await me.error("relay_send", **ask, mode="stream", seal=True)
            assert streamed["code"] == "bad-args"
            assert "does not stream" in streamed["reason"]

    asyncio.run(scenario())
    assert secret.encode() not in database_text(db_url)
