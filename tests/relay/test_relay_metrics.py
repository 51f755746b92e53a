"""``/metrics``, ``/readyz``, request ids and JSON logs, through real HTTP.

The counters are read back with ``prometheus_client``'s own parser after a known
sequence — sends, claims, a completion, a failure, a lease expiry, a cancel, a quota
refusal — and must equal it exactly; gauges come from the database; latency labels are
route templates, never raw paths."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from a2a_kit import CAPS, RECEIVER, WS, Server, World, message, running
from melchior.mellan.relay.notify import receiver_topic
from relay_proc import start_relay
from storekit import db_url_fixture  # noqa: F401

H = {"A2A-Version": "1.0", "Content-Type": "application/json"}


def send(server: Server, world: World) -> httpx.Response:
    body = {
        "message": message("hello", metadata={"capability": CAPS[0]}),
        "configuration": {"returnImmediately": True},
    }
    auth = {"Authorization": f"Bearer {world.tokens['caller']}"}
    return httpx.post(f"{server.base()}/message:send", json=body, headers={**H, **auth})


def receiver(server: Server, world: World, path: str, body: dict[str, Any]) -> Any:
    r = httpx.post(
        f"{server.url}/api/receiver{path}",
        json=body,
        headers={"Authorization": f"Bearer {world.tokens['receiver']}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()


def claim(server: Server, world: World) -> tuple[str, int]:
    leases = receiver(server, world, "/claim", {"limit": 1})["leases"]
    assert len(leases) == 1
    task = leases[0]["task"]
    return task["id"], task["lease_epoch"]


def scrape(server: Server, token: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_follow_a_known_sequence(db_url: str) -> None:
    with running(db_url, receiver=False) as (server, world, _):
        ids = [send(server, world).json()["task"]["id"] for _ in range(5)]
        assert len(set(ids)) == 5
        # 1: completed on its first attempt
        tid, epoch = claim(server, world)
        receiver(server, world, f"/tasks/{tid}/complete", {"epoch": epoch, "result": {}})
        # 2: failed for good on its first attempt
        tid, epoch = claim(server, world)
        receiver(
            server, world, f"/tasks/{tid}/fail", {"epoch": epoch, "error": "x", "retryable": False}
        )
        # 3: its lease expires; the next claim requeues and takes it again (attempt 2)
        tid, _ = claim(server, world)
        server.store.expire_leases([tid])
        again, epoch = claim(server, world)
        assert again == tid
        receiver(server, world, f"/tasks/{tid}/complete", {"epoch": epoch, "result": {}})
        # 4: cancelled by its caller; 5: stays queued
        r = httpx.post(
            f"{server.url}/api/tasks/{ids[3]}/cancel",
            headers={"Authorization": f"Bearer {world.tokens['caller']}"},
        )
        assert r.status_code == 200, r.text
        # and one send refused by a cap
        owner = {"Authorization": f"Bearer {world.tokens['owner']}"}
        httpx.put(f"{server.url}/api/limits/{RECEIVER}", json={"max_queued": 1}, headers=owner)
        assert send(server, world).status_code == 429

        m = scrape(server, world.tokens["owner"])
        assert value(m, "mellan_tasks_accepted_total") == 5
        assert value(m, "mellan_tasks_claimed_total") == 4
        assert value(m, "mellan_tasks_completed_total", outcome="succeeded") == 2
        assert value(m, "mellan_tasks_failed_total", then="failed") == 1
        assert value(m, "mellan_lease_expiries_total", then="requeued") == 1
        assert value(m, "mellan_tasks_cancelled_total") == 1
        assert value(m, "mellan_quota_refusals_total", limit="max-queued") == 1
        assert value(m, "mellan_task_attempts_count") == 3
        assert value(m, "mellan_task_attempts_sum") == 4  # 1 + 1 + 2
        assert value(m, "mellan_task_attempts_bucket", le="1.0") == 2
        assert value(m, "mellan_claim_pickups_total", via="immediate") == 4
        assert value(m, "mellan_receivers_online", workspace=WS) == 1
        # gauges from the database
        for state, n in {"succeeded": 2, "failed": 1, "cancelled": 1, "queued": 1}.items():
            assert value(m, "mellan_tasks", state=state, workspace=WS) == n
        assert value(m, "mellan_queue_depth", agent=RECEIVER, workspace=WS) == 1
        assert value(m, "mellan_queue_oldest_age_seconds", agent=RECEIVER, workspace=WS) >= 0
        # latency by route template: bounded labels, no task ids anywhere
        routes = {dict(k[1]).get("route") for k in m if k[0].startswith("mellan_request_")}
        assert "/a2a rest SendMessage" in routes
        assert "/api/receiver/tasks/{task_id}/complete" in routes
        assert "/api/tasks/{task_id}/cancel" in routes
        assert not any(t in str(routes) for t in ids)
        assert (
            value(
                m,
                "mellan_request_duration_seconds_count",
                route="/a2a rest SendMessage",
                method="POST",
                status="429",
            )
            == 1
        )


def test_metrics_credentials(db_url: str) -> None:
    with running(db_url, receiver=False) as (server, world, _):
        url = f"{server.url}/metrics"
        assert httpx.get(url).status_code == 401
        agent = {"Authorization": f"Bearer {world.tokens['caller']}"}
        assert httpx.get(url, headers=agent).status_code == 403
        server.relay.metrics_token = "m" * 32
        assert httpx.get(url, headers={"Authorization": "Bearer " + "m" * 32}).status_code == 200
        assert httpx.get(url, headers={"Authorization": "Bearer " + "m" * 31}).status_code == 401


def test_gauges_are_cached_between_scrapes(db_url: str) -> None:
    with running(db_url, receiver=False) as (server, world, _):
        server.relay.metrics.cache_seconds = 3600
        scrape(server, world.tokens["owner"])
        send(server, world)
        m = scrape(server, world.tokens["owner"])
        assert value(m, "mellan_queue_depth", agent=RECEIVER, workspace=WS) == 0  # cached
        assert value(m, "mellan_tasks_accepted_total") == 1  # counters are live
        server.relay.metrics.cache_seconds = 0
        m = scrape(server, world.tokens["owner"])
        assert value(m, "mellan_queue_depth", agent=RECEIVER, workspace=WS) == 1


def test_readyz(tmp_path: Path) -> None:
    with running(f"sqlite://{tmp_path / 'r.db'}", receiver=False) as (server, _, _):
        r = httpx.get(f"{server.url}/readyz")
        assert r.status_code == 200
        assert r.json()["ready"] is True
        latest = server.store.latest_schema
        assert r.json()["schema"] == latest
        server.store.latest_schema = latest + 1  # this replica needs a newer schema
        r = httpx.get(f"{server.url}/readyz")
        assert r.status_code == 503
        assert "restart a replica of this version" in r.json()["reason"]
        server.store.latest_schema = latest - 1  # the database is newer than this replica
        r = httpx.get(f"{server.url}/readyz")
        assert r.status_code == 503
        assert "upgrade this replica" in r.json()["reason"]
        server.store.latest_schema = latest
        server.store.close()  # the database is gone
        r = httpx.get(f"{server.url}/readyz")
        assert r.status_code == 503
        assert r.json()["reason"].startswith("database unavailable")
        assert httpx.get(f"{server.url}/healthz").status_code == 503


def test_request_ids(db_url: str) -> None:
    with running(db_url, receiver=False) as (server, world, _):
        r = send(server, world)
        made = r.headers["X-Request-Id"]
        assert len(made) == 32
        tid = r.json()["task"]["id"]
        accept = [a for a in server.store.audit_since(WS) if a.action == "task.accept"]
        assert [(a.subject, a.request_id) for a in accept] == [(tid, made)]
        # a sane incoming id is kept; an insane one is replaced
        auth = {"Authorization": f"Bearer {world.tokens['owner']}"}
        r = httpx.get(f"{server.url}/api/audit", headers={**auth, "X-Request-Id": "lb-42.abc"})
        assert r.headers["X-Request-Id"] == "lb-42.abc"
        assert made in {a["request_id"] for a in r.json()["records"]}
        r = httpx.get(f"{server.url}/healthz", headers={"X-Request-Id": 'bad id"\\'})
        assert r.headers["X-Request-Id"] != 'bad id"\\'
        assert len(r.headers["X-Request-Id"]) == 32
        r = httpx.get(f"{server.url}/healthz", headers={"X-Request-Id": "x" * 129})
        assert len(r.headers["X-Request-Id"]) == 32


def test_json_logs_of_a_real_relay(tmp_path: Path) -> None:
    token_file = tmp_path / "metrics.token"
    token_file.write_text("t" * 40 + "\n")
    relay = start_relay(
        f"sqlite://{tmp_path / 'relay.db'}",
        tmp_path,
        "--log-format",
        "json",
        "--metrics-token-file",
        str(token_file),
    )
    try:
        with relay.client("t" * 40) as c:
            r = c.get("/metrics", headers={"X-Request-Id": "scrape-1"})
            assert r.status_code == 200
            assert r.headers["X-Request-Id"] == "scrape-1"
            assert "mellan_tasks_accepted_total" in r.text or "mellan_tasks_accepted" in r.text
        with relay.owner() as c:
            assert c.get("/api/whoami", headers={"X-Request-Id": "who-1"}).status_code == 200
    finally:
        relay.stop()
    logged = []
    for line in relay.lines:
        if line.startswith("{") and '"logger"' in line:
            logged.append(json.loads(line))
    access = {e["request_id"]: e for e in logged if e["logger"] == "melchior.mellan.access"}
    assert access["scrape-1"]["route"] == "/metrics"
    assert access["scrape-1"]["status"] == 200
    assert access["who-1"]["route"] == "/api/whoami"
    assert isinstance(access["who-1"]["duration_ms"], float)
    assert all(e["level"] in {"info", "warning", "error"} for e in logged)


def test_notify_wakeups_vs_poll_pickups(db_url: str) -> None:
    """A long-poll woken by the send's wake-up picks the task up ``via="notify"``; one
    whose wake-up is lost finds it on its next periodic read (``via="poll"``)."""
    import threading

    with running(db_url, receiver=False) as (server, world, _):
        got: list[Any] = []

        def long_poll() -> None:
            got.append(receiver(server, world, "/claim", {"limit": 1, "wait": 30}))

        server.relay.poll_interval = 30.0  # only the wake-up can find it quickly
        waiter = threading.Thread(target=long_poll)
        waiter.start()
        topic = receiver_topic(WS, RECEIVER)
        for _ in range(10_000):  # until the long-poll has read once and waits on its topic
            if topic in getattr(server.notifier, "_waiters", {}):
                break
            threading.Event().wait(0.005)
        else:
            raise AssertionError("the long-poll never waited")
        send(server, world)
        waiter.join()
        assert len(got[0]["leases"]) == 1
        m = scrape(server, world.tokens["owner"])
        assert value(m, "mellan_claim_pickups_total", via="notify") == 1
        assert value(m, "mellan_receiver_wakeups_total", cause="notify") >= 1
        # a lost wake-up: the periodic read finds the task
        server.relay.poll_interval = 0.05
        publish = server.notifier.publish
        server.store.set_publisher(None)
        try:
            got.clear()
            waiter = threading.Thread(target=long_poll)
            waiter.start()
            send(server, world)
            waiter.join()
        finally:
            server.store.set_publisher(publish)
        assert len(got[0]["leases"]) == 1
        m = scrape(server, world.tokens["owner"])
        picked = value(m, "mellan_claim_pickups_total", via="poll") + value(
            m, "mellan_claim_pickups_total", via="immediate"
        )
        assert picked == 1  # (immediate if the send won the race to the first read)
        assert value(m, "mellan_claim_pickups_total", via="notify") == 1


def test_a_send_during_the_claims_read_wakes_it(db_url: str) -> None:
    """The one-second stall: a send that commits while the long-poll's store read is in
    its worker thread must still wake that long-poll. The read is made to lose the race
    every time (the send commits, and its wake-up is published, before the empty read
    returns); the poll interval is longer than the wait, so only the wake-up can pick
    the task up ``via="notify"`` — a lost one leaves it to the read at the deadline
    (``via="poll"``)."""
    import threading

    with running(db_url, receiver=False) as (server, world, _):
        server.relay.poll_interval = 3600.0
        store = server.store
        real_claim = store.claim
        raced: list[int] = []

        def claim_losing_the_race(*args: Any, **kwargs: Any) -> Any:
            leases = real_claim(*args, **kwargs)
            if not leases and not raced:
                sender = threading.Thread(
                    target=lambda: raced.append(send(server, world).status_code)
                )
                sender.start()
                sender.join()
            return leases

        store.claim = claim_losing_the_race  # type: ignore[method-assign]
        try:
            got = receiver(server, world, "/claim", {"limit": 1, "wait": 5})
        finally:
            del store.claim
        assert raced == [200]
        assert len(got["leases"]) == 1
        m = scrape(server, world.tokens["owner"])
        assert value(m, "mellan_claim_pickups_total", via="notify") == 1
        assert value(m, "mellan_claim_pickups_total", via="poll") == 0
        assert value(m, "mellan_receiver_wakeups_total", cause="poll") == 0


def test_a_record_written_during_the_audit_read_wakes_the_long_poll(db_url: str) -> None:
    """The audit long-poll's form of the same race: a record committed while the empty
    read is in its worker thread wakes the waiter (its future turns True) instead of
    leaving the poll to time out and read again."""
    import threading

    with running(db_url, receiver=False) as (server, world, _):
        server.relay.poll_interval = 3600.0
        store, notifier = server.store, server.notifier
        real_read, real_listen = store.audit_since, notifier.listen
        wrote: list[int] = []
        woken: list[bool] = []

        def read_losing_the_race(*args: Any, **kwargs: Any) -> Any:
            records = real_read(*args, **kwargs)
            if not records and not wrote:
                writer = threading.Thread(
                    target=lambda: wrote.append(
                        store.audit(WS, "test", "test.race", "x", True, "ok", "a record")
                    )
                )
                writer.start()
                writer.join()
            return records

        def listen(topic: str, timeout: float) -> Any:
            fut = real_listen(topic, timeout)
            if topic.startswith("audit:"):
                fut.add_done_callback(lambda f: woken.append(not f.cancelled() and f.result()))
            return fut

        owner = {"Authorization": f"Bearer {world.tokens['owner']}"}
        last = httpx.get(f"{server.url}/api/audit", headers=owner, params={"limit": 1000})
        after = last.json()["next"]
        store.audit_since = read_losing_the_race  # type: ignore[method-assign]
        notifier.listen = listen  # type: ignore[method-assign]
        try:
            got = httpx.get(
                f"{server.url}/api/audit",
                headers=owner,
                params={"after": after, "wait": 5},
                timeout=30,
            ).json()
        finally:
            del store.audit_since, notifier.listen
        assert len(wrote) == 1
        assert [r["action"] for r in got["records"]] == ["test.race"]
        assert True in woken


def blocking_send(server: Server, world: World, out: list[Any]) -> threading.Thread:
    """A blocking SendMessage in a thread of its own; its response lands in ``out``."""
    body = {"message": message("hello", metadata={"capability": CAPS[0]})}
    auth = {"Authorization": f"Bearer {world.tokens['caller']}"}

    def go() -> None:
        url = f"{server.base()}/message:send"
        out.append(httpx.post(url, json=body, headers={**H, **auth}, timeout=30))

    thread = threading.Thread(target=go)
    thread.start()
    return thread


def test_a_blocking_send_reads_its_new_task_only_when_woken(db_url: str) -> None:
    """A blocking send listens for its new task from before the accept's commit, so the
    row the accept returned is the task's state: it does not read the task back at once
    (a thread hop and two queries beside the receiver's claim of it, on the path the
    caller waits for), and the accept itself wakes nothing of the task. Ordered, not
    timed: the send's first step after the accept runs on the event loop before an audit
    long-poll woken by that same commit can answer, so once the accept's record is in
    hand a read back would have been asked for already."""
    with running(db_url, receiver=False) as (server, world, _):
        server.relay.poll_interval = 3600.0  # only wake-ups: no periodic reads
        relay = server.relay
        real_call, real_listen = relay.call, server.notifier.listen
        asked: list[str] = []
        listened: list[str] = []

        async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
            asked.append(getattr(fn, "__name__", ""))
            return await real_call(fn, *args, **kwargs)

        def listen(topic: str, timeout: float) -> Any:
            listened.append(topic)
            return real_listen(topic, timeout)

        owner = {"Authorization": f"Bearer {world.tokens['owner']}"}
        after = httpx.get(f"{server.url}/api/audit", headers=owner).json()["next"]
        relay.call = call  # type: ignore[method-assign]
        server.notifier.listen = listen  # type: ignore[method-assign]
        try:
            records: list[Any] = []

            def audit_long_poll() -> None:
                params = {"after": after, "wait": 20}
                got = httpx.get(f"{server.url}/api/audit", headers=owner, params=params)
                records.extend(got.json()["records"])

            marker = threading.Thread(target=audit_long_poll)
            marker.start()
            for _ in range(2000):  # the long-poll is waiting (bounded by tries, not time)
                if any(t.startswith("audit:") for t in listened):
                    break
                time.sleep(0.005)
            out: list[Any] = []
            sender = blocking_send(server, world, out)
            marker.join(30)
            assert [r["action"] for r in records] == ["task.accept"]
            assert "_read" not in asked  # the new task was not read back
            task_id, epoch = claim(server, world)
            done = {"epoch": epoch, "result": {}}
            receiver(server, world, f"/tasks/{task_id}/complete", done)
            sender.join(30)
        finally:
            del relay.call, server.notifier.listen
        assert out[0].status_code == 200, out[0].text
        assert out[0].json()["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        assert "_read" in asked  # read when woken by the claim or the completion


def test_a_blocking_send_is_woken_by_its_task_ending_not_by_its_claim_or_progress(
    db_url: str,
) -> None:
    """A blocking send waits for its task to stop (the store's stop topic), so the claim
    and a progress event, which cannot end the wait, do not have it read the task (each
    did: a thread hop and two queries beside the claim's answer). The completion ends it.
    Ordered, not timed: a wake-up published by the claim's or the report's commit reaches
    the send before that request's coroutine can answer, so once the answer is in hand
    the read it would have caused has been asked for."""
    with running(db_url, receiver=False) as (server, world, _):
        server.relay.poll_interval = 3600.0
        relay = server.relay
        real_call = relay.call
        asked: list[str] = []

        async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
            asked.append(getattr(fn, "__name__", ""))
            return await real_call(fn, *args, **kwargs)

        relay.call = call  # type: ignore[method-assign]
        try:
            out: list[Any] = []
            sender = blocking_send(server, world, out)
            got = receiver(server, world, "/claim", {"limit": 1, "wait": 20})["leases"]
            task_id, epoch = got[0]["task"]["id"], got[0]["epoch"]
            status = {"epoch": epoch, "kind": "status", "body": {"text": "working"}}
            receiver(server, world, f"/tasks/{task_id}/progress", status)
            assert "_read" not in asked  # neither the claim nor the progress woke it
            done = {"epoch": epoch, "result": {}}
            receiver(server, world, f"/tasks/{task_id}/complete", done)
            sender.join(30)
        finally:
            del relay.call
        assert out[0].status_code == 200, out[0].text
        assert out[0].json()["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        assert asked.count("_read") == 1  # once, woken by the completion


def test_a_completion_right_after_the_accept_wakes_the_blocking_send(db_url: str) -> None:
    """The race the early listening exists for: the task is claimed and completed right
    after the accept's commit, before the send has taken the accept's answer. With no
    periodic read (the poll interval is an hour) only a wake-up it was already listening
    for can end the send: one armed after the accept would have missed it."""
    with running(db_url, receiver=False) as (server, world, _):
        server.relay.poll_interval = 3600.0
        store = server.store
        real_admit = store.admit
        raced: list[str] = []

        def admit_then_finish(tasks: Any) -> Any:
            stored = real_admit(tasks)
            if not raced:
                (lease,) = store.claim(WS, RECEIVER, "racer")
                store.complete(lease.task.id, lease.epoch, "{}")
                raced.append(lease.task.id)
            return stored

        store.admit = admit_then_finish  # type: ignore[method-assign]
        try:
            out: list[Any] = []
            blocking_send(server, world, out).join(30)
        finally:
            del store.admit
        assert len(raced) == 1
        assert out[0].status_code == 200, out[0].text
        got = out[0].json()["task"]
        assert (got["id"], got["status"]["state"]) == (raced[0], "TASK_STATE_COMPLETED")


def test_a_client_gone_mid_body_is_a_normal_end(tmp_path: Path) -> None:
    """A client that closes its connection halfway through a body: one access-log line
    with 499, no traceback or error line, and counted as 499, not as a 5xx."""
    token_file = tmp_path / "metrics.token"
    token_file.write_text("t" * 40 + "\n")
    relay = start_relay(f"sqlite://{tmp_path / 'relay.db'}", tmp_path, "--log-format", "json",
                        "--metrics-token-file", str(token_file))  # fmt: skip
    try:
        host, port = relay.url.removeprefix("http://").split(":")
        for path in ("/api/agents", "/a2a/default/private/ops/message:send"):
            with socket.create_connection((host, int(port)), timeout=30) as s:
                head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        f"Authorization: Bearer {relay.owner_token}\r\n"
                        "Content-Length: 100000\r\n\r\n")  # fmt: skip
                s.sendall(head.encode() + b'{"id": "' + b"a" * 5000)
                time.sleep(0.3)  # the relay is reading the body when the client goes
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with relay.client("t" * 40) as c:
                text = c.get("/metrics").text
            if 'status="499"' in text:
                break
            time.sleep(0.1)
        assert 'status="499"' in text, [ln for ln in text.splitlines() if "status=" in ln]
        assert 'status="500"' not in text
    finally:
        relay.stop()
    said = "\n".join(relay.lines)
    assert "Traceback" not in said
    assert "unexpected error" not in said
    logged = [json.loads(ln) for ln in relay.lines if ln.startswith("{") and '"logger"' in ln]
    assert [e for e in logged if e["level"] == "error"] == []
    gone = {e["route"] for e in logged if e.get("status") == 499}
    assert {"/api/agents"} <= gone, logged
