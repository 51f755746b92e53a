"""The store's dashboard parts on both backends: sessions, listings, audit search, activity."""

from __future__ import annotations

from melchior.mellan.relay.auth import hash_token
from melchior.mellan.relay.store.base import (
    AuditFilter,
    CredentialKind,
    Outcome,
    Record,
    Store,
    TaskState,
)
from melchior.policy.sessions import session_stands
from storekit import CALLER, RECEIVER, WS, db_url_fixture, new_task, store_fixture

__all__ = ["db_url_fixture", "store_fixture"]


def _stands(store: Store, id_hash: str) -> str:
    s = store.session_for(id_hash)
    assert s is not None
    return session_stands(
        now=s.now, idle_until=s.idle_expires_at, until=s.expires_at,
        credential_live=s.credential_live,
    ).rule  # fmt: skip


def test_sessions_start_stand_idle_out_and_end(store: Store) -> None:
    cid = store.add_credential(WS, CredentialKind.OWNER, "alice", hash_token("t-owner"))
    start = Record("owner:alice", "session.start", "owner-credential", "signed in")
    store.add_session(WS, cid, "h1", idle_seconds=600, max_seconds=3600, record=start)
    s = store.session_for("h1")
    assert s is not None
    assert s.principal.kind is CredentialKind.OWNER
    assert s.principal.subject == "alice"
    assert s.principal.credential_id == cid
    assert s.created_at <= s.idle_expires_at <= s.expires_at
    assert _stands(store, "h1") == "session"
    assert store.session_for("nope") is None
    # touched at most once per `every`
    assert store.touch_session("h1", idle_seconds=600, every=0)
    assert not store.touch_session("h1", idle_seconds=600, every=3600)
    # idle-expired: refused, and a touch does not revive it
    assert store.expire_sessions(["h1"]) == 1
    assert _stands(store, "h1") == "session-idle"
    assert not store.touch_session("h1", idle_seconds=600, every=0)
    # sign-out deletes it, once, with its record
    end = Record("owner:alice", "session.end", "owner", "signed out")
    assert store.end_session("h1", record=end)
    assert not store.end_session("h1", record=end)
    assert store.session_for("h1") is None
    actions = [r.action for r in store.audit_since(WS)]
    assert actions.count("session.start") == 1
    assert actions.count("session.end") == 1


def test_a_revoked_credential_ends_its_sessions(store: Store) -> None:
    cid = store.add_credential(WS, CredentialKind.OWNER, "alice", hash_token("t-owner"))
    store.add_session(WS, cid, "h2", idle_seconds=600, max_seconds=3600)
    assert _stands(store, "h2") == "session"
    assert store.revoke_credential(WS, cid)
    assert _stands(store, "h2") == "credential-revoked"


def test_absolute_lifetime_bounds_the_idle_window(store: Store) -> None:
    cid = store.add_credential(WS, CredentialKind.OWNER, "alice", hash_token("t-owner"))
    store.add_session(WS, cid, "h3", idle_seconds=3600, max_seconds=60)
    s = store.session_for("h3")
    assert s is not None
    assert s.idle_expires_at == s.expires_at


def test_credentials_and_enrollments_are_listed_and_codes_revoked(store: Store) -> None:
    owner = store.add_credential(WS, CredentialKind.OWNER, "alice", hash_token("t-owner"))
    agent = store.add_credential(WS, CredentialKind.AGENT, RECEIVER, hash_token("t-agent"))
    store.revoke_credential(WS, agent)
    creds = {c.id: c for c in store.list_credentials(WS)}
    assert creds[owner].kind is CredentialKind.OWNER
    assert creds[owner].revoked_at is None
    assert creds[agent].subject == RECEIVER
    assert creds[agent].revoked_at is not None
    far = "2999-01-01T00:00:00.000Z"
    store.add_enrollment(WS, RECEIVER, hash_token("code-1"), far)
    store.add_enrollment(WS, CALLER, hash_token("code-2"), far)
    pending = store.list_enrollments(WS)
    assert {e.agent for e in pending} == {RECEIVER, CALLER}
    assert {e.id for e in pending} == {hash_token("code-1"), hash_token("code-2")}
    rec = Record("owner:alice", "enrollment.revoke", "owner", "revoked")
    assert store.revoke_enrollment(WS, hash_token("code-1"), record=rec)
    assert not store.revoke_enrollment(WS, hash_token("code-1"), record=rec)
    assert not store.revoke_enrollment("other", hash_token("code-2"), record=rec)
    assert store.join(hash_token("code-1"), hash_token("tok-1")) is None  # revoked: refused
    assert store.join(hash_token("code-2"), hash_token("tok-2")) is not None
    assert store.list_enrollments(WS) == []
    revokes = store.audit_matching(WS, AuditFilter(action="enrollment.revoke"))
    assert [(r.subject, r.allowed) for r in revokes] == [(RECEIVER, True)]


def test_audit_search_filters_and_pages(store: Store) -> None:
    for i, (action, allowed) in enumerate(
        [("grant.add", True), ("task.claim", True), ("task_x", False), ("task.cancel", False)]
    ):
        store.audit(WS, f"agent:a{i % 2}", action, f"s{i}", allowed, "r", "why")
    store.audit("elsewhere", "agent:a0", "task.claim", "s9", True, "r", "why")
    every = store.audit_matching(WS, AuditFilter())
    assert [r.action for r in every] == ["task.cancel", "task_x", "task.claim", "grant.add"]
    prefix = store.audit_matching(WS, AuditFilter(action="task."))
    assert [r.action for r in prefix] == ["task.cancel", "task.claim"]  # "_" is no wildcard
    star = store.audit_matching(WS, AuditFilter(action="task*"))
    assert [r.action for r in star] == ["task.cancel", "task_x", "task.claim"]
    exact = store.audit_matching(WS, AuditFilter(action="task"))
    assert exact == []
    refused = store.audit_matching(WS, AuditFilter(allowed=False))
    assert [r.action for r in refused] == ["task.cancel", "task_x"]
    mine = store.audit_matching(WS, AuditFilter(actor="agent:a1", allowed=True))
    assert [r.action for r in mine] == ["task.claim"]
    one = store.audit_matching(WS, AuditFilter(subject="s2"))
    assert [r.action for r in one] == ["task_x"]
    seqs = [r.seq for r in every]
    page = store.audit_matching(WS, AuditFilter(), before=seqs[1], limit=1)
    assert [r.seq for r in page] == [seqs[2]]
    follow = store.audit_matching(WS, AuditFilter(), after=seqs[2], newest_first=False)
    assert [r.seq for r in follow] == [seqs[1], seqs[0]]


def test_tasks_filter_by_either_party_and_capability(store: Store) -> None:
    a, _ = store.enqueue(new_task())
    b, _ = store.enqueue(new_task(capability="deploy"))
    c, _ = store.enqueue(new_task(caller=RECEIVER, receiver=CALLER))
    ids = {t.id for t in store.list_tasks(WS, agent=CALLER)}
    assert ids == {a.id, b.id, c.id}
    assert [t.id for t in store.list_tasks(WS, capability="deploy")] == [b.id]
    assert [t.id for t in store.list_tasks(WS, agent=CALLER, receiver=CALLER)] == [c.id]


def test_activity_counts_accepted_finished_and_depth(store: Store) -> None:
    ids = [store.enqueue(new_task())[0].id for _ in range(5)]
    leases = store.claim(WS, RECEIVER, "r", limit=3)
    assert len(leases) == 3
    assert store.complete(leases[0].task.id, leases[0].epoch, "{}").outcome is Outcome.OK
    assert store.fail(leases[1].task.id, leases[1].epoch, "x", retryable=False).ok
    assert store.cancel(WS, ids[4])[1] is Outcome.OK
    act = store.task_activity(WS, 60, 10)
    assert len(act.accepted) == 10
    assert sum(act.accepted) == 5
    assert sum(act.finished["succeeded"]) == 1
    assert sum(act.finished["failed"]) == 1
    assert sum(act.finished["cancelled"]) == 1
    assert act.open_now == 2  # one still leased, one queued
    assert act.depth[-1] == 2
    assert act.start < act.end
    # an empty workspace: all zero
    quiet = store.task_activity("nobody", 3600, 24)
    assert quiet.open_now == 0
    assert set(quiet.depth) == {0}
    assert {s.value for s in TaskState if s.terminal} <= set(act.finished)
