"""Who may send to whom through the A2A entry, and what a refused caller learns.

Every refusal happens before anything is stored, answers exactly like "no such agent or
capability" (same status, same body), and leaves an audit record with the precise rule.
Tasks are invisible to anyone but their caller and the workspace owners: Get, List,
Cancel and Subscribe answer for someone else's task exactly as for an unknown id.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from a2a_kit import CALLER, CAPS, OTHER, RECEIVER, WS, Server, World, message, running
from melchior.mellan.relay.auth import Credentials
from melchior.mellan.relay.store.base import AuditRecord, CredentialKind, Principal

NOT_GRANTED = "no such capability is available to you on that agent"


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, World]]:
    db = tmp_path_factory.mktemp("a2a-auth") / "relay.db"
    with running(f"sqlite://{db}") as (server, world, rx):
        assert rx is not None
        yield server, world


def headers(token: str | None) -> dict[str, str]:
    h = {"A2A-Version": "1.0"}
    if token:
        h["Authorization"] = f"Bearer {token}"
    return h


def rpc(url: str, token: str | None, method: str, params: dict[str, Any]) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    return httpx.post(url, json=body, headers=headers(token), timeout=30)


def send(
    server: Server, token: str | None, text: str = "echo hi", *, agent: str = RECEIVER,
    ws: str = WS, capability: str | None = None, binding: str = "rest",
) -> httpx.Response:  # fmt: skip
    params: dict[str, Any] = {
        "message": message(text),
        "configuration": {"returnImmediately": True},
    }
    if capability is not None:
        params["metadata"] = {"capability": capability}
    base = server.base(agent, ws)
    if binding == "rest":
        return httpx.post(f"{base}/message:send", json=params, headers=headers(token), timeout=30)
    return rpc(base, token, "SendMessage", params)


def task_count(server: Server) -> int:
    return len(server.store.list_tasks(WS, limit=10_000)) + len(
        server.store.list_tasks("rival", limit=10_000)
    )


def last_refusal(server: Server, ws: str) -> AuditRecord:
    records = [r for r in server.store.audit_since(ws, 0, 10_000) if not r.allowed]
    assert records, "no refusal was audited"
    return records[-1]


def refused_like_unknown(resp: httpx.Response, unknown: httpx.Response) -> None:
    assert resp.status_code == unknown.status_code == 403
    assert resp.json() == unknown.json()
    assert NOT_GRANTED in resp.text


@pytest.mark.parametrize("binding", ["rest", "jsonrpc"])
def test_refusals_store_nothing_look_unknown_and_are_audited(
    relay: tuple[Server, World], binding: str
) -> None:
    server, world = relay
    tok = world.tokens
    unknown = send(server, tok["caller"], agent="nobody/here", binding=binding)
    cases: dict[str, tuple[Callable[[], httpx.Response], str, str]] = {
        # name: (request, workspace whose audit log records it, rule)
        "no grant": (lambda: send(server, tok["other"], binding=binding), WS, "no-grant"),
        "wrong direction": (
            lambda: send(server, tok["receiver"], agent=CALLER, binding=binding),
            WS,
            "no-grant",
        ),
        "other capability": (
            lambda: send(server, tok["caller"], capability=CAPS[1], binding=binding),
            WS,
            "no-grant",
        ),
        "undeclared capability": (
            lambda: send(server, tok["caller"], capability="nope.nope", binding=binding),
            WS,
            "unknown-capability",
        ),
        "unknown agent": (
            lambda: send(server, tok["caller"], agent="nobody/there", binding=binding),
            WS,
            "unknown-agent",
        ),
        "other workspace": (
            lambda: send(server, tok["rival"], binding=binding),
            "rival",
            "other-workspace",
        ),
    }
    before = task_count(server)
    for name, (request, ws, rule) in cases.items():
        refused_like_unknown(request(), unknown)
        record = last_refusal(server, ws)
        assert (record.rule, record.action) == (rule, "task.refuse"), name
        assert record.allowed is False
    # the target workspace's owners see the cross-workspace knock too
    assert last_refusal(server, WS).rule == "other-workspace"
    assert task_count(server) == before


def test_revoked_grant_is_refused_at_once_and_audited(tmp_path: Any) -> None:
    """Revoked through the control API of the replica the caller uses: the door had just
    remembered the grant (the first send) and forgets it with the revocation."""
    with running(f"sqlite://{tmp_path / 'r.db'}", receiver=False) as (server, world, _):
        assert send(server, world.tokens["caller"]).status_code == 200
        resp = httpx.delete(
            f"{server.url}/api/grants/{world.grant_ids['caller']}",
            headers=headers(world.tokens["owner"]),
        )
        assert resp.json()["revoked"] is True, resp.text
        before = task_count(server)
        unknown = send(server, world.tokens["caller"], agent="no/body")
        resp = send(server, world.tokens["caller"])
        assert last_refusal(server, WS).rule == "no-grant"
        refused_like_unknown(resp, unknown)
        assert task_count(server) == before


def test_missing_and_revoked_credentials_are_401_and_audited(tmp_path: Any) -> None:
    with running(f"sqlite://{tmp_path / 'r.db'}", receiver=False) as (server, world, _):
        resp = send(server, None)
        assert resp.status_code == 401
        assert resp.headers["www-authenticate"] == "Bearer"
        assert resp.json()["error"]["status"] == "UNAUTHENTICATED"
        server.store.revoke_credential(WS, world.credential_ids["caller"])
        for binding in ("rest", "jsonrpc"):
            resp = send(server, world.tokens["caller"], binding=binding)
            assert resp.status_code == 401
        record = last_refusal(server, WS)
        assert (record.action, record.rule) == ("a2a.authenticate", "credential")
        assert task_count(server) == 0
        # a made-up agent name gets the same answer but no audit record
        n = len(server.store.audit_since(WS, 0, 10_000))
        assert send(server, "mln_made_up", agent="made/up").status_code == 401
        assert len(server.store.audit_since(WS, 0, 10_000)) == n


@pytest.mark.parametrize(("what", "status", "rule"), [
    ("credential", 401, "credential"), ("grant", 403, "no-grant"),
])  # fmt: skip
def test_a_revocation_elsewhere_is_refused_within_the_ttl(
    tmp_path: Any, what: str, status: int, rule: str
) -> None:
    """Revoked through the store, as another replica would: this relay remembered the
    credential and the grant as live (both just used) and keeps them for at most the
    memo's 2 s (docs/mellan.md)."""
    with running(f"sqlite://{tmp_path / 'r.db'}", receiver=False) as (server, world, _):
        token = world.tokens["caller"]
        assert send(server, token).status_code == 200
        if what == "credential":
            server.store.revoke_credential(WS, world.credential_ids["caller"])
        else:
            server.store.revoke_grant(WS, world.grant_ids["caller"])
        deadline = time.monotonic() + 30  # a liveness bound, far above the 2 s ttl
        while send(server, token).status_code == 200:
            assert time.monotonic() < deadline, f"a revoked {what} stayed usable"
            time.sleep(0.2)
        assert send(server, token).status_code == status
        assert last_refusal(server, WS).rule == rule


def test_credentials_cache_remembers_only_live_ones_and_only_for_ttl() -> None:
    now = [0.0]
    cache = Credentials(ttl=2.0, size=2, clock=lambda: now[0])
    p = Principal(WS, CredentialKind.AGENT, CALLER, "c1")
    assert cache.get("h1") is None
    cache.put("h1", p)
    assert cache.get("h1") == p
    now[0] = 1.99
    assert cache.get("h1") == p
    now[0] = 2.0
    assert cache.get("h1") is None  # expired: the next request reads the store again
    cache.put("h1", p)
    cache.put("h2", p)
    cache.put("h3", p)  # over size: the table starts again rather than grow
    assert cache.get("h1") is None
    assert cache.get("h3") == p
    cache.forget()
    assert cache.get("h3") is None


def test_owner_credentials_cannot_send_as_an_agent(relay: tuple[Server, World]) -> None:
    server, world = relay
    resp = send(server, world.tokens["owner"])
    assert resp.status_code == 403
    assert "agent's credential" in resp.text


def test_hop_limit_refuses_the_fifth_hop_and_audits_it(relay: tuple[Server, World]) -> None:
    server, world = relay
    uri = "https://melchior.dev/ext/hops/v1"
    base = f"{server.base()}/message:send"
    for hop, ok in ((4, True), (5, False)):
        m = message("echo hop")
        m["metadata"] = {uri: {"chain": "c1", "hop": hop, "path": ["x", "y", "z", "w"][: hop - 1]}}
        params = {"message": m, "configuration": {"returnImmediately": True}}
        resp = httpx.post(base, json=params, headers=headers(world.tokens["caller"]), timeout=30)
        if ok:
            assert resp.status_code == 200
            meta = resp.json()["task"]["metadata"][uri]
            assert meta == {"chain": "c1", "hop": 4, "path": ["x", "y", "z", CALLER]}
        else:
            assert resp.status_code == 400
            detail = resp.json()["error"]
            assert detail["details"][0]["reason"] == "HOP_LIMIT"
            assert detail["details"][0]["metadata"] == {"chain": "c1", "hop": "5"}
            assert "hop 5" in detail["message"]
            assert last_refusal(server, WS).rule == "hop-limit"


def test_tasks_are_invisible_to_everyone_but_caller_and_owner(relay: tuple[Server, World]) -> None:
    server, world = relay
    tok = world.tokens
    created = send(server, tok["caller"], "hold")
    assert created.status_code == 200
    tid = created.json()["task"]["id"]
    base = server.base()
    missing = "no-such-" + secrets.token_hex(4)

    def probe(token: str, task_id: str, at: str = base) -> list[tuple[int, Any]]:
        h = headers(token)
        out = []
        for method, path in (
            ("GET", f"/tasks/{task_id}"),
            ("POST", f"/tasks/{task_id}:cancel"),
            ("POST", f"/tasks/{task_id}:subscribe"),
            ("GET", f"/tasks/{task_id}:subscribe"),
        ):
            r = httpx.request(method, at + path, headers=h, timeout=30)
            body = r.json()
            body["error"]["details"][0].pop("metadata", None)
            out.append((r.status_code, body))
        for method in ("GetTask", "CancelTask", "SubscribeToTask"):
            r = rpc(at, token, method, {"id": task_id})
            body = r.json()
            body["error"]["data"][0].pop("metadata", None)
            out.append((r.status_code, body))
        return out

    for who, at in (("other", base), ("rival", base), ("caller", server.base(OTHER))):
        assert probe(tok[who], tid, at) == probe(tok[who], missing, at), who
    for who in ("other", "rival"):
        listed = httpx.get(f"{base}/tasks", headers=headers(tok[who]), timeout=30).json()
        assert listed == {"tasks": [], "nextPageToken": "", "pageSize": 50, "totalSize": 0}
        bad_token = httpx.get(
            f"{base}/tasks", params={"pageToken": tid}, headers=headers(tok[who]), timeout=30
        )
        unknown_token = httpx.get(
            f"{base}/tasks", params={"pageToken": missing}, headers=headers(tok[who]), timeout=30
        )
        assert bad_token.status_code == unknown_token.status_code
        assert bad_token.json() == unknown_token.json()
    owner = httpx.get(f"{base}/tasks/{tid}", headers=headers(tok["owner"]), timeout=30)
    assert owner.status_code == 200
    owned = httpx.get(f"{base}/tasks", headers=headers(tok["owner"]), timeout=30).json()
    assert tid in {t["id"] for t in owned["tasks"]}
    cancel = httpx.post(f"{base}/tasks/{tid}:cancel", headers=headers(tok["caller"]), timeout=30)
    assert cancel.json()["status"]["state"] == "TASK_STATE_CANCELED"


def test_several_grants_need_a_named_capability(tmp_path: Any) -> None:
    with running(f"sqlite://{tmp_path / 'r.db'}", receiver=False) as (server, world, _):
        server.store.add_grant(WS, CALLER, RECEIVER, [CAPS[1]])
        resp = send(server, world.tokens["caller"])
        assert resp.status_code == 400
        assert "name one in metadata.capability" in resp.json()["error"]["message"]
        assert last_refusal(server, WS).rule == "ambiguous"
        ok = send(server, world.tokens["caller"], capability=CAPS[1])
        assert ok.json()["task"]["metadata"]["capability"] == CAPS[1]
