"""Wake-ups, relay side, on both backends: the owner sets an agent's wake URL (checked,
audited, secret shown once), and a queued task makes the relay POST a small signed JSON
to a real loopback webhook — no task content, coalesced, never in the send's way, and
refused after DNS when the workspace stops allowing private addresses."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from a2a_kit import RECEIVER, WS, Server, World, message, running
from melchior.mellan.relay.workers.wake import Waker
from melchior.mellan.signing import verify
from storekit import db_url_fixture
from webhook_kit import Behaviour, Hook

__all__ = ["db_url_fixture"]


@pytest.fixture(name="relay")
def relay_fixture(db_url: str) -> Iterator[tuple[Server, World]]:
    with running(db_url, receiver=False) as (server, world, _):
        yield server, world


@pytest.fixture(name="hook")
def hook_fixture() -> Iterator[Hook]:
    h = Hook()
    try:
        yield h
    finally:
        h.close()


def owner(server: Server, world: World) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"authorization": f"Bearer {world.tokens['owner']}"}
    )


def send(server: Server, world: World, text: str = "secret task text") -> httpx.Response:
    with httpx.Client(headers={"authorization": f"Bearer {world.tokens['caller']}"}) as c:
        r = c.post(
            f"{server.base()}/message:send",
            json={"message": message(text), "configuration": {"returnImmediately": True}},
            headers={"A2A-Version": "1.0"},
            timeout=30,
        )
    assert r.status_code == 200, r.text
    return r


def until(check: Callable[[], bool]) -> None:
    """Poll ``check``; the bound is a hang guard, not a threshold."""
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.02)


def waker(server: Server) -> Waker:
    w = server.relay.waker
    assert w is not None
    return w


def idle(w: Waker) -> bool:
    return not getattr(w, "_pending") and not getattr(w, "_inflight")  # noqa: B009


def test_configure_wake_checked_audited_secret_once(
    relay: tuple[Server, World], hook: Hook
) -> None:
    server, world = relay
    with owner(server, world) as c:
        refused = c.put("/api/wake", json={"agent": RECEIVER, "url": hook.url})
        assert refused.status_code == 400  # loopback, and the workspace allows no private hosts
        assert refused.json()["field"] == "url"
        assert refused.json()["error"]["rule"] != "bad-request"
        assert c.put("/api/push/settings", json={"allow_private": True}).status_code == 200
        first = c.put("/api/wake", json={"agent": RECEIVER, "url": hook.url}).json()
        assert first["url"] == hook.url
        secret = first["secret"]
        assert secret.startswith("mws_")
        again = c.put("/api/wake", json={"agent": RECEIVER, "url": hook.url}).json()
        assert "secret" not in again  # shown once
        assert c.get("/api/wake", params={"agent": RECEIVER}).json() == {
            "agent": RECEIVER,
            "url": hook.url,
        }
        shown = c.get("/api/wake", params={"agent": RECEIVER, "show_secret": "true"}).json()
        assert shown["secret"] == secret
        rotated = c.put("/api/wake", json={"agent": RECEIVER, "url": hook.url, "rotate": True})
        assert rotated.json()["secret"] not in (None, secret)
        agents = {a["id"]: a for a in c.get("/api/agents").json()["agents"]}
        assert agents[RECEIVER]["wake"] is True
        assert agents["local/codex"]["wake"] is False
        off = c.put("/api/wake", json={"agent": RECEIVER, "url": None}).json()
        assert off["url"] is None
        assert c.put("/api/wake", json={"agent": "no/such", "url": None}).status_code == 404
        records = c.get("/api/audit", params={"limit": 1000}).json()["records"]
    wakes = [r for r in records if r["action"] == "agent.wake"]
    assert [r["allowed"] for r in wakes] == [True, True, True, True]
    with httpx.Client(
        base_url=server.url, headers={"authorization": f"Bearer {world.tokens['receiver']}"}
    ) as c:
        assert c.put("/api/wake", json={"agent": RECEIVER, "url": None}).status_code == 403
        assert c.get("/api/wake", params={"agent": RECEIVER}).status_code == 403


def test_queued_work_wakes_the_receiver_signed_coalesced(
    relay: tuple[Server, World], hook: Hook
) -> None:
    server, world = relay
    with owner(server, world) as c:
        c.put("/api/push/settings", json={"allow_private": True})
        secret = c.put("/api/wake", json={"agent": RECEIVER, "url": hook.url}).json()["secret"]
    w = waker(server)
    send(server, world)
    (seen,) = hook.wait_for(lambda got: len(got) == 1)
    until(lambda: idle(w))
    assert verify(secret, seen.headers, seen.body, time.time()).allowed
    body: dict[str, Any] = seen.json
    assert sorted(body) == ["agent", "queued_at", "workspace"]
    assert (body["agent"], body["workspace"]) == (RECEIVER, WS)
    assert b"secret task text" not in seen.body  # no task content leaves

    # many sends while a wake-up may not go yet fold into one more
    w.gap = 3600.0
    for k in range(20):
        send(server, world, f"more {k}")
    assert hook.received == 1
    assert len(getattr(w, "_pending")) == 1  # noqa: B009
    # the waker has seen the last of those pokes (and holds the one wake-up back) before
    # the gap is lifted: else it could send that one now and the next send's apart
    until(lambda: not getattr(w, "_wake").is_set())  # noqa: B009
    w.gap = 0.0
    send(server, world, "last")
    hook.wait_for(lambda got: len(got) == 2)
    until(lambda: idle(w))
    assert hook.received == 2
    assert w.sent == 2


def test_a_stuck_webhook_never_holds_a_send(relay: tuple[Server, World]) -> None:
    server, world = relay
    held = Behaviour(hold=threading.Event())
    hook = Hook(behaviour=held)
    try:
        with owner(server, world) as c:
            c.put("/api/push/settings", json={"allow_private": True})
            c.put("/api/wake", json={"agent": RECEIVER, "url": hook.url})
        send(server, world)
        until(lambda: hook.active == 1)  # the wake-up is stuck in the webhook …
        send(server, world)  # … and sends are still answered
        assert hook.active == 1  # one in flight per agent, the second waits behind it
        assert held.hold is not None
        held.hold.set()
        hook.wait_for(lambda got: len(got) == 2)
    finally:
        hook.close()


def test_private_addresses_are_refused_at_delivery(relay: tuple[Server, World], hook: Hook) -> None:
    server, world = relay
    with owner(server, world) as c:
        c.put("/api/push/settings", json={"allow_private": True})
        c.put("/api/wake", json={"agent": RECEIVER, "url": hook.url})
        c.put("/api/push/settings", json={"allow_private": False})
    w = waker(server)
    send(server, world)
    until(lambda: w.failed == 1 and idle(w))
    assert hook.received == 0
    assert w.sent == 0
