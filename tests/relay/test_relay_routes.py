"""Task routes over the real HTTP API, on both backends: proposed by the receiving agent,
approved and revoked by the owner (audited), handed out with each claimed lease, and a
session-bound route serialising its tasks across A2A contexts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from a2a_kit import CALLER, CAPS, RECEIVER, Server, World, message, running
from melchior.mellan.client.receiver import ReceiverClient
from storekit import db_url_fixture

__all__ = ["db_url_fixture"]


@pytest.fixture(name="relay")
def relay_fixture(db_url: str) -> Iterator[tuple[Server, World]]:
    with running(db_url, receiver=False) as (server, world, _):
        yield server, world


def client(server: Server, world: World, who: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url,
        headers={"authorization": f"Bearer {world.tokens[who]}"},
        timeout=30,
    )


def propose(server: Server, world: World, **body: Any) -> httpx.Response:
    body.setdefault("capability", CAPS[0])
    body.setdefault("adapter", "command")
    with client(server, world, "receiver") as c:
        return c.post("/api/routes", json=body)


def approve(server: Server, world: World, route_id: str) -> dict[str, Any]:
    with client(server, world, "owner") as c:
        r = c.post(f"/api/routes/{route_id}/approve")
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def route_actions(server: Server, world: World) -> list[tuple[str, str, bool]]:
    with client(server, world, "owner") as c:
        records = c.get("/api/audit", params={"limit": 1000}).json()["records"]
    return [
        (r["action"], r["subject"], r["allowed"])
        for r in records
        if r["action"].startswith("route.")
    ]


def test_propose_approve_and_the_claim_carries_the_route(relay: tuple[Server, World]) -> None:
    server, world = relay
    r = propose(
        server, world, adapter="claude-code", session="4f1c-a", cwd="/srv/repo",
        profile="unattended", options={"max_turns": 12345678901234567890},
    )  # fmt: skip
    assert r.status_code == 201, r.text
    assert "12345678901234567890" in r.text  # options are carried verbatim
    route = r.json()
    rid = route["id"]
    assert rid.startswith("rt_")
    assert route["state"] == "pending"
    assert route["agent"] == RECEIVER
    assert route["proposed_by"] == f"agent:{RECEIVER}"

    # pending: the claim hands no route
    with client(server, world, "caller") as c:
        sent = c.post(
            f"{server.base()}/message:send",
            json={"message": message("one"), "configuration": {"returnImmediately": True}},
            headers={"A2A-Version": "1.0"},
        )
    assert sent.status_code == 200, sent.text
    with ReceiverClient(server.url, world.tokens["receiver"]) as rc:
        (lease,) = rc.claim(wait=0)
        assert lease.route is None
        rc.fail(lease.task_id, lease.epoch, "no route is approved", retryable=False)

    done = approve(server, world, rid)
    assert done["outcome"] == "ok"
    assert done["route"]["state"] == "approved"
    assert done["route"]["approved_by"] == "owner:alice"
    assert done["superseded"] == []
    assert approve(server, world, rid)["outcome"] == "duplicate"

    with client(server, world, "caller") as c:
        c.post(
            f"{server.base()}/message:send",
            json={"message": message("two"), "configuration": {"returnImmediately": True}},
            headers={"A2A-Version": "1.0"},
        )
    with httpx.Client(
        base_url=server.url, headers={"authorization": f"Bearer {world.tokens['receiver']}"}
    ) as c:
        raw = c.post("/api/receiver/claim", json={"wait": 0})
    lease_json = raw.json()["leases"][0]
    assert lease_json["route"] == {
        "id": rid,
        "capability": CAPS[0],
        "adapter": "claude-code",
        "session": "4f1c-a",
        "cwd": "/srv/repo",
        "profile": "unattended",
        "options": {"max_turns": 12345678901234567890},
    }
    assert lease_json["task"]["session_key"] == f"route-session:{RECEIVER}:4f1c-a"

    # the agent lists its own routes only; another agent sees none of them
    with client(server, world, "receiver") as c:
        assert [x["id"] for x in c.get("/api/routes").json()["routes"]] == [rid]
        assert c.get(f"/api/routes/{rid}").status_code == 200
    with client(server, world, "other") as c:
        assert c.get("/api/routes").json()["routes"] == []
        assert c.get("/api/routes", params={"agent": RECEIVER}).json()["routes"] == []
        assert c.get(f"/api/routes/{rid}").status_code == 404
    assert route_actions(server, world) == [
        ("route.propose", rid, True),
        ("route.approve", rid, True),
    ]


def test_approving_supersedes_and_revoking_ends(relay: tuple[Server, World]) -> None:
    server, world = relay
    first = propose(server, world).json()["id"]
    second = propose(server, world, adapter="codex", session="s-2").json()["id"]
    approve(server, world, first)
    done = approve(server, world, second)
    assert done["superseded"] == [first]
    with client(server, world, "owner") as c:
        listed = c.get("/api/routes", params={"state": "approved"}).json()["routes"]
        assert [x["id"] for x in listed] == [second]
        old = c.get(f"/api/routes/{first}").json()
        assert old["state"] == "revoked"
        assert old["revoked_by"] == "owner:alice"
        # a revoked route is not approved again
        again = c.post(f"/api/routes/{first}/approve")
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "not-pending"
        gone = c.post(f"/api/routes/{second}/revoke")
        assert gone.json()["outcome"] == "ok"
        assert c.post(f"/api/routes/{second}/revoke").json()["outcome"] == "duplicate"
        missing = c.post("/api/routes/rt_nothing/approve")
        assert missing.status_code == 404
        bad_state = c.get("/api/routes", params={"state": "sideways"})
        assert bad_state.status_code == 400
        assert "sideways" in bad_state.json()["error"]["reason"]
    # agents may not approve or revoke, and that is audited
    with client(server, world, "receiver") as c:
        assert c.post(f"/api/routes/{first}/approve").status_code == 403
        assert c.post(f"/api/routes/{first}/revoke").status_code == 403
    acts = route_actions(server, world)
    assert ("route.revoke", first, True) in acts  # superseded
    assert ("route.revoke", second, True) in acts
    assert ("route.approve", "rt_nothing", False) in acts
    assert ("route.approve", RECEIVER, False) in acts  # the agent's reach for owner power
    assert ("route.revoke", RECEIVER, False) in acts


@pytest.mark.parametrize(
    ("body", "field", "rule"),
    [
        ({"adapter": "shell"}, "adapter", "unknown-adapter"),
        ({"capability": "incident.fix"}, None, None),  # declared: fine
        ({"capability": "not.declared"}, "capability", "unknown-capability"),
        ({"adapter": "provider", "session": "s"}, "session", "fresh-run"),
        ({"session": "has space"}, "session", "bad-session"),
        ({"session": "x" * 300}, None, "bad-request"),
        ({"profile": "../../etc"}, "profile", "bad-profile"),
        ({"cwd": "relative/dir"}, "cwd", "relative-cwd"),
        ({"cwd": "/tmp/a\nb"}, "cwd", "relative-cwd"),
        ({"options": [1, 2]}, "options", "bad-request"),
        ({"options": {"blob": "x" * 20000}}, "options", "options-too-large"),
        ({"capability": 7}, None, "bad-request"),
    ],
)
def test_hostile_proposals_are_refused_naming_the_field(
    relay: tuple[Server, World], body: dict[str, Any], field: str | None, rule: str | None
) -> None:
    server, world = relay
    r = propose(server, world, **body)
    if rule is None:
        assert r.status_code == 201, r.text
        return
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["error"]["rule"] == rule
    if field is not None:
        assert err.get("field") == field or f"'{field}'" in err["error"]["reason"]


def test_lone_surrogates_and_owner_proposals_are_refused(relay: tuple[Server, World]) -> None:
    server, world = relay
    raw = '{"capability":"incident.inspect","adapter":"command","session":"a\\ud800b"}'
    with client(server, world, "receiver") as c:
        r = c.post("/api/routes", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert "surrogate" in r.json()["error"]["reason"]
    with client(server, world, "owner") as c:
        r = c.post("/api/routes", json={"capability": CAPS[0], "adapter": "command"})
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "agent-only"
    with client(server, world, "owner") as c:
        assert c.get("/api/routes").json()["routes"] == []


def test_session_bound_tasks_never_overlap_across_contexts(relay: tuple[Server, World]) -> None:
    """Two tasks in two A2A contexts for a session-bound route: only one is ever leased at
    once (they share the session's key); the second goes once the first finishes. An
    unbound route leaves each context its own key, so they run side by side."""
    server, world = relay
    rid = propose(server, world, adapter="codex", session="sess-9").json()["id"]
    approve(server, world, rid)
    ids = []
    with client(server, world, "caller") as c:
        for ctx in ("ctx-a", "ctx-b"):
            r = c.post(
                f"{server.base()}/message:send",
                json={
                    "message": message(f"in {ctx}", contextId=ctx),
                    "configuration": {"returnImmediately": True},
                },
                headers={"A2A-Version": "1.0"},
            )
            assert r.status_code == 200, r.text
            ids.append(r.json()["task"]["id"])
    with ReceiverClient(server.url, world.tokens["receiver"]) as rc:
        first = rc.claim(limit=10, wait=0)
        assert [x.task_id for x in first] == [ids[0]]
        assert rc.claim(limit=10, wait=0) == []  # the session's second task waits
        assert first[0].route is not None
        assert first[0].route.session == "sess-9"
        rc.complete(ids[0], first[0].epoch, {"message": {"parts": [{"text": "ok"}]}})
        second = rc.claim(limit=10, wait=0)
        assert [x.task_id for x in second] == [ids[1]]
        rc.complete(ids[1], second[0].epoch, {})
    with client(server, world, "owner") as c:
        for tid in ids:
            assert (
                c.get(f"/api/tasks/{tid}").json()["session_key"]
                == "route-session:private/ops:sess-9"
            )
        c.post(f"/api/routes/{rid}/revoke")
    # without a bound session each context keeps its own key: both lease at once
    with client(server, world, "caller") as c:
        for ctx in ("ctx-c", "ctx-d"):
            c.post(
                f"{server.base()}/message:send",
                json={
                    "message": message(f"in {ctx}", contextId=ctx),
                    "configuration": {"returnImmediately": True},
                },
                headers={"A2A-Version": "1.0"},
            )
    with ReceiverClient(server.url, world.tokens["receiver"]) as rc:
        both = rc.claim(limit=10, wait=0)
        assert len(both) == 2
        assert {json.dumps(x.task["session_key"]) for x in both} == {
            '"a2a-context:ctx-c"',
            '"a2a-context:ctx-d"',
        }
    assert CALLER  # the caller of every task above
