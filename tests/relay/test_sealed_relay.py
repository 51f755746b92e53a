"""Sealed sends at a real relay, on both backends: a grant made ``--sealed`` refuses an
unsealed send at the door with its rule; a sealed one is accepted and stored as
ciphertext — the database's bytes (SQLite's file, PostgreSQL's rows) never hold the
payload — and what the relay hands the receiver opens with the receiver's key, bound to
the task's routing fields."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import httpx

from melchior.mellan.keys import load_keypair
from melchior.mellan.relay.store.base import Store
from melchior.mellan.sealing import (
    Binding,
    KeyPair,
    PublicKey,
    envelope_of,
    open_envelope,
    seal,
    sealed_message,
)
from relay_proc import Cli, RelayProc, db_url_fixture, owner_fixture, relay_fixture, store_fixture
from storekit import database_text

__all__ = ["db_url_fixture", "owner_fixture", "relay_fixture", "store_fixture"]

CAP = "incident.inspect"


def _send(relay: RelayProc, ws: str, token: str, message: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{relay.url}/a2a/{ws}/private/ops/message:send",
        json={"message": message, "configuration": {"returnImmediately": True}},
        headers={"A2A-Version": "1.0", "Authorization": f"Bearer {token}"},
        timeout=30,
    )


def test_a_sealed_grant_refuses_clear_sends_and_the_relay_holds_only_ciphertext(
    relay: RelayProc, owner: Cli, store: Store, db_url: str, tmp_path: Path
) -> None:
    owner("agent", "add", "private/ops", "--capability", CAP)
    owner("agent", "add", "local/codex")
    out = owner("grant", "add", "local/codex", "private/ops", CAP, "--sealed")
    assert "sealed sends only" in out
    assert "sealed" in owner("grant", "list")
    machines: dict[str, Path] = {}
    for agent in ("private/ops", "local/codex"):
        home = tmp_path / agent.replace("/", "-")
        Cli(home)("join", owner.json("enroll", agent)["code"], "--relay", relay.url)
        machines[agent] = home / "config" / "mellan" / "agents"
    token = json.loads((machines["local/codex"] / "local" / "codex.json").read_text())["token"]
    (ws,) = store.workspaces()
    secret = "ledger-" + secrets.token_hex(12)

    # in clear: refused at the door, naming the rule, and nothing stored
    clear = {"messageId": "m-clear", "role": "ROLE_USER", "parts": [{"text": secret}]}
    refused = _send(relay, ws, token, clear)
    assert refused.status_code == 403, refused.text
    assert "requires sealed sends" in refused.text
    assert "mellan send --seal" in refused.text
    assert any(r.rule == "sealed-grant" for r in store.audit_since(ws))

    # sealed: accepted, and the database never holds the payload
    me = load_keypair(machines["local/codex"], "local/codex")
    with relay.client(token) as http:
        ops_key = PublicKey.parse(http.get("/api/keys/private/ops").json()["public_key"])
    binding = Binding(
        direction="request", workspace=ws, caller="local/codex", receiver="private/ops",
        capability=CAP, context=None, task=None, message="m-sealed",
    )  # fmt: skip
    envelope = seal([{"text": secret}], binding=binding, to=ops_key, sender=me)
    accepted = _send(relay, ws, token, sealed_message(envelope, message_id="m-sealed"))
    assert accepted.status_code == 200, accepted.text
    assert secret not in accepted.text
    assert secret.encode() not in database_text(db_url)

    # what the relay stored opens with the receiver's key, for exactly this task's fields
    (task,) = [t for t in store.list_tasks(ws) if t.caller == "local/codex"]
    stored = json.loads(task.payload)
    opened = open_envelope(
        envelope_of(stored.get("message", stored)),
        binding=binding,
        me=load_keypair(machines["private/ops"], "private/ops"),
        sender=me.public,
    )
    assert opened.parts[0]["text"] == secret


def test_mellan_send_seal_pins_the_key_seals_the_message_and_refuses_a_swapped_key(
    relay: RelayProc, owner: Cli, store: Store, db_url: str, tmp_path: Path
) -> None:
    owner("agent", "add", "private/ops", "--capability", CAP)
    owner("agent", "add", "local/codex")
    owner("grant", "add", "local/codex", "private/ops", CAP, "--sealed")
    clis = {}
    for agent in ("private/ops", "local/codex"):
        clis[agent] = Cli(tmp_path / agent.replace("/", "-"))
        clis[agent]("join", owner.json("enroll", agent)["code"], "--relay", relay.url)
    codex = clis["local/codex"]
    ops_dir = tmp_path / "private-ops" / "config" / "mellan" / "agents"
    ops_key = load_keypair(ops_dir, "private/ops").public
    secret = "mailbox-" + secrets.token_hex(12)
    send = ("send", "private/ops", secret, "--capability", CAP, "--as", "local/codex")

    # first use pins the key; the task is accepted and says it is sealed, to which key
    out = codex(*send, "--seal")
    assert f"sealed to {ops_key.fingerprint}" in out
    shown = json.loads(codex(*send, "--seal", "--json"))
    assert shown["task"]["metadata"]["https://melchior.dev/ext/sealed/v1"]["to"] == (
        ops_key.fingerprint
    )
    assert secret.encode() not in database_text(db_url)
    # without --capability nothing is sealed to a capability the relay would choose
    no_cap = codex("send", "private/ops", secret, "--seal", "--as", "local/codex", code=1)
    assert "names its capability" in no_cap
    # the same default from the environment: $MELLAN_SEAL=1
    codex.env["MELLAN_SEAL"] = "1"
    assert "sealed to" in codex(*send)
    del codex.env["MELLAN_SEAL"]

    # the relay swaps the receiver's key: the caller's pin refuses, and nothing is sent
    before = len(store.list_tasks(store.workspaces()[0]))
    swapped = KeyPair.generate().public
    store.set_agent_key(store.workspaces()[0], "private/ops", swapped.text(), swapped.fingerprint)
    err = codex(*send, "--seal", code=1)
    assert "not sealed, so not sent" in err
    assert ops_key.fingerprint in err
    assert swapped.fingerprint in err
    assert len(store.list_tasks(store.workspaces()[0])) == before
