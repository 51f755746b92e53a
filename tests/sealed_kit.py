"""Sealed tasks between real parts, for tests: a real relay (``relay_proc``), two agents
joined with ``mellan join`` (each machine's key pair beside its credential, the public
halves registered with the relay), a grant made ``--sealed``, and a real
``mellan receiver run`` for the receiving agent whose route runs ``receiver_kit.WORKER``
(it answers ``done: TEXT UPPER-CASED (turn N)``): the request's plaintext and the
result's are two different strings a test can look for.

Import ``sealed_fixture`` (with ``relay_proc``'s fixtures) into a test module to get
``sealed`` there.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from melchior.mellan.client.caller import RelayClient
from melchior.mellan.keys import load_keypair
from melchior.mellan.relay.store.base import NewTask, Store
from melchior.mellan.sealed_tasks import KeyRing, seal_request
from melchior.mellan.sealing import Binding, KeyPair, PublicKey
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
from relay_proc import Cli, RelayProc, ok

WORKSPACE = "default"


@dataclasses.dataclass
class Sealed:
    net: Net
    codex: Cli
    ops: Cli
    count: Path
    receiver: ReceiverProc
    codex_keys: KeyPair
    ops_key: PublicKey
    env: dict[str, str]

    def restart(self) -> None:
        """The receiver stopped and started again (it reads its keys afresh)."""
        self.receiver.stop()
        self.receiver = spawn_receiver(self.receiver.config, self.env)

    def keys(self) -> KeyRing:
        """The caller's machine's keys and pins, as its CLI keeps them."""
        return KeyRing(self.codex.home / "config" / "mellan")

    def forged(self, store: Store, message: dict[str, Any], capability: str = CAPABILITY) -> str:
        """A task the relay made up itself: ``message`` stored as if local/codex sent it
        (without the door's dedupe key, which a relay replaying a message would not keep)."""
        task, created = store.enqueue(
            NewTask(
                workspace=WORKSPACE, caller=CALLER, receiver=RECEIVER, capability=capability,
                payload=json.dumps(message),
            )
        )  # fmt: skip
        assert created
        return task.id

    def sealed(self, text: str, *, capability: str = CAPABILITY, to: PublicKey | None = None,
               sender: KeyPair | None = None) -> dict[str, Any]:  # fmt: skip
        clear = {"messageId": secrets.token_hex(8), "role": "ROLE_USER", "parts": [{"text": text}]}
        message, _ = seal_request(
            clear, workspace=WORKSPACE, caller=CALLER, receiver=RECEIVER, capability=capability,
            to=to or self.ops_key, sender=sender or self.codex_keys,
        )  # fmt: skip
        return message

    def send(self, text: str, *, push: dict[str, Any] | None = None) -> tuple[str, Binding]:
        """A sealed task from local/codex through the A2A entry (``push``: a push
        notification config sent with it): its id and the binding it was sealed for."""
        clear = {"messageId": secrets.token_hex(8), "role": "ROLE_USER", "parts": [{"text": text}]}
        message, binding = seal_request(
            clear, workspace=WORKSPACE, caller=CALLER, receiver=RECEIVER, capability=CAPABILITY,
            to=self.ops_key, sender=self.codex_keys,
        )  # fmt: skip
        config: dict[str, Any] = {"returnImmediately": True}
        if push is not None:
            config["taskPushNotificationConfig"] = push
        body = {"message": message, "configuration": config}
        with self.net.relay.client(self.net.caller_token) as c:
            answer = ok(
                c.post(f"/a2a/{WORKSPACE}/{RECEIVER}/message:send", json=body,
                       headers={"A2A-Version": "1.0"})
            )  # fmt: skip
        return str(answer["task"]["id"]), binding

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


@pytest.fixture(name="sealed")
def sealed_fixture(relay: RelayProc, owner: Cli, tmp_path: Path) -> Iterator[Sealed]:
    """The relay with local/codex granted incident.inspect on private/ops ``--sealed``,
    both joined, and private/ops's receiver running."""
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
    env = {**ops.env, "COUNT_FILE": str(count)}
    state = Sealed(
        net, codex, ops, count, spawn_receiver(config, env),
        load_keypair(agents[CALLER], CALLER), load_keypair(agents[RECEIVER], RECEIVER).public, env,
    )  # fmt: skip
    try:
        yield state
    finally:
        state.receiver.stop()
