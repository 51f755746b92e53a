"""Receivers online: the claim is the heartbeat, stored at most every few seconds per agent,
shown on ``GET /api/agents``; the online rule itself is pure (``policy.presence``)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from a2a_kit import RECEIVER, Server, World, running
from melchior.mellan.client.receiver import ReceiverClient, ReceiverError
from melchior.mellan.relay.caches.presence import Presence
from melchior.policy.presence import MARGIN, MAX_WAIT, receiver_online, window
from storekit import db_url_fixture

__all__ = ["db_url_fixture"]

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def stamp(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def test_online_rule_at_its_edges() -> None:
    assert receiver_online(None, stamp(0), 25).rule == "never-seen"
    limit = 2 * 25 + MARGIN
    assert receiver_online(stamp(0), stamp(limit), 25).allowed
    late = receiver_online(stamp(0), stamp(limit + 0.001), 25)
    assert not late.allowed
    assert late.rule == "silent"
    assert window(None) == window(10_000) == 2 * MAX_WAIT + MARGIN  # unknown or huge: the cap
    assert window(-5) == MARGIN


@given(
    wait=st.one_of(st.none(), st.floats(-10, 1000, allow_nan=False)),
    a=st.floats(0, 10_000, allow_nan=False),
    b=st.floats(0, 10_000, allow_nan=False),
)
def test_online_is_monotonic_in_silence(wait: float | None, a: float, b: float) -> None:
    """Longer silence never turns a receiver online; a sighting in the future is online."""
    quiet, loud = max(a, b), min(a, b)
    if receiver_online(stamp(0), stamp(quiet), wait).allowed:
        assert receiver_online(stamp(0), stamp(loud), wait).allowed
    assert receiver_online(stamp(quiet), stamp(loud), wait).allowed


def test_presence_writes_once_per_interval() -> None:
    p = Presence(every=5.0)
    assert p.due("w", "a", now=100.0)
    assert not p.due("w", "a", now=104.9)
    assert p.due("w", "b", now=104.9)  # per agent
    assert p.due("w", "a", now=105.0)
    p.forget("w", "a")  # a failed write: the next sighting writes
    assert p.due("w", "a", now=105.1)


@pytest.fixture(name="relay")
def relay_fixture(db_url: str) -> Iterator[tuple[Server, World]]:
    with running(db_url, receiver=False) as (server, world, _):
        yield server, world


def agents(server: Server, world: World, who: str = "owner") -> dict[str, dict[str, object]]:
    with httpx.Client(
        base_url=server.url, headers={"authorization": f"Bearer {world.tokens[who]}"}
    ) as c:
        return {a["id"]: a for a in c.get("/api/agents").json()["agents"]}


def test_claims_show_the_receiver_online(relay: tuple[Server, World]) -> None:
    server, world = relay
    before = agents(server, world)[RECEIVER]["receiver"]
    assert before == {
        "online": False,
        "last_seen": None,
        "why": "no receiver has claimed work for this agent yet",
        "info": None,
    }
    info = {"name": "ops-box", "version": "1.2", "adapters": ["command"], "running": 0,
            "concurrency": 4}  # fmt: skip
    server.relay.presence.every = 3600.0  # one write, then remembered
    with ReceiverClient(server.url, world.tokens["receiver"]) as rc:
        assert rc.claim(wait=0, receiver=info) == []
        first = agents(server, world)[RECEIVER]["receiver"]
        assert isinstance(first, dict)
        assert first["online"] is True
        assert first["info"] == {**info, "wait": 0}
        seen = first["last_seen"]
        assert seen
        assert rc.claim(wait=0, receiver={**info, "running": 4}) == []
        assert agents(server, world)[RECEIVER]["receiver"]["last_seen"] == seen  # type: ignore[index]
        server.relay.presence.every = 0.0  # now every sighting is written
        rc.claim(wait=0, receiver={**info, "running": 4})
        after = agents(server, world)[RECEIVER]["receiver"]
        assert isinstance(after, dict)
        assert after["info"]["running"] == 4  # type: ignore[index]
        assert after["last_seen"] >= seen  # type: ignore[operator]
        # hostile receiver info is refused naming the field
        for bad, field in (
            ({"name": "x" * 101}, "receiver.name"),
            ({"adapters": ["a"] * 17}, "receiver.adapters"),
            ({"running": -1}, "receiver.running"),
            ({"running": 1.5}, "receiver.running"),
            ("text", "receiver"),
        ):
            with pytest.raises(ReceiverError) as err:
                rc.claim(wait=0, receiver=bad)  # type: ignore[arg-type]
            assert field in err.value.reason
    with httpx.Client(base_url=server.url) as c:
        r = c.post(
            "/api/receiver/claim",
            content='{"wait":0,"receiver":{"running":1e400}}',
            headers={
                "authorization": f"Bearer {world.tokens['receiver']}",
                "content-type": "application/json",
            },
        )
    assert r.status_code == 400
    assert "receiver.running" in r.json()["error"]["reason"]
    # an agent sees its own presence; the other agent was never seen
    mine = agents(server, world, "receiver")
    assert list(mine) == [RECEIVER]
    assert mine[RECEIVER]["receiver"]["online"] is True  # type: ignore[index]
    assert agents(server, world)["local/codex"]["receiver"]["online"] is False  # type: ignore[index]


def test_a_renewal_counts_as_a_sighting(relay: tuple[Server, World]) -> None:
    """A receiver too busy to claim still renews; that keeps it online."""
    server, world = relay
    from melchior.mellan.relay.store.base import NewTask

    server.store.enqueue(
        NewTask(workspace="acme", caller="local/codex", receiver=RECEIVER,
                capability="incident.inspect", payload="{}")
    )  # fmt: skip
    (lease,) = server.store.claim("acme", RECEIVER, "elsewhere")  # not over HTTP: unseen
    assert agents(server, world)[RECEIVER]["receiver"]["last_seen"] is None  # type: ignore[index]
    with ReceiverClient(server.url, world.tokens["receiver"]) as rc:
        assert rc.renew(lease.task.id, lease.epoch).ok
    after = agents(server, world)[RECEIVER]["receiver"]
    assert isinstance(after, dict)
    assert after["online"] is True
    assert after["last_seen"] is not None
