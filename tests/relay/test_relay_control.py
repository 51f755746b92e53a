"""The control API over real HTTP on both backends: credentials, enrollment, agents, grants,
audit, workspaces, body limits."""

from __future__ import annotations

import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from melchior.mellan.client.receiver import ReceiverClient
from melchior.mellan.relay.auth import hash_token, new_token
from melchior.mellan.relay.store.base import Capability, CredentialKind, Outcome, Store
from relay_proc import (
    RelayProc,
    add_agent,
    db_url_fixture,
    enqueue,
    enroll_and_join,
    ok,
    relay_fixture,
    setup_pair,
    start_relay,
    store_fixture,
)

__all__ = ["db_url_fixture", "relay_fixture", "store_fixture"]


JSON_TYPE = {"content-type": "application/json"}


def err(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body["error"]) == {"code", "reason", "rule"}, body
    assert body["error"]["reason"], body
    error: dict[str, Any] = body["error"]
    return error


# -- first start ---------------------------------------------------------------------------------


def test_first_start_writes_a_private_owner_token_once(db_url: str, tmp_path: Path) -> None:
    relay = start_relay(db_url, tmp_path)
    try:
        assert relay.token_file.exists()
        assert stat.S_IMODE(relay.token_file.stat().st_mode) == 0o600
        assert relay.owner_token.startswith("mln_")
        assert all(relay.owner_token not in line for line in relay.lines)
        assert any(str(relay.token_file) in line for line in relay.lines)
        with relay.owner() as c:
            me = ok(c.get("/api/whoami"))
        assert me["kind"] == "owner"
        assert me["workspace"] == "default"
    finally:
        assert relay.stop() == 0
    assert any("stopped" in line for line in relay.lines)
    # second start: nothing minted, the first token still works
    second_file = tmp_path / "second.token"
    again = start_relay(db_url, tmp_path, token_file=second_file)
    try:
        assert not second_file.exists()
        assert any("exists" in line for line in again.lines)
        with again.client(relay.owner_token) as c:
            ok(c.get("/api/whoami"))
    finally:
        again.stop()


# -- credentials ---------------------------------------------------------------------------------


def test_missing_wrong_revoked_and_expired_credentials(relay: RelayProc, store: Store) -> None:
    with relay.client() as c:
        assert err(c.get("/api/agents"), 401)["code"] == "unauthenticated"
    with relay.client("mln_" + "x" * 43) as c:
        assert err(c.get("/api/agents"), 401)["code"] == "bad-credential"
    with relay.client() as c:
        r = c.get("/api/agents", headers={"authorization": "Basic abc"})
        assert err(r, 401)["code"] == "unauthenticated"

    add_agent(relay, "private/ops", "incident.inspect")
    token = enroll_and_join(relay, "private/ops")
    with relay.client(token) as c:
        me = ok(c.get("/api/whoami"))
    with relay.owner() as c:
        ok(c.delete(f"/api/credentials/{me['credential_id']}"))
        err(c.delete(f"/api/credentials/{me['credential_id']}"), 404)
    with relay.client(token) as c:
        assert err(c.get("/api/whoami"), 401)["code"] == "bad-credential"

    expired = new_token()
    past = "2000-01-01T00:00:00.000Z"
    store.add_credential("default", CredentialKind.AGENT, "private/ops", hash_token(expired), past)
    with relay.client(expired) as c:
        assert err(c.get("/api/whoami"), 401)["code"] == "bad-credential"

    audit = _audit(relay)
    assert any(r["action"] == "credential.revoke" and r["allowed"] for r in audit)


def test_agent_may_revoke_only_its_own_credential(relay: RelayProc) -> None:
    add_agent(relay, "a/one")
    add_agent(relay, "a/two")
    one, two = enroll_and_join(relay, "a/one"), enroll_and_join(relay, "a/two")
    with relay.client(two) as c:
        two_id = ok(c.get("/api/whoami"))["credential_id"]
    with relay.client(one) as c:
        assert err(c.delete(f"/api/credentials/{two_id}"), 404)["code"] == "not-found"
        mine = ok(c.get("/api/whoami"))["credential_id"]
        ok(c.delete(f"/api/credentials/{mine}"))
        err(c.get("/api/whoami"), 401)
    with relay.client(two) as c:
        ok(c.get("/api/whoami"))


# -- enrollment ----------------------------------------------------------------------------------


def test_enrollment_code_works_once(relay: RelayProc) -> None:
    add_agent(relay, "private/ops", "incident.inspect")
    with relay.owner() as c:
        code = ok(c.post("/api/enrollments", json={"agent": "private/ops"}), 201)["code"]
        assert err(c.post("/api/enrollments", json={"agent": "ghost/x"}), 404)
    with relay.client() as c:
        joined = ok(c.post("/api/join", json={"code": code}), 201)
        assert joined["agent"] == "private/ops"
        assert joined["token"].startswith("mln_")
        assert err(c.post("/api/join", json={"code": code}), 401)["code"] == "bad-code"
        assert err(c.post("/api/join", json={"code": "mlj_nonsense"}), 401)["code"] == "bad-code"
        assert err(c.post("/api/join", json={}), 400)["code"] == "bad-request"
    with relay.client(joined["token"]) as c:
        me = ok(c.get("/api/whoami"))
    assert me == {
        "workspace": "default",
        "kind": "agent",
        "subject": "private/ops",
        "credential_id": joined["credential_id"],
        "relay": relay.url,
    }


def test_expired_enrollment_code_is_refused(relay: RelayProc, store: Store) -> None:
    add_agent(relay, "private/ops")
    code = "mlj_" + new_token()
    store.add_enrollment("default", "private/ops", hash_token(code), "2000-01-01T00:00:00.000Z")
    with relay.client() as c:
        assert err(c.post("/api/join", json={"code": code}), 401)["code"] == "bad-code"


def test_enrollment_needs_an_owner(relay: RelayProc) -> None:
    add_agent(relay, "private/ops")
    token = enroll_and_join(relay, "private/ops")
    with relay.client(token) as c:
        assert err(c.post("/api/enrollments", json={"agent": "private/ops"}), 403)["code"] == (
            "owner-only"
        )


# -- agents --------------------------------------------------------------------------------------


def test_agents_add_list_get_and_refusals(relay: RelayProc) -> None:
    with relay.owner() as c:
        made = ok(
            c.post(
                "/api/agents",
                json={
                    "id": "private/ops",
                    "description": "ops box",
                    "capabilities": ["incident.inspect", {"id": "deploy", "description": "ship"}],
                },
            ),
            201,
        )
        assert [cap["id"] for cap in made["capabilities"]] == ["incident.inspect", "deploy"]
        assert err(c.post("/api/agents", json={"id": "private/ops"}), 409)["code"] == "exists"
        assert err(c.post("/api/agents", json={"id": "bad id!"}), 400)
        assert err(c.post("/api/agents", json={"id": "x", "capabilities": ["a b"]}), 400)
        assert err(c.post("/api/agents", json={"id": "x", "capabilities": ["a", "a"]}), 400)
        bad = c.post("/api/agents", content=b"{not json", headers=JSON_TYPE)
        assert err(bad, 400)["code"] == "bad-json"
        assert err(c.post("/api/agents", json=[1]), 400)
        ok(c.post("/api/agents", json={"id": "local/codex"}), 201)
        ids = [a["id"] for a in ok(c.get("/api/agents"))["agents"]]
        assert sorted(ids) == ["local/codex", "private/ops"]
        assert ok(c.get("/api/agents/private/ops"))["description"] == "ops box"
    token = enroll_and_join(relay, "local/codex")
    with relay.client(token) as c:
        assert [a["id"] for a in ok(c.get("/api/agents"))["agents"]] == ["local/codex"]
        ok(c.get("/api/agents/local/codex"))
        hidden = err(c.get("/api/agents/private/ops"), 404)
        unknown = err(c.get("/api/agents/nobody/here"), 404)
        # "not yours" and "unknown" look the same
        assert hidden["code"] == unknown["code"]
        assert hidden["reason"].replace("private/ops", "X") == unknown["reason"].replace(
            "nobody/here", "X"
        )
        assert err(c.post("/api/agents", json={"id": "sneaky"}), 403)["code"] == "owner-only"
    refused = [r for r in _audit(relay) if not r["allowed"]]
    assert [(r["actor"], r["action"], r["rule"]) for r in refused] == [
        ("agent:local/codex", "agent.add", "owner-only")
    ]


# -- grants --------------------------------------------------------------------------------------


def test_grants_are_checked_and_audited(relay: RelayProc) -> None:
    add_agent(relay, "private/ops", "incident.inspect", "deploy")
    add_agent(relay, "local/codex")
    grant = {"caller": "local/codex", "receiver": "private/ops"}
    with relay.owner() as c:
        r = c.post("/api/grants", json={**grant, "caller": "ghost", "capabilities": ["deploy"]})
        assert err(r, 404)["code"] == "unknown-agent"
        r = c.post("/api/grants", json={**grant, "receiver": "ghost", "capabilities": ["deploy"]})
        assert err(r, 404)["code"] == "unknown-agent"
        r = c.post("/api/grants", json={**grant, "capabilities": ["reboot"]})
        e = err(r, 400)
        assert e["code"] == "unknown-capability"
        assert "deploy" in e["reason"]
        r = c.post(
            "/api/grants",
            json={"caller": "local/codex", "receiver": "local/codex", "capabilities": ["x"]},
        )
        assert err(r, 400)["code"] == "self"
        assert err(c.post("/api/grants", json={**grant, "capabilities": []}), 400)
        g = ok(c.post("/api/grants", json={**grant, "capabilities": ["incident.inspect"]}), 201)
        assert g["capabilities"] == ["incident.inspect"]
        assert g["revoked_at"] is None
        listed = ok(c.get("/api/grants"))["grants"]
        assert [x["id"] for x in listed] == [g["id"]]
        # directional: nothing the other way
        assert ok(c.get("/api/grants", params={"caller": "private/ops"}))["grants"] == []
        ok(c.delete(f"/api/grants/{g['id']}"))
        assert err(c.delete(f"/api/grants/{g['id']}"), 404)["code"] == "not-found"
        assert ok(c.get("/api/grants"))["grants"] == []
        revoked = ok(c.get("/api/grants", params={"include_revoked": "true"}))["grants"]
        assert revoked[0]["revoked_at"] is not None
    records = _audit(relay)
    refused = [r for r in records if r["action"] == "grant.add" and not r["allowed"]]
    assert {r["rule"] for r in refused} == {"unknown-agent", "unknown-capability", "self"}
    assert any(r["action"] == "grant.revoke" and r["allowed"] for r in records)


def test_agent_sees_only_grants_naming_it(relay: RelayProc) -> None:
    add_agent(relay, "private/ops", "incident.inspect")
    add_agent(relay, "local/codex")
    add_agent(relay, "local/other")
    with relay.owner() as c:
        for caller in ("local/codex", "local/other"):
            ok(
                c.post(
                    "/api/grants",
                    json={
                        "caller": caller,
                        "receiver": "private/ops",
                        "capabilities": ["incident.inspect"],
                    },
                ),
                201,
            )
    codex = enroll_and_join(relay, "local/codex")
    ops = enroll_and_join(relay, "private/ops")
    with relay.client(codex) as c:
        mine = ok(c.get("/api/grants"))["grants"]
        assert [g["caller"] for g in mine] == ["local/codex"]
        assert ok(c.get("/api/grants", params={"caller": "local/other"}))["grants"] == []
        assert err(c.post("/api/grants", json={}), 403)["code"] == "owner-only"
    with relay.client(ops) as c:
        assert len(ok(c.get("/api/grants"))["grants"]) == 2


# -- audit ---------------------------------------------------------------------------------------


def _audit(relay: RelayProc, **params: Any) -> list[dict[str, Any]]:
    with relay.owner() as c:
        records: list[dict[str, Any]] = ok(c.get("/api/audit", params=params))["records"]
    return records


def test_audit_pages_and_long_poll_wakes_on_a_new_record(relay: RelayProc) -> None:
    first = _audit(relay)
    last = first[-1]["seq"]
    got: list[dict[str, Any]] = []

    def follow() -> None:
        got.extend(_audit(relay, after=last, wait=30))

    t = threading.Thread(target=follow)
    t.start()
    add_agent(relay, "late/comer")
    t.join(timeout=60)
    assert not t.is_alive()
    assert got
    assert got[0]["action"] == "agent.add"
    assert got[0]["subject"] == "late/comer"
    assert _audit(relay, after=got[-1]["seq"]) == []
    assert len(_audit(relay, limit=1)) == 1
    token = enroll_and_join(relay, "late/comer")
    with relay.client(token) as c:
        assert err(c.get("/api/audit"), 403)["code"] == "owner-only"
        assert err(c.get("/api/audit", params={"after": "x"}), 403)


# -- workspaces ----------------------------------------------------------------------------------


@pytest.fixture
def other_workspace(store: Store) -> str:
    """Workspace 'other' with an owner token and an agent of the same id as in 'default'."""
    store.ensure_workspace("other")
    token = new_token()
    store.add_credential("other", CredentialKind.OWNER, "olga", hash_token(token))
    store.add_agent("other", "private/ops", "theirs", [Capability("incident.inspect")])
    return token


def test_nothing_crosses_workspaces(relay: RelayProc, store: Store, other_workspace: str) -> None:
    setup_pair(relay)
    task_id = enqueue(store)
    with relay.client(other_workspace) as c:
        agents = ok(c.get("/api/agents"))["agents"]
        assert [(a["id"], a["description"]) for a in agents] == [("private/ops", "theirs")]
        assert ok(c.get("/api/tasks"))["tasks"] == []
        assert err(c.get(f"/api/tasks/{task_id}"), 404)["code"] == "not-found"
        assert err(c.post(f"/api/tasks/{task_id}/cancel"), 404)
        assert ok(c.get("/api/grants"))["grants"] == []
        assert ok(c.get("/api/audit"))["records"] == []
        # a grant in 'other' cannot name default's agents
        r = c.post(
            "/api/grants",
            json={
                "caller": "local/codex",
                "receiver": "private/ops",
                "capabilities": ["incident.inspect"],
            },
        )
        assert err(r, 404)["code"] == "unknown-agent"
        owner_id = ok(c.get("/api/whoami"))["credential_id"]
    # an agent with the very same id in 'other' cannot take or touch default's work
    twin = new_token()
    store.add_credential("other", CredentialKind.AGENT, "private/ops", hash_token(twin))
    with ReceiverClient(relay.url, twin) as rc:
        assert rc.claim(wait=0) == []
        assert rc.renew(task_id, 1).outcome is Outcome.NOT_FOUND
        assert rc.complete(task_id, 1, {}).outcome is Outcome.NOT_FOUND
    with relay.owner() as c:
        # default's owner cannot revoke other's credential
        assert err(c.delete(f"/api/credentials/{owner_id}"), 404)
        assert ok(c.get(f"/api/tasks/{task_id}"))["state"] == "queued"


# -- bodies --------------------------------------------------------------------------------------


def test_oversized_bodies_are_refused(db_url: str, tmp_path: Path) -> None:
    relay = start_relay(db_url, tmp_path, "--max-body", "2048")
    try:
        big = {"id": "x", "description": "y" * 4000}
        with relay.owner() as c:
            e = err(c.post("/api/agents", json=big), 413)
            assert e["code"] == "payload-too-large"
            assert "2048" in e["reason"]

            def chunks() -> Iterator[bytes]:
                yield b'{"id": "x", "description": "'
                for _ in range(100):
                    yield b"y" * 100
                yield b'"}'

            # no Content-Length: counted while streaming, refused past the limit
            e = err(c.post("/api/agents", content=chunks(), headers=JSON_TYPE), 413)
            assert e["code"] == "payload-too-large"
            assert ok(c.get("/api/agents"))["agents"] == []
            ok(c.post("/api/agents", json={"id": "x", "description": "fits"}), 201)
    finally:
        relay.stop()


def test_unknown_endpoints_and_methods_answer_in_the_error_shape(relay: RelayProc) -> None:
    with relay.owner() as c:
        assert err(c.get("/api/nothing-here"), 404)["code"] == "no-such-endpoint"
        assert err(c.put("/api/agents"), 405)["code"] == "method-not-allowed"
        assert ok(c.get("/healthz"))["ok"] is True


def test_sqlite_held_locked_is_a_503_and_nothing_is_written(tmp_path: Path) -> None:
    """Another process holds the SQLite write lock past the busy timeout: the relay says the
    database is unavailable instead of failing obscurely, and writes nothing."""
    import sqlite3

    db = tmp_path / "relay.db"
    relay = start_relay(f"sqlite://{db}", tmp_path)
    try:
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            with relay.owner() as c:
                e = err(c.post("/api/agents", json={"id": "while/locked"}), 503)
                assert e["code"] == "database-unavailable"
                assert "nothing was changed" in e["reason"]
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        with relay.owner() as c:
            assert ok(c.get("/api/agents"))["agents"] == []
            ok(c.post("/api/agents", json={"id": "while/locked"}), 201)
    finally:
        relay.stop()
