"""Send limits through real HTTP, on SQLite and PostgreSQL: an owner sets them with the
control API, a send over one is refused 429 with ``Retry-After`` on both A2A bindings
(``QUOTA_EXCEEDED`` naming the limit), audited ``quota.refused`` with the request's id,
and nothing is stored; two replicas sending at once at a cap let exactly one through."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from a2a_kit import CALLER, CAPS, RECEIVER, WS, Server, World, message, running, seed
from melchior.mellan.relay.store.base import AuditFilter
from storekit import db_url_fixture  # noqa: F401

H = {"A2A-Version": "1.0", "Content-Type": "application/json"}


def send_rest(server: Server, world: World, **headers: str) -> httpx.Response:
    body = {
        "message": message("hello", metadata={"capability": CAPS[0]}),
        "configuration": {"returnImmediately": True},
    }
    auth = {"Authorization": f"Bearer {world.tokens['caller']}"}
    return httpx.post(
        f"{server.base()}/message:send", json=body, headers={**H, **auth, **headers}, timeout=30
    )


def send_rpc(server: Server, world: World) -> httpx.Response:
    params = {
        "message": message("hello", metadata={"capability": CAPS[0]}),
        "configuration": {"returnImmediately": True},
    }
    body = {"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": params}
    auth = {"Authorization": f"Bearer {world.tokens['caller']}"}
    return httpx.post(server.base(), json=body, headers={**H, **auth}, timeout=30)


def set_limits(server: Server, world: World, agent: str, **values: Any) -> dict[str, Any]:
    r = httpx.put(
        f"{server.url}/api/limits/{agent}",
        json=values,
        headers={"Authorization": f"Bearer {world.tokens['owner']}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def info(body: dict[str, Any]) -> dict[str, Any]:
    details = body["error"]["details"] if "details" in body["error"] else body["error"]["data"]
    found: dict[str, Any] = details[0]
    return found


def tasks(server: Server) -> int:
    return len(server.store.list_tasks(WS, limit=500))


def test_send_rate_refused_on_both_bindings(db_url: str) -> None:
    with running(db_url, receiver=False) as (server, world, _):
        view = set_limits(server, world, CALLER, send_rate=0.001, burst=2)
        assert view["effective"]["burst"] == 2
        assert view["stored"]["send_rate"] == 0.001
        assert send_rest(server, world).status_code == 200
        assert send_rpc(server, world).json()["result"]
        r = send_rest(server, world, **{"X-Request-Id": "rate-test-1"})
        assert r.status_code == 429
        assert int(r.headers["Retry-After"]) >= 1
        assert r.headers["X-Request-Id"] == "rate-test-1"
        err = r.json()["error"]
        assert err["status"] == "RESOURCE_EXHAUSTED"
        assert info(r.json())["reason"] == "QUOTA_EXCEEDED"
        assert info(r.json())["metadata"]["limit"] == "send-rate"
        r = send_rpc(server, world)
        assert r.status_code == 429
        assert "Retry-After" in r.headers
        assert r.json()["id"] == 7
        assert info(r.json())["metadata"]["limit"] == "send-rate"
        assert tasks(server) == 2  # nothing stored for the refusals
        refused = server.store.audit_matching(WS, AuditFilter(action="quota.refused"))
        assert [(a.rule, a.allowed) for a in refused] == [("send-rate", False)] * 2
        assert "rate-test-1" in {a.request_id for a in refused}


def test_caps_refused_and_audited(db_url: str) -> None:
    with running(db_url, receiver=False) as (server, world, _):
        set_limits(server, world, CALLER, max_unfinished_per_receiver=2)
        for _ in range(2):
            assert send_rest(server, world).status_code == 200
        r = send_rest(server, world)
        assert r.status_code == 429
        assert r.headers["Retry-After"] == "5"
        assert info(r.json())["metadata"]["limit"] == "max-unfinished-per-receiver"
        assert "2 unfinished task(s) at private/ops" in r.json()["error"]["message"]
        assert tasks(server) == 2
        # the receiver's queue: lift the caller's cap, cap the receiver's queue at 3
        set_limits(server, world, CALLER, reset=True)
        set_limits(server, world, RECEIVER, max_queued=3)
        assert send_rest(server, world).status_code == 200
        r = send_rest(server, world)
        assert r.status_code == 429
        assert info(r.json())["metadata"]["limit"] == "max-queued"
        assert tasks(server) == 3
        refused = server.store.audit_matching(WS, AuditFilter(action="quota.refused"))
        rules = sorted(a.rule for a in refused)
        assert rules == ["max-queued", "max-unfinished-per-receiver"]
        assert all(a.request_id for a in refused)
        # the workspace default applies to every agent without its own value
        view = set_limits(server, world, "*", max_queued=50)
        assert view["effective"]["max_queued"] == 50
        r = httpx.get(
            f"{server.url}/api/limits/{RECEIVER}",
            headers={"Authorization": f"Bearer {world.tokens['owner']}"},
        )
        assert r.json()["effective"]["max_queued"] == 3  # its own value wins


def test_limits_are_owner_business(db_url: str) -> None:
    with running(db_url, receiver=False) as (server, world, _):
        agent = {"Authorization": f"Bearer {world.tokens['caller']}"}
        r = httpx.put(f"{server.url}/api/limits/{CALLER}", json={"burst": 9}, headers=agent)
        assert r.status_code == 403
        r = httpx.get(f"{server.url}/api/limits/{CALLER}", headers=agent)
        assert r.status_code == 200  # an agent may read its own
        r = httpx.get(f"{server.url}/api/limits/{RECEIVER}", headers=agent)
        assert r.status_code == 404
        owner = {"Authorization": f"Bearer {world.tokens['owner']}"}
        r = httpx.put(f"{server.url}/api/limits/{CALLER}", json={"burst": 0}, headers=owner)
        assert r.status_code == 400
        assert "burst" in r.json()["error"]["reason"]
        r = httpx.put(f"{server.url}/api/limits/{CALLER}", json={"speed": 1}, headers=owner)
        assert r.status_code == 400
        assert "'speed'" in r.json()["error"]["reason"]
        r = httpx.put(f"{server.url}/api/limits/nobody/here", json={"burst": 1}, headers=owner)
        assert r.status_code == 404


def _send_at_once(
    server: Server, world: World, barrier: threading.Barrier, codes: list[int]
) -> None:
    barrier.wait()
    codes.append(send_rest(server, world).status_code)


def test_two_replicas_at_the_cap_one_refused(db_url: str) -> None:
    """Two replicas (two stores, two batchers) on one database, one place left under the
    cap, two sends at once, several rounds: exactly one is stored each round."""
    a = Server(db_url)
    b = Server(db_url)
    try:
        world = seed(a.store)
        for round_ in range(1, 5):
            set_limits(a, world, CALLER, max_unfinished_per_receiver=round_)
            a.relay.limits.forget(WS)
            b.relay.limits.forget(WS)
            barrier = threading.Barrier(2)
            codes: list[int] = []
            threads = [
                threading.Thread(target=_send_at_once, args=(s, world, barrier, codes))
                for s in (a, b)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(codes) == [200, 429]
            assert tasks(a) == round_
    finally:
        b.stop()
        a.stop()


@pytest.mark.parametrize("limit", ["max-unfinished-per-receiver"])
def test_cli_limits(db_url: str, limit: str, tmp_path: Any) -> None:
    """``mellan agent limits`` shows and changes them (the owner's door)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    mellan = str(Path(sys.executable).parent / "mellan")
    with running(db_url, receiver=False) as (server, world, _):
        env = {
            **os.environ,
            "MELLAN_RELAY": server.url,
            "MELLAN_TOKEN": world.tokens["owner"],
            "XDG_CONFIG_HOME": str(tmp_path),
        }
        args = [mellan, "agent", "limits", CALLER, "--send-rate", "5/s", "--burst", "10"]
        out = subprocess.run([*args, "--json"], env=env, capture_output=True, text=True, check=True)
        data = json.loads(out.stdout)
        assert data["effective"]["send_rate"] == 5.0
        assert data["stored"]["burst"] == 10
        out = subprocess.run(
            [mellan, "agent", "limits", CALLER], env=env, capture_output=True, text=True, check=True
        )
        assert "send_rate" in out.stdout
        assert "5/s" in out.stdout
        assert limit.replace("-", "_") in out.stdout
        bad = subprocess.run(
            [mellan, "agent", "limits", CALLER, "--send-rate", "fast"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert bad.returncode == 2
        assert "rate like 5/s" in bad.stderr


def test_resend_over_the_rate_gets_its_stored_task(db_url: str) -> None:
    """A resend queues nothing, so the rate does not apply to it (as the caps do not): the
    caller over its rate still gets the task its first send stored; a new message is
    refused."""
    with running(db_url, receiver=False) as (server, world, _):
        set_limits(server, world, CALLER, send_rate=0.001, burst=1)
        body = {
            "message": message("hello", metadata={"capability": CAPS[0]}),
            "configuration": {"returnImmediately": True},
        }
        auth = {"Authorization": f"Bearer {world.tokens['caller']}"}
        first = httpx.post(f"{server.base()}/message:send", json=body, headers={**H, **auth})
        assert first.status_code == 200, first.text
        assert send_rest(server, world).status_code == 429  # the rate is spent
        again = httpx.post(f"{server.base()}/message:send", json=body, headers={**H, **auth})
        assert again.status_code == 200, again.text
        assert again.json()["task"]["id"] == first.json()["task"]["id"]
        assert tasks(server) == 1
