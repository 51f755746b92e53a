"""The receiver API over real HTTP on both backends, driven by the real ReceiverClient.

Tasks are accepted through the store API in-process (the A2A entry is its own component);
every receiver step goes through a running ``mellan relay``.
"""

from __future__ import annotations

import http.client
import json
import secrets
import threading
import time
from typing import Any

import httpx
import pytest

from melchior.mellan.client.receiver import ClaimedTask, ReceiverClient, ReceiverError
from melchior.mellan.relay.store.base import Outcome, Store
from relay_proc import (
    RelayProc,
    db_url_fixture,
    enqueue,
    enroll_and_join,
    ok,
    relay_fixture,
    setup_pair,
    store_fixture,
)

__all__ = ["db_url_fixture", "relay_fixture", "store_fixture"]

BIG = (
    '{"role":"ROLE_USER","parts":[{"data":{"n":12345678901234567890,"f":0.10000000000000000001}}]}'
)


def audit(relay: RelayProc) -> list[dict[str, Any]]:
    with relay.owner() as c:
        records: list[dict[str, Any]] = ok(c.get("/api/audit", params={"limit": 1000}))["records"]
    return records


def task(relay: RelayProc, task_id: str) -> dict[str, Any]:
    with relay.owner() as c:
        view: dict[str, Any] = ok(c.get(f"/api/tasks/{task_id}"))
    return view


def claim_one(rc: ReceiverClient, **kw: Any) -> ClaimedTask:
    leases = rc.claim(wait=kw.pop("wait", 0), **kw)
    assert len(leases) == 1, leases
    return leases[0]


def test_claim_carries_the_payload_verbatim_and_complete_is_idempotent(
    relay: RelayProc, store: Store
) -> None:
    _, ops = setup_pair(relay)
    task_id = enqueue(store, BIG)
    with httpx.Client(base_url=relay.url, headers={"authorization": f"Bearer {ops}"}) as c:
        raw = c.post("/api/receiver/claim", json={"limit": 1, "wait": 0, "lease_seconds": 30})
    assert raw.status_code == 200
    assert BIG in raw.text  # spliced verbatim: no float rounding, no re-spacing
    lease = raw.json()["leases"][0]
    assert lease["task"]["payload"]["parts"][0]["data"]["n"] == 12345678901234567890
    assert lease["task"]["id"] == task_id
    assert lease["task"]["state"] == "leased"
    assert lease["epoch"] >= 1
    assert lease["expires_at"]
    result = {"message": {"role": "ROLE_AGENT", "parts": [{"data": {"n": 98765432109876543210}}]}}
    with ReceiverClient(relay.url, ops) as rc:
        done = rc.complete(task_id, lease["epoch"], result)
        assert done.outcome is Outcome.OK
        again = rc.complete(task_id, lease["epoch"], result)
        assert again.outcome is Outcome.DUPLICATE
        assert again.ok
        assert rc.claim(wait=0) == []
    view = task(relay, task_id)
    assert view["state"] == "succeeded"
    assert view["result"]["message"]["parts"][0]["data"]["n"] == 98765432109876543210
    with relay.owner() as c:
        assert "98765432109876543210" in c.get(f"/api/tasks/{task_id}").text
    actions = [r["action"] for r in audit(relay) if r["subject"] == task_id]
    assert actions.count("task.claim") == 1
    assert "task.complete" in actions


def test_stale_epoch_is_rejected_and_audited(relay: RelayProc, store: Store) -> None:
    _, ops = setup_pair(relay)
    task_id = enqueue(store)
    with ReceiverClient(relay.url, ops) as rc:
        first = claim_one(rc)
        assert store.expire_leases([task_id]) == 1  # type: ignore[attr-defined]
        second = claim_one(rc)
        assert second.task_id == task_id
        assert second.epoch > first.epoch
        for write in (
            lambda: rc.renew(task_id, first.epoch),
            lambda: rc.progress(task_id, first.epoch, "status", {"state": "working"}),
            lambda: rc.complete(task_id, first.epoch, {"message": {"parts": []}}),
            lambda: rc.fail(task_id, first.epoch, "zombie"),
        ):
            out = write()
            assert out.lease_lost, out
            assert out.reason == "stale-epoch", out
        assert rc.renew(task_id, second.epoch).outcome is Outcome.OK
        assert rc.complete(task_id, second.epoch, {}).outcome is Outcome.OK
    lost = [r for r in audit(relay) if r["action"] == "lease.lost" and r["subject"] == task_id]
    assert len(lost) == 4
    assert all(not r["allowed"] and r["rule"] == "stale-epoch" for r in lost)
    assert task(relay, task_id)["state"] == "succeeded"


def test_expired_leases_are_reclaimed_and_attempts_bounded(relay: RelayProc, store: Store) -> None:
    _, ops = setup_pair(relay)
    task_id = enqueue(store, max_attempts=2)
    with ReceiverClient(relay.url, ops) as rc:
        one = claim_one(rc)
        assert one.task["attempt"] == 1
        store.expire_leases([task_id])  # type: ignore[attr-defined]
        two = claim_one(rc)
        assert two.task["attempt"] == 2
        assert two.epoch > one.epoch
        store.expire_leases([task_id])  # type: ignore[attr-defined]
        assert rc.claim(wait=0) == []
        assert rc.complete(task_id, two.epoch, {}).lease_lost
    view = task(relay, task_id)
    assert view["state"] == "failed"
    assert view["attempt"] == 2


def test_cancel_queued_and_leased(relay: RelayProc, store: Store) -> None:
    codex, ops = setup_pair(relay)
    queued = enqueue(store)
    with relay.owner() as c:
        assert ok(c.post(f"/api/tasks/{queued}/cancel"))["outcome"] == "ok"
        assert ok(c.post(f"/api/tasks/{queued}/cancel"))["outcome"] == "duplicate"
    leased = enqueue(store)
    with ReceiverClient(relay.url, ops) as rc:
        lease = claim_one(rc)
        assert lease.task_id == leased  # the cancelled one was never handed out
        with relay.client(codex) as c:  # the caller may cancel its own task
            assert ok(c.post(f"/api/tasks/{leased}/cancel"))["outcome"] == "ok"
        renewed = rc.renew(leased, lease.epoch)
        assert renewed.lease_lost
        assert renewed.reason == "cancelled"
        assert rc.cancel_ack(leased, lease.epoch).outcome is Outcome.OK
        assert rc.cancel_ack(leased, lease.epoch).outcome is Outcome.DUPLICATE
        assert rc.complete(leased, lease.epoch, {}).lease_lost
    assert task(relay, leased)["state"] == "cancelled"
    with relay.owner() as c:
        r = c.post(f"/api/tasks/{leased}/cancel")
        assert ok(r)["outcome"] == "duplicate"
    done = enqueue(store)
    with ReceiverClient(relay.url, ops) as rc:
        lease = claim_one(rc)
        rc.complete(done, lease.epoch, {})
    with relay.owner() as c:
        r = c.post(f"/api/tasks/{done}/cancel")
        assert r.status_code == 409
        assert r.json()["error"]["code"] == "not-cancelable"
    cancels = [r for r in audit(relay) if r["action"] == "task.cancel"]
    assert [r["allowed"] for r in cancels] == [True, True, False]


def test_fail_retries_then_fails(relay: RelayProc, store: Store) -> None:
    _, ops = setup_pair(relay)
    task_id = enqueue(store, max_attempts=3)
    with ReceiverClient(relay.url, ops) as rc:
        lease = claim_one(rc)
        assert rc.fail(task_id, lease.epoch, "flaky", retry_after=0).outcome is Outcome.OK
        assert task(relay, task_id)["state"] == "queued"
        lease = claim_one(rc)
        out = rc.fail(task_id, lease.epoch, "broken for good", retryable=False)
        assert out.outcome is Outcome.OK
    view = task(relay, task_id)
    assert view["state"] == "failed"
    assert view["error"] == "broken for good"


def test_progress_events_are_recorded_in_order(relay: RelayProc, store: Store) -> None:
    _, ops = setup_pair(relay)
    task_id = enqueue(store)
    with ReceiverClient(relay.url, ops) as rc:
        lease = claim_one(rc)
        rc.progress(task_id, lease.epoch, "status", {"text": "looking"})
        rc.progress(task_id, lease.epoch, "artifact", {"artifactId": "a1", "n": 2**70})
        with pytest.raises(ReceiverError) as bad:
            rc.progress(task_id, lease.epoch, "shout", {})
        assert bad.value.status == 400
        assert "kind" in bad.value.reason
    events = task(relay, task_id)["events"]
    assert [e["kind"] for e in events] == ["status", "artifact"]
    assert events[1]["body"]["n"] == 2**70


def test_long_poll_claim_wakes_when_work_arrives(relay: RelayProc, store: Store) -> None:
    _, ops = setup_pair(relay)
    got: list[ClaimedTask] = []

    def wait_for_work() -> None:
        with ReceiverClient(relay.url, ops) as rc:
            got.extend(rc.claim(wait=30))

    t = threading.Thread(target=wait_for_work)
    t.start()
    task_id = enqueue(store)
    t.join(timeout=60)
    assert not t.is_alive()
    assert [g.task_id for g in got] == [task_id]


def test_a_long_poll_whose_receiver_died_leases_nothing(relay: RelayProc, store: Store) -> None:
    """A receiver killed while its claim waits: the work that arrives next is not leased
    to the dead connection (it would run out and count as an attempt), so the receiver
    that comes back gets it as attempt 1."""
    _, ops = setup_pair(relay)
    host, port = relay.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    body = json.dumps({"wait": 60})
    headers = {"authorization": f"Bearer {ops}", "content-type": "application/json"}
    conn.request("POST", "/api/receiver/claim", body, headers)
    with relay.owner() as c:  # served after the long-poll above was read
        ok(c.get("/healthz"))
    assert conn.sock is not None
    conn.sock.close()  # the receiver is gone: its connection closes under the long-poll
    # The long-poll checks for its caller before each read, at least once a poll interval
    # (1 s). The task comes after the first read that began once the close was seen: a
    # task committed while a read that began before it is in flight can still be leased
    # (that read had no way to know), which is not what this test is about.
    time.sleep(1.5)
    task_id = enqueue(store)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert task(relay, task_id)["state"] == "queued"
        time.sleep(0.1)
    with ReceiverClient(relay.url, ops) as rc:
        lease = claim_one(rc, wait=5)
    assert lease.task_id == task_id
    assert task(relay, task_id)["attempt"] == 1


def test_receiver_api_is_limited_to_the_agents_own_tasks(relay: RelayProc, store: Store) -> None:
    codex, ops = setup_pair(relay)
    task_id = enqueue(store)
    with ReceiverClient(relay.url, codex) as rc:  # the caller is not the receiver
        assert rc.claim(wait=0) == []
        out = rc.renew(task_id, 1)
        assert out.outcome is Outcome.NOT_FOUND
    with ReceiverClient(relay.url, relay.owner_token) as rc:
        with pytest.raises(ReceiverError) as owner:
            rc.claim(wait=0)
        assert owner.value.status == 403
        assert owner.value.code == "agent-only"
    with ReceiverClient(relay.url, "mln_wrong") as rc:
        with pytest.raises(ReceiverError) as wrong:
            rc.claim(wait=0)
        assert wrong.value.status == 401
    with ReceiverClient(relay.url, ops) as rc:
        with pytest.raises(ReceiverError) as bad:
            rc.claim(limit=0)
        assert bad.value.status == 400
        assert "limit" in bad.value.reason
        assert rc.renew("no-such-task", 1).outcome is Outcome.NOT_FOUND


def test_agents_see_tasks_they_sent_or_received(relay: RelayProc, store: Store) -> None:
    codex, ops = setup_pair(relay)
    task_id = enqueue(store)
    stranger = "local/stranger"
    with relay.owner() as c:
        ok(c.post("/api/agents", json={"id": stranger}), 201)
    other = enroll_and_join(relay, stranger)
    for token in (codex, ops):
        with relay.client(token) as c:
            assert [t["id"] for t in ok(c.get("/api/tasks"))["tasks"]] == [task_id]
            assert ok(c.get(f"/api/tasks/{task_id}"))["payload"] == {"text": "hi"}
    with relay.client(other) as c:
        assert ok(c.get("/api/tasks"))["tasks"] == []
        assert c.get(f"/api/tasks/{task_id}").status_code == 404
        assert c.post(f"/api/tasks/{task_id}/cancel").status_code == 404
    with relay.client(ops) as c:  # the receiver cannot cancel; it fails through its lease
        assert c.post(f"/api/tasks/{task_id}/cancel").status_code == 404
    with relay.owner() as c:
        r = c.get("/api/tasks", params={"state": "queued,leased"})
        assert [t["id"] for t in ok(r)["tasks"]] == [task_id]
        assert c.get("/api/tasks", params={"state": "bogus"}).status_code == 400


def test_sweeper_fails_spent_leases_without_any_claim(relay: RelayProc, store: Store) -> None:
    _, ops = setup_pair(relay)
    task_id = enqueue(store, max_attempts=1)
    with ReceiverClient(relay.url, ops) as rc:
        claim_one(rc)
    store.expire_leases([task_id])  # type: ignore[attr-defined]
    # nobody claims again: the relay's own sweeper must settle it (it runs every few seconds)
    deadline = time.monotonic() + 60
    while task(relay, task_id)["state"] != "failed":
        assert time.monotonic() < deadline, "the sweeper never failed the spent task"
        time.sleep(0.2)
    expired = [r for r in audit(relay) if r["action"] == "lease.expired"]
    assert [r["subject"] for r in expired] == [task_id]


def test_shutdown_answers_open_long_polls_and_exits_cleanly(relay: RelayProc, store: Store) -> None:
    _, ops = setup_pair(relay)
    host, port = relay.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    body = json.dumps({"wait": 60})
    headers = {"authorization": f"Bearer {ops}", "content-type": "application/json"}
    conn.request("POST", "/api/receiver/claim", body, headers)  # sent in full on return
    with relay.owner() as c:  # served after the long-poll above was read
        ok(c.get("/healthz"))
    assert relay.stop() == 0
    response = conn.getresponse()
    assert response.status == 200
    assert json.loads(response.read()) == {"leases": []}
    assert any("stopped" in line for line in relay.lines)


def test_batched_renew_and_complete_answer_each_item_as_one_by_one(
    relay: RelayProc, store: Store
) -> None:
    """One request, one transaction, many tasks: each item is fenced, owned and answered
    exactly as the single endpoints would answer it, in order."""
    codex, ops = setup_pair(relay)
    ids = [enqueue(store) for _ in range(4)]
    with ReceiverClient(relay.url, ops) as rc:
        leases = rc.claim(limit=4, wait=0)
        assert sorted(lease.task_id for lease in leases) == sorted(ids)
        epochs = {lease.task_id: lease.epoch for lease in leases}
        stale = ids[3]
        store.expire_leases([stale])  # type: ignore[attr-defined]
        assert claim_one(rc).epoch > epochs[stale]  # reclaimed: the old epoch is fenced out
        renewed = rc.renew_many(
            [(t, epochs[t]) for t in ids] + [("no-such-task", 1)], lease_seconds=60
        )
        assert [r.outcome for r in renewed] == [Outcome.OK] * 3 + [
            Outcome.LEASE_LOST, Outcome.NOT_FOUND,
        ]  # fmt: skip
        assert renewed[3].reason == "stale-epoch"
        result = {"message": {"role": "ROLE_AGENT", "parts": [{"text": "done"}]}}
        done = rc.complete_many(
            [(t, epochs[t], result) for t in ids[:3]] + [(ids[0], epochs[ids[0]], result)]
        )
        assert [r.outcome for r in done] == [Outcome.OK] * 3 + [Outcome.DUPLICATE]
    # another agent's tasks answer as unknown, item by item, and nothing changes
    with ReceiverClient(relay.url, codex) as rc:
        assert [r.outcome for r in rc.renew_many([(ids[0], epochs[ids[0]])])] == [Outcome.NOT_FOUND]
    for t in ids[:3]:
        assert task(relay, t)["state"] == "succeeded"
    with httpx.Client(base_url=relay.url, headers={"authorization": f"Bearer {ops}"}) as c:
        for bad in ({"leases": []}, {"leases": [1]}, {"leases": [{"task_id": "x"}]},
                    {"leases": [{"task_id": "x", "epoch": 1}] * 101}):  # fmt: skip
            r = c.post("/api/receiver/renew", json=bad)
            assert r.status_code == 400, (bad, r.text)
            assert "leases" in r.text or "epoch" in r.text
    actions = [r["action"] for r in audit(relay) if r["subject"] in ids]
    assert actions.count("task.complete") >= 3


def test_a_result_over_max_result_is_refused_at_complete_saying_why(tmp_path: Any) -> None:
    """The result limit is its own setting, below the body limit: a result over it is
    refused at complete (413, rule max-result, the sizes named) and nothing is stored;
    one within it completes. The receiver turns such a refusal into the task's failure
    with this reason (its reporter's "other 4xx")."""
    from relay_proc import start_relay

    relay = start_relay(f"sqlite://{tmp_path / 'relay.db'}", tmp_path, "--max-result", "4096")
    try:
        _, ops = setup_pair(relay)
        with relay.owner() as c:
            c.get("/healthz")
        from melchior.mellan.relay.store import open_store

        store = open_store(f"sqlite://{tmp_path / 'relay.db'}")
        try:
            big, small = enqueue(store), enqueue(store, message_id="m-2")
        finally:
            store.close()
        with ReceiverClient(relay.url, ops) as rc:
            leases = {lease.task_id: lease for lease in rc.claim(wait=0, limit=2)}
            text = "x" * 5000  # a 5 KB body: well under max_body, over max_result
            with pytest.raises(ReceiverError) as refused:
                rc.complete(big, leases[big].epoch, {"message": {"parts": [{"text": text}]}})
            assert refused.value.status == 413
            assert refused.value.code == "result-too-large"
            assert "at most 4096 bytes" in refused.value.reason
            assert "max_result" in refused.value.reason
            ok_ = rc.complete(small, leases[small].epoch, {"message": {"parts": [{"text": "hi"}]}})
            assert ok_.outcome is Outcome.OK
        assert task(relay, big)["state"] == "leased"  # nothing stored for the refusal
        assert task(relay, small)["state"] == "succeeded"
    finally:
        relay.stop()


def test_a_big_result_is_read_whole_and_once_on_both_bindings(
    relay: RelayProc, store: Store
) -> None:
    """A result above the size built and encoded on the event loop (the worker-thread
    path of GetTask) comes back whole, and exactly once: as the status message, not again
    as the history's last message (a 15 MiB answer was sent as 30 MiB). Counted in the raw
    body, so neither a second copy nor a respelling of the text (quotes, backslashes,
    newlines and non-ASCII are in it) can hide."""
    from melchior.mellan.relay.surfaces.a2a.tasks import INLINE_VIEW

    caller, ops = setup_pair(relay)
    task_id = enqueue(store)
    text = 'é"\\\n\t ' + secrets.token_hex(8) + "ü" * (INLINE_VIEW * 4) + '\\"end'
    with ReceiverClient(relay.url, ops) as rc:
        lease = claim_one(rc)
        assert rc.complete(task_id, lease.epoch, {"message": {"parts": [{"text": text}]}}).ok
    base = f"{relay.url}/a2a/default/private/ops"
    h = {"A2A-Version": "1.0", "Authorization": f"Bearer {caller}"}
    rest = httpx.get(f"{base}/tasks/{task_id}", headers=h, timeout=60)
    assert rest.status_code == 200, rest.text
    rpc = httpx.post(base, headers=h, timeout=60, json={
        "jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}})  # fmt: skip
    spelled = json.dumps(text, ensure_ascii=False)[1:-1]  # as the relay writes strings
    for got, view in ((rest, rest.json()), (rpc, rpc.json()["result"])):
        assert got.text.count(spelled) == 1
        assert view["status"]["state"] == "TASK_STATE_COMPLETED"
        assert view["status"]["message"]["parts"] == [{"text": text}]
        assert len(view["history"]) == 1  # the caller's message only
        assert view["history"][0].get("role") != "ROLE_AGENT"
