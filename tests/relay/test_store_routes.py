"""Task routes in the store, on both backends: propose, approve (superseding), revoke, the
claim handing the approved route, receivers' sightings and wake settings."""

from __future__ import annotations

import threading

import pytest

from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.base import (
    NewRoute,
    NotFoundError,
    Record,
    RouteState,
    Store,
)
from storekit import RECEIVER, WS, db_url_fixture, new_task, store_fixture

__all__ = ["db_url_fixture", "store_fixture"]

CAP = "incident.inspect"


def propose(store: Store, **kw: object) -> str:
    fields: dict[str, object] = {
        "workspace": WS,
        "agent": RECEIVER,
        "capability": CAP,
        "adapter": "command",
        "proposed_by": f"agent:{RECEIVER}",
    }
    fields.update(kw)
    rec = Record(f"agent:{RECEIVER}", "route.propose", "self", "proposed")
    return store.propose_route(NewRoute(**fields), record=rec).id  # type: ignore[arg-type]


def actions(store: Store) -> list[tuple[str, str]]:
    return [
        (r.action, r.subject)
        for r in store.audit_since(WS, 0, 1000)
        if r.action.startswith("route.")
    ]


def test_propose_approve_supersede_revoke(store: Store) -> None:
    first = propose(store, session="sess-1", cwd="/srv/repo", profile="safe", options='{"k":1}')
    assert first.startswith("rt_")
    r = store.get_route(WS, first)
    assert r is not None
    assert (r.state, r.session, r.cwd, r.profile, r.options) == (
        RouteState.PENDING,
        "sess-1",
        "/srv/repo",
        "safe",
        '{"k":1}',
    )
    assert store.approved_route(WS, RECEIVER, CAP) is None

    done = store.approve_route(
        WS, first, "owner:o", record=Record("owner:o", "route.approve", "owner", "ok")
    )
    assert done.changed
    assert done.route is not None
    assert done.route.state is RouteState.APPROVED
    assert done.route.approved_by == "owner:o"
    assert done.route.approved_at
    assert store.approved_route(WS, RECEIVER, CAP) == done.route

    second = propose(store, adapter="codex")
    change = store.approve_route(
        WS, second, "owner:o", record=Record("owner:o", "route.approve", "owner", "ok")
    )
    assert change.changed
    assert [x.id for x in change.superseded] == [first]
    old = store.get_route(WS, first)
    assert old is not None
    assert old.state is RouteState.REVOKED
    assert old.revoked_by == "owner:o"
    now = store.approved_route(WS, RECEIVER, CAP)
    assert now is not None
    assert now.id == second

    # a revoked route is never approved again; approving an approved one changes nothing
    assert not store.approve_route(WS, first, "owner:o").changed
    assert not store.approve_route(WS, second, "owner:o").changed
    assert store.approve_route(WS, "rt_nope", "owner:o").route is None

    gone = store.revoke_route(
        WS, second, "owner:o", record=Record("owner:o", "route.revoke", "owner", "x")
    )
    assert gone.changed
    assert gone.route is not None
    assert gone.route.state is RouteState.REVOKED
    assert not store.revoke_route(WS, second, "owner:o").changed
    assert store.approved_route(WS, RECEIVER, CAP) is None

    assert actions(store) == [
        ("route.propose", first),
        ("route.approve", first),
        ("route.propose", second),
        ("route.approve", second),
        ("route.revoke", first),  # superseded, in the approval's transaction
        ("route.revoke", second),
    ]
    listed = store.list_routes(WS)
    assert [x.id for x in listed] == [second, first]  # newest first
    assert store.list_routes(WS, states=[RouteState.PENDING]) == []
    assert len(store.list_routes(WS, agent=RECEIVER, capability=CAP)) == 2
    assert store.list_routes(WS, agent="someone/else") == []


def test_unknown_agent_is_refused(store: Store) -> None:
    with pytest.raises(NotFoundError):
        propose(store, agent="no/such")
    assert store.list_routes(WS) == []


def test_claim_hands_the_approved_route(store: Store) -> None:
    rid = propose(store, session="s")
    store.enqueue(new_task())
    store.enqueue(new_task(capability="other.cap"))
    leases = store.claim(WS, RECEIVER, "r", limit=1)
    assert leases[0].route is None  # pending routes do not apply
    store.approve_route(WS, rid, "owner:o")
    leases = store.claim(WS, RECEIVER, "r", limit=5)
    assert [x.task.capability for x in leases] == ["other.cap"]
    assert leases[0].route is None
    store.enqueue(new_task())
    (lease,) = store.claim(WS, RECEIVER, "r", limit=5)
    assert lease.route is not None
    assert lease.route.id == rid
    assert lease.route.session == "s"


def test_racing_approvals_leave_one_approved(db_url: str, store: Store) -> None:
    """Approvals of several routes for one (agent, capability) from several connections at
    once: exactly one ends approved, every other revoked, whatever the interleaving."""
    ids = [propose(store, options=f'{{"n":{k}}}') for k in range(6)]
    errors: list[BaseException] = []

    def approve(rid: str) -> None:
        s = open_store(db_url, migrate=False)
        try:
            s.approve_route(WS, rid, "owner:o")
        except BaseException as exc:
            errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=approve, args=(rid,)) for rid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    states = [store.get_route(WS, rid).state for rid in ids]  # type: ignore[union-attr]
    assert states.count(RouteState.APPROVED) == 1
    assert states.count(RouteState.REVOKED) == 5


def test_receiver_seen_and_wake(store: Store) -> None:
    agent = store.get_agent(WS, RECEIVER)
    assert agent is not None
    assert agent.receiver_seen_at is None
    assert agent.wake_url is None
    assert store.receiver_seen(WS, RECEIVER, '{"name":"r1"}')
    assert store.receiver_seen(WS, RECEIVER)  # None keeps what it said before
    assert not store.receiver_seen(WS, "no/such")
    agent = store.get_agent(WS, RECEIVER)
    assert agent is not None
    assert agent.receiver_seen_at
    assert agent.receiver_info == '{"name":"r1"}'

    assert store.wake_target(WS, RECEIVER) is None
    got = store.set_wake(WS, RECEIVER, "http://127.0.0.1:9/wake")
    assert got is not None
    url, secret, fresh = got
    assert fresh
    assert url == "http://127.0.0.1:9/wake"
    assert secret
    assert secret.startswith("mws_")
    assert store.wake_target(WS, RECEIVER) == (url, secret, False)
    again = store.set_wake(WS, RECEIVER, "http://127.0.0.1:9/other")
    assert again == ("http://127.0.0.1:9/other", secret, False)  # the secret stays
    assert store.set_wake(WS, RECEIVER, None) == (None, secret, False)
    assert store.wake_target(WS, RECEIVER) is None
    rotated = store.set_wake(WS, RECEIVER, "http://127.0.0.1:9/w", secret="mws_new")
    assert rotated == ("http://127.0.0.1:9/w", "mws_new", True)
    assert store.set_wake(WS, "no/such", "http://x") is None
