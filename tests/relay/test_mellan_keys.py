"""Agent keys over the real ``mellan`` executable and a real relay, on both backends:
``mellan join`` makes the key pair on the agent's machine (0600, only the public half
sent) and registers it; ``mellan agent get`` shows its fingerprint; a caller pins it on
first use, and a key the relay swaps is refused until ``mellan key trust``."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import httpx

from melchior.mellan.keys import load_keypair
from melchior.mellan.relay.store.base import Store
from melchior.mellan.sealing import SEALED_URI, KeyPair
from relay_proc import Cli, RelayProc, db_url_fixture, owner_fixture, relay_fixture, store_fixture

__all__ = ["db_url_fixture", "owner_fixture", "relay_fixture", "store_fixture"]


def test_join_registers_a_key_pinned_by_callers_and_a_swap_is_caught(
    relay: RelayProc, owner: Cli, store: Store, tmp_path: Path
) -> None:
    owner("agent", "add", "private/ops", "--capability", "incident.inspect")
    owner("agent", "add", "local/codex")
    owner("agent", "add", "local/stranger")
    owner("grant", "add", "local/codex", "private/ops", "incident.inspect")

    ops = Cli(tmp_path / "ops-machine")
    out = ops("join", owner.json("enroll", "private/ops")["code"], "--relay", relay.url)
    agents_dir = tmp_path / "ops-machine" / "config" / "mellan" / "agents"
    key_path = agents_dir / "private" / "ops.key"
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    mine = load_keypair(agents_dir, "private/ops").public
    assert mine.fingerprint in out
    # the relay holds the public half, and nothing of the private one
    shown = owner("agent", "get", "private/ops")
    assert f"key: {mine.fingerprint}" in shown
    private_text = key_path.read_text().strip()
    with relay.owner() as http:
        assert http.get("/api/keys/private/ops").json()["public_key"] == mine.text()

    codex = Cli(tmp_path / "codex-machine")
    codex("join", owner.json("enroll", "local/codex")["code"], "--relay", relay.url)
    stranger = Cli(tmp_path / "stranger-machine")
    stranger("join", owner.json("enroll", "local/stranger")["code"], "--relay", relay.url)
    first = codex("key", "show", "private/ops", "--as", "local/codex")
    assert mine.fingerprint in first
    # an agent with no grant either way is answered as for an unknown agent
    assert "not-found" in stranger("key", "show", "private/ops", "--as", "local/stranger", code=1)

    # the cards declare the sealed extension; only a granted caller's names the fingerprint
    def sealed_ext(card: dict[str, Any]) -> dict[str, Any]:
        (found,) = [e for e in card["capabilities"]["extensions"] if e["uri"] == SEALED_URI]
        return found

    base = f"{relay.url}/a2a/{store.workspaces()[0]}/private/ops"
    public = httpx.get(f"{base}/.well-known/agent-card.json", timeout=30).json()
    assert "fingerprint" not in sealed_ext(public)["params"]
    for who, machine, shown in (("local/codex", "codex-machine", True),
                                ("local/stranger", "stranger-machine", False)):  # fmt: skip
        stored = tmp_path / machine / "config" / "mellan" / "agents" / f"{who}.json"
        bearer = {"A2A-Version": "1.0",
                  "Authorization": f"Bearer {json.loads(stored.read_text())['token']}"}  # fmt: skip
        card = httpx.get(f"{base}/extendedAgentCard", headers=bearer, timeout=30).json()
        params = sealed_ext(card)["params"]
        assert params.get("fingerprint") == (mine.fingerprint if shown else None), who

    # the relay swaps the key (here: its database does): the caller's pin refuses it
    swapped = KeyPair.generate().public
    (workspace,) = store.workspaces()
    store.set_agent_key(workspace, "private/ops", swapped.text(), swapped.fingerprint)
    err = codex("key", "show", "private/ops", "--as", "local/codex", code=1)
    assert mine.fingerprint in err
    assert swapped.fingerprint in err
    assert f"mellan key trust private/ops {swapped.fingerprint}" in err
    # trusting it (after checking with the agent's owner) lets it in, and pins it
    codex("key", "trust", "private/ops", swapped.fingerprint)
    assert swapped.fingerprint in codex("key", "show", "private/ops", "--as", "local/codex")

    # the private key never goes to the relay: refused if an agent tries; an owner binds none
    with httpx.Client(base_url=relay.url, timeout=30) as http:
        token = json.loads((agents_dir / "private" / "ops.json").read_text())["token"]
        bearer = {"authorization": f"Bearer {token}"}
        refused = http.put(
            "/api/keys/private/ops", json={"public_key": private_text}, headers=bearer
        )
        assert refused.status_code == 400
        assert "private key" in refused.text
    with relay.owner() as http:
        refused = http.put("/api/keys/private/ops", json={"public_key": mine.text()})
        assert refused.status_code == 403
        assert "agent itself" in refused.text
