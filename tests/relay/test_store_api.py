"""Every Store method on both backends: control plane, tasks, events, audit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from melchior.mellan.relay.notify import receiver_topic, task_stop_topic, task_topic
from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.base import (
    Capability,
    Conflict,
    CredentialKind,
    NotFoundError,
    Outcome,
    Store,
    TaskState,
)
from storekit import CALLER, RECEIVER, WS, db_url_fixture, new_task, store_fixture  # noqa: F401


def _iso(delta_s: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=delta_s)).isoformat()


def test_migrate_is_idempotent_and_reports_version(store: Store) -> None:
    v = store.migrate()
    assert v >= 1
    assert store.migrate() == v


def test_now_is_iso_utc(store: Store) -> None:
    now = store.now()
    assert now.endswith("Z")
    parsed = datetime.fromisoformat(now)
    assert abs((parsed - datetime.now(UTC)).total_seconds()) < 3600


def test_workspace_created_once(store: Store) -> None:
    assert store.ensure_workspace("other") is True
    assert store.ensure_workspace("other") is False
    assert store.ensure_workspace(WS) is False


def test_credentials_lookup_revoke_expire(store: Store) -> None:
    cid = store.add_credential(WS, CredentialKind.OWNER, "alice", "h-owner")
    p = store.principal_for("h-owner")
    assert p is not None
    assert (p.workspace, p.kind, p.subject, p.credential_id) == (
        WS,
        CredentialKind.OWNER,
        "alice",
        cid,
    )
    assert store.principal_for("h-unknown") is None
    # revocation is scoped to the workspace: another workspace cannot revoke it
    store.ensure_workspace("other")
    assert store.revoke_credential("other", cid) is False
    assert store.revoke_credential(WS, cid) is True
    assert store.revoke_credential(WS, cid) is False
    assert store.principal_for("h-owner") is None
    store.add_credential(WS, CredentialKind.AGENT, RECEIVER, "h-expired", _iso(-60))
    assert store.principal_for("h-expired") is None
    store.add_credential(WS, CredentialKind.AGENT, RECEIVER, "h-live", _iso(3600))
    live = store.principal_for("h-live")
    assert live is not None
    assert live.kind is CredentialKind.AGENT
    assert live.subject == RECEIVER


def test_credential_for_unknown_workspace_refused(store: Store) -> None:
    with pytest.raises(NotFoundError):
        store.add_credential("nope", CredentialKind.OWNER, "x", "h")
    store.add_credential(WS, CredentialKind.OWNER, "a", "same")
    with pytest.raises(Conflict):
        store.add_credential(WS, CredentialKind.OWNER, "b", "same")


def test_agents(store: Store) -> None:
    caps = [Capability("a.b", "does a.b"), Capability("c.d")]
    a = store.add_agent(WS, "local/codex", "codex here", caps)
    assert a.capabilities == tuple(caps)
    assert a.created_at.endswith("Z")
    assert store.get_agent(WS, "local/codex") == a
    assert store.get_agent("other", "local/codex") is None
    assert [x.id for x in store.list_agents(WS)] == sorted([CALLER, RECEIVER, "local/codex"])
    with pytest.raises(Conflict):
        store.add_agent(WS, "local/codex", "again", [])
    with pytest.raises(NotFoundError):
        store.add_agent("nope", "x", "", [])


def test_enrollment_one_use_and_expiry(store: Store) -> None:
    store.add_enrollment(WS, RECEIVER, "code1", _iso(600))
    assert store.redeem_enrollment("code1") == (WS, RECEIVER)
    assert store.redeem_enrollment("code1") is None  # reused code
    store.add_enrollment(WS, RECEIVER, "code2", _iso(-1))
    assert store.redeem_enrollment("code2") is None  # expired code
    assert store.redeem_enrollment("never-issued") is None
    with pytest.raises(NotFoundError):
        store.add_enrollment(WS, "ghost", "code3", _iso(600))


def test_grants_are_directional_and_revocable(store: Store) -> None:
    g = store.add_grant(WS, CALLER, RECEIVER, ["incident.inspect", "incident.inspect", "x.y"])
    assert g.capabilities == ("incident.inspect", "x.y")
    assert g.revoked_at is None
    assert store.granted_capabilities(WS, CALLER, RECEIVER) == {"incident.inspect", "x.y"}
    assert store.granted_capabilities(WS, RECEIVER, CALLER) == set()  # reverse not implied
    assert store.granted_capabilities("other", CALLER, RECEIVER) == set()
    g2 = store.add_grant(WS, CALLER, RECEIVER, ["z.z"])
    assert store.granted_capabilities(WS, CALLER, RECEIVER) == {"incident.inspect", "x.y", "z.z"}
    assert {x.id for x in store.list_grants(WS)} == {g.id, g2.id}
    assert [x.id for x in store.list_grants(WS, caller=RECEIVER)] == []
    assert {x.id for x in store.list_grants(WS, receiver=RECEIVER)} == {g.id, g2.id}
    assert store.revoke_grant("other", g.id) is False
    assert store.revoke_grant(WS, g.id) is True
    assert store.revoke_grant(WS, g.id) is False
    assert store.granted_capabilities(WS, CALLER, RECEIVER) == {"z.z"}
    assert [x.id for x in store.list_grants(WS)] == [g2.id]
    revoked = [x for x in store.list_grants(WS, include_revoked=True) if x.id == g.id]
    assert revoked
    assert revoked[0].revoked_at is not None


def test_grant_for_unknown_agent_refused(store: Store) -> None:
    with pytest.raises(NotFoundError):
        store.add_grant(WS, CALLER, "ghost/agent", ["incident.inspect"])
    with pytest.raises(NotFoundError):
        store.add_grant(WS, "ghost/agent", RECEIVER, ["incident.inspect"])
    store.ensure_workspace("other")
    with pytest.raises(NotFoundError):  # an agent of another workspace is unknown here
        store.add_grant("other", CALLER, RECEIVER, ["incident.inspect"])
    assert store.list_grants(WS, include_revoked=True) == []


def test_audit_append_and_read(store: Store) -> None:
    s1 = store.audit(WS, "owner:alice", "grant.add", "g1", True, "grant", "ok", {"n": 1})
    s2 = store.audit(WS, "agent:x", "task.refuse", "t1", False, "grant", "no grant")
    store.audit("other", "relay", "x", "y", True, "r", "elsewhere")
    recs = store.audit_since(WS)
    assert [r.seq for r in recs] == [s1, s2]
    assert s1 < s2
    assert recs[0].detail == {"n": 1}
    assert recs[0].allowed is True
    assert recs[0].at.endswith("Z")
    assert recs[1].allowed is False
    assert recs[1].detail == {}
    assert recs[1].reason == "no grant"
    assert [r.seq for r in store.audit_since(WS, after_seq=s1)] == [s2]
    assert len(store.audit_since(WS, limit=1)) == 1


def test_enqueue_keeps_payload_bytes_and_dedupes(store: Store) -> None:
    payload = '{"n": 12345678901234567890,  "f": 1.10, "s": "\\u00e9"}'
    t, created = store.enqueue(new_task(payload=payload, metadata='{"k":  1}', message_id="m1"))
    assert created
    assert t.state is TaskState.QUEUED
    assert t.attempt == 0
    assert t.lease_epoch == 0
    assert t.payload == payload
    assert t.metadata == '{"k":  1}'
    assert t.context_id
    again, created2 = store.enqueue(new_task(payload="{}", message_id="m1"))
    assert not created2
    assert again.id == t.id
    assert again.payload == payload
    # the dedupe key is per caller: another caller's m1 is a different task
    other, created3 = store.enqueue(new_task(caller=RECEIVER, receiver=CALLER, message_id="m1"))
    assert created3
    assert other.id != t.id
    got = store.get_task(WS, t.id)
    assert got is not None
    assert got.payload == payload
    assert store.get_task("other", t.id) is None  # nothing crosses workspaces


def test_enqueue_carries_envelope(store: Store) -> None:
    t, _ = store.enqueue(
        new_task(chain="c-1", hop=3, path=("a", "b"), context_id="ctx", session_key="s")
    )
    got = store.get_task(WS, t.id)
    assert got is not None
    assert (got.chain, got.hop, got.path, got.context_id, got.session_key) == (
        "c-1",
        3,
        ("a", "b"),
        "ctx",
        "s",
    )


def test_list_tasks_filters_and_pages(store: Store) -> None:
    ids = [store.enqueue(new_task(context_id="ctx" if i % 2 else None))[0].id for i in range(5)]
    listed = store.list_tasks(WS)
    assert [t.id for t in listed] == ids[::-1]  # newest first
    page1 = store.list_tasks(WS, limit=2)
    page2 = store.list_tasks(WS, limit=2, after=page1[-1].id)
    assert [t.id for t in page1 + page2] == ids[::-1][:4]
    assert {t.id for t in store.list_tasks(WS, context_id="ctx")} == {ids[1], ids[3]}
    assert store.list_tasks(WS, caller=RECEIVER) == []
    assert len(store.list_tasks(WS, receiver=RECEIVER)) == 5
    store.claim(WS, RECEIVER, "r1")
    leased = store.list_tasks(WS, states=[TaskState.LEASED])
    assert [t.id for t in leased] == [ids[0]]
    assert len(store.list_tasks(WS, states=[TaskState.QUEUED, TaskState.LEASED])) == 5
    assert store.list_tasks(WS, states=[]) == []
    assert store.list_tasks("other") == []


def test_events_in_order_and_progress_fenced(store: Store) -> None:
    t, _ = store.enqueue(new_task())
    e1 = store.append_event(t.id, "status", '{"state": "submitted"}')
    [lease] = store.claim(WS, RECEIVER, "r1")
    assert store.progress(t.id, lease.epoch, "artifact", '{"x": 1.0}').outcome is Outcome.OK
    assert store.progress(t.id, lease.epoch + 1, "artifact", "{}").outcome is Outcome.LEASE_LOST
    assert store.progress("nope", 1, "artifact", "{}").outcome is Outcome.NOT_FOUND
    evs = store.events_after(t.id)
    assert [e.kind for e in evs] == ["status", "artifact"]
    assert evs[1].body == '{"x": 1.0}'
    assert [e.seq for e in store.events_after(t.id, e1.seq)] == [evs[1].seq]
    with pytest.raises(NotFoundError):
        store.append_event("nope", "status", "{}")


def test_publisher_gets_topics_after_commit(store: Store) -> None:
    seen: list[str] = []
    store.set_publisher(seen.append)
    t, _ = store.enqueue(new_task())
    assert receiver_topic(WS, RECEIVER) in seen
    # Not the new task's own topic: its only listener is the blocking send that made it,
    # which holds the row (a wake-up would only have it read the row back).
    assert task_topic(t.id) not in seen
    seen.clear()
    [lease] = store.claim(WS, RECEIVER, "r1")
    assert task_topic(t.id) in seen
    seen.clear()
    store.complete(t.id, lease.epoch, "{}")
    assert task_topic(t.id) in seen
    store.set_publisher(None)
    seen.clear()
    store.enqueue(new_task())
    assert seen == []


def test_the_stop_topic_is_published_where_a_blocking_send_stops(store: Store) -> None:
    """``task_stop_topic`` after a commit that ends a task or has it ask for input
    (completed, failed for good, cancelled), never after one a blocking send cannot stop
    at (claimed, progress, failed and queued again): those wake only ``task_topic``."""
    seen: list[str] = []
    store.set_publisher(seen.append)

    def topics(t: Any, act: Any) -> tuple[bool, bool]:
        seen.clear()
        act()
        return task_topic(t.id) in seen, task_stop_topic(t.id) in seen

    t, _ = store.enqueue(new_task())
    leases: list[Any] = []
    assert topics(t, lambda: leases.extend(store.claim(WS, RECEIVER, "r1"))) == (True, False)
    epoch = leases[0].epoch
    assert topics(t, lambda: store.progress(t.id, epoch, "status", "{}")) == (True, False)
    assert topics(t, lambda: store.complete(t.id, epoch, "{}")) == (True, True)
    u, _ = store.enqueue(new_task())
    [lease] = store.claim(WS, RECEIVER, "r1")
    again = lambda: store.fail(u.id, lease.epoch, "again", backoff_seconds=3600)  # noqa: E731
    assert topics(u, again) == (True, False)  # queued again, an hour on
    w, _ = store.enqueue(new_task())
    [lease] = store.claim(WS, RECEIVER, "r1")
    assert lease.task.id == w.id
    assert topics(w, lambda: store.fail(w.id, lease.epoch, "no", retryable=False)) == (True, True)
    v, _ = store.enqueue(new_task())
    assert topics(v, lambda: store.cancel(WS, v.id)) == (True, True)
    store.set_publisher(None)


def test_open_store_paths(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    base = Path(str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", str(base / "xdg"))
    s = open_store(None)
    try:
        assert s.migrate() >= 1
    finally:
        s.close()
    d = base / "xdg" / "mellan"
    assert (d / "relay.db").exists()
    assert (d.stat().st_mode & 0o777) == 0o700
    assert ((d / "relay.db").stat().st_mode & 0o777) == 0o600
    s2 = open_store(str(base / "bare.db"))
    s2.close()
    assert (base / "bare.db").exists()
    with pytest.raises(ValueError, match="unsupported database URL"):
        open_store("mysql://nope")


def test_enqueue_many_one_transaction_with_dedupe(store: Store) -> None:
    got = store.enqueue_many(
        [new_task(message_id="a"), new_task(message_id="b"), new_task(message_id="a")]
    )
    assert [c for _, c in got] == [True, True, False]
    assert got[2][0].id == got[0][0].id
    assert store.enqueue_many([]) == []
    assert len(store.list_tasks(WS)) == 2
    with pytest.raises(ValueError, match="max_attempts"):
        store.enqueue_many([new_task(max_attempts=0)])
