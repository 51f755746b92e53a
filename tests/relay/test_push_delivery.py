"""Push notifications end to end: a real relay, a real receiver on the receiver API, and
real webhook servers on loopback (the test's workspace allows private addresses, as an
owner would for a webhook on a private network).

Endpoints that are up, down (then up), slow, and answering 500s; a 4xx; addresses the
policy refuses before anything is sent; and a relay process restarted with notifications
still undelivered.
"""

from __future__ import annotations

import html
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from a2a_kit import CALLER, WS, Receiver, Server, World, message, running
from dashboard_kit import frames, sign_in
from melchior.mellan.relay.store.base import PushAttempt, TaskState
from melchior.mellan.signing import verify
from storekit import db_url_fixture  # noqa: F401
from webhook_kit import Behaviour, Hook, ended, states

FAST = {"poll": 0.05, "retry_scale": 0.02, "timeout": 2.0}
"""The deliverer's pace in these tests: quick polls and retries, short timeouts."""


@pytest.fixture
def relay_rx(db_url: str) -> Iterator[tuple[Server, World, Receiver]]:
    with running(db_url, push=FAST) as (server, world, rx):
        assert rx is not None
        server.store.set_push_allow_private(WS, True)
        yield server, world, rx
        assert not rx.errors, rx.errors


@pytest.fixture
def relay(relay_rx: tuple[Server, World, Receiver]) -> tuple[Server, World]:
    return relay_rx[0], relay_rx[1]


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.close()


def send(
    server: Server, world: World, text: str, push: dict[str, Any] | None, *,
    binding: str = "rest", wait: bool = False,
) -> httpx.Response:  # fmt: skip
    config: dict[str, Any] = {"returnImmediately": not wait}
    if push is not None:
        config["taskPushNotificationConfig"] = push
    params = {"message": message(text), "configuration": config}
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {world.tokens['caller']}"}
    if binding == "rest":
        return httpx.post(f"{server.base()}/message:send", json=params, headers=headers, timeout=60)
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params}
    return httpx.post(server.base(), json=body, headers=headers, timeout=60)


def task_id(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    data = r.json()
    result = data.get("result", data)
    tid: str = result["task"]["id"]
    return tid


def until_delivered(server: Server, tid: str) -> list[PushAttempt]:
    """The task's outbox once every row is delivered (the webhook may hear the last one a
    moment before the relay records it); the deadline is a hang guard."""
    deadline = time.monotonic() + 60
    while True:
        rows = server.store.push_attempts(tid)
        if rows and all(row.delivered_at is not None for row in rows):
            return rows
        assert time.monotonic() < deadline, rows
        time.sleep(0.02)


@pytest.mark.parametrize("binding", ["rest", "jsonrpc"])
def test_every_change_is_pushed_in_order_authenticated_and_signed(
    relay: tuple[Server, World], hook: Hook, binding: str
) -> None:
    server, world = relay
    push = {"url": hook.url, "token": "tok-1",
            "authentication": {"scheme": "Bearer", "credentials": "s3cret"}}  # fmt: skip
    tid = task_id(send(server, world, "steps 2", push, binding=binding))
    seen = hook.wait_for(ended)
    # what a stream would have said, in order: submitted, working (with its message),
    # the streamed chunks, completed
    assert states(seen)[0] == "TASK_STATE_SUBMITTED"
    assert states(seen)[-1] == "TASK_STATE_COMPLETED"
    assert "TASK_STATE_WORKING" in states(seen)
    chunks = [
        r.json["artifactUpdate"]["artifact"]["parts"][0]["text"]
        for r in seen
        if "artifactUpdate" in r.json
    ]
    assert chunks == ["chunk-0", "chunk-1"]
    assert all(r.json[next(iter(r.json))]["taskId"] == tid for r in seen)
    secret = server.store.push_secret(WS, CALLER)
    assert secret is not None
    for r in seen:
        assert r.path == "/hook"
        assert r.headers["content-type"] == "application/a2a+json"
        assert r.headers["authorization"] == "Bearer s3cret"
        assert r.headers["x-a2a-notification-token"] == "tok-1"
        assert r.headers["x-mellan-task"] == tid
        assert verify(secret, r.headers, r.body, time.time()).allowed
        assert not verify("another-secret", r.headers, r.body, time.time()).allowed
    deliveries = [r.delivery for r in seen]
    assert len(set(deliveries)) == len(deliveries)
    # the outbox keeps every row: each delivered at the first attempt
    rows = until_delivered(server, tid)
    assert all(row.attempts == 1 for row in rows)


def test_configs_made_after_the_send_on_both_bindings(
    relay_rx: tuple[Server, World, Receiver], hook: Hook
) -> None:
    """Create, Get, List, Delete by REST and JSON-RPC; a config hears changes made after it."""
    server, world, rx = relay_rx
    tid = task_id(send(server, world, "hold", None))
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {world.tokens['caller']}"}
    base = server.base()
    made = httpx.post(
        f"{base}/tasks/{tid}/pushNotificationConfigs",
        json={"taskId": tid, "id": "rest-cfg", "url": hook.url,
              "authentication": {"scheme": "Bearer", "credentials": "hidden"}},
        headers=headers,
    ).json()  # fmt: skip
    assert made == {
        "id": "rest-cfg",
        "taskId": tid,
        "url": hook.url,
        "authentication": {"scheme": "Bearer"},
    }  # credentials are write-only; fmt: skip

    def rpc(method: str, params: dict[str, Any]) -> Any:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        return httpx.post(base, json=body, headers=headers).json()

    other = rpc("CreateTaskPushNotificationConfig", {"taskId": tid, "url": hook.url + "?b"})
    cid = other["result"]["id"]
    assert cid not in ("", "rest-cfg")
    got = httpx.get(f"{base}/tasks/{tid}/pushNotificationConfigs/rest-cfg", headers=headers)
    assert got.json()["url"] == hook.url
    listed = rpc("ListTaskPushNotificationConfigs", {"task_id": tid, "page_size": 1})["result"]
    assert [c["id"] for c in listed["configs"]] == ["rest-cfg"]
    assert listed["nextPageToken"] == "rest-cfg"
    rest = httpx.get(
        f"{base}/tasks/{tid}/pushNotificationConfigs",
        params={"pageToken": listed["nextPageToken"]}, headers=headers,
    ).json()  # fmt: skip
    assert [c["id"] for c in rest["configs"]] == [cid]
    assert rest["nextPageToken"] == ""
    # deleting is idempotent; the deleted config hears nothing more
    assert rpc("DeleteTaskPushNotificationConfig", {"taskId": tid, "id": cid})["result"] == {}
    assert rpc("DeleteTaskPushNotificationConfig", {"taskId": tid, "id": cid})["result"] == {}
    gone = rpc("GetTaskPushNotificationConfig", {"taskId": tid, "id": cid})
    assert gone["error"]["code"] == -32001
    # another agent cannot see (or add to) the task's configs: as for an unknown task
    stranger = {**headers, "Authorization": f"Bearer {world.tokens['other']}"}
    r = httpx.get(f"{base}/tasks/{tid}/pushNotificationConfigs", headers=stranger)
    assert r.status_code == 404
    r = httpx.post(
        f"{base}/tasks/{tid}/pushNotificationConfigs", json={"url": hook.url}, headers=stranger
    )
    assert r.status_code == 404
    assert len(server.store.list_push_configs(WS, tid)) == 1
    # the task goes on: the remaining config hears it end
    rx.release(tid)
    seen = hook.wait_for(ended)
    assert all("?b" not in r.path for r in seen)
    assert states(seen)[-1] == "TASK_STATE_COMPLETED"
    assert "TASK_STATE_SUBMITTED" not in states(seen)  # it was made after that


def test_a_webhook_that_is_down_gets_everything_once_it_is_up(
    relay: tuple[Server, World],
) -> None:
    server, world = relay
    port = Hook.reserve()
    tid = task_id(send(server, world, "steps 1", {"url": f"http://127.0.0.1:{port}/hook"}))
    # the task ends while nobody listens: its notifications wait, retried
    deadline = time.monotonic() + 60
    while True:
        rows = server.store.push_attempts(tid)
        failing = [r for r in rows if r.attempts >= 2 and r.last_error]
        if failing:
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.05)
    assert all(r.delivered_at is None for r in rows)
    assert all(r.gave_up_at is None for r in rows)
    hook = Hook(port=port)
    try:
        seen = hook.wait_for(ended)
        assert states(seen)[0] == "TASK_STATE_SUBMITTED"
        assert states(seen)[-1] == "TASK_STATE_COMPLETED"
        assert [r.delivery for r in seen] == sorted(
            (r.delivery for r in seen), key=lambda d: tuple(int(x) for x in d.split("."))
        )
    finally:
        hook.close()


def test_500s_are_retried_with_the_same_delivery_id(relay: tuple[Server, World]) -> None:
    server, world = relay
    hook = Hook(behaviour=Behaviour(statuses=[500, 503, 500]))
    try:
        tid = task_id(send(server, world, "echo hi", {"url": hook.url}))
        seen = hook.wait_for(ended)
        assert states(seen)[-1] == "TASK_STATE_COMPLETED"
        first = hook.requests[0].delivery
        assert [r.delivery for r in hook.requests[:4]] == [first] * 4  # retries of one row
        assert hook.requests[3].status == 200
        assert until_delivered(server, tid)[0].attempts == 4
    finally:
        hook.close()


def test_a_4xx_gives_the_row_up_and_the_next_rows_still_go(
    relay: tuple[Server, World],
) -> None:
    server, world = relay
    hook = Hook(behaviour=Behaviour(statuses=[410]))
    try:
        tid = task_id(send(server, world, "echo hi", {"url": hook.url}))
        seen = hook.wait_for(ended)
        assert "TASK_STATE_SUBMITTED" not in states(seen)  # the refused one was not retried
        (first, *_rest) = server.store.push_attempts(tid)
        assert first.gave_up_at is not None
        assert first.last_error is not None
        assert "410" in first.last_error
        rows = until_settled(server, tid)
        # the owner's dashboard shows each notification on the task's timeline
        c, _ = sign_in(server.url, world.tokens["owner"])
        page = html.unescape(c.get(f"/ui/tasks/{tid}").text)
        assert page.count("push given up") == 1
        assert page.count("push delivered") == len(rows) - 1
        assert f"given up after 1 try; last error: {first.last_error}" in page
    finally:
        hook.close()


def until_settled(server: Server, tid: str) -> list[PushAttempt]:
    """The task's outbox once the task is finished and every row delivered or given up."""
    deadline = time.monotonic() + 60
    while True:
        rows = server.store.push_attempts(tid)
        task = server.store.get_task(WS, tid)
        done = task is not None and task.state is TaskState.SUCCEEDED
        if (
            done
            and all(r.delivered_at or r.gave_up_at for r in rows)
            and rows[-1].state is (TaskState.SUCCEEDED)
        ):
            return rows
        assert time.monotonic() < deadline, rows
        time.sleep(0.02)


def test_a_slow_webhook_does_not_hold_up_others(db_url: str) -> None:
    """Eight tasks push to a webhook that does not answer; another webhook gets all its
    notifications while the first deliveries to the slow one still hang — before any of
    them timed out and was tried again (the deliverer's timeout here is long)."""
    from melchior.mellan.relay.workers.push import PER_HOST

    hold = threading.Event()
    slow = Hook(behaviour=Behaviour(hold=hold))
    fast = Hook()
    try:
        with running(db_url, push={**FAST, "timeout": 30.0}) as (server, world, _):
            server.store.set_push_allow_private(WS, True)
            for _ in range(8):
                task_id(send(server, world, "echo slow", {"url": slow.url}))
            while slow.active < PER_HOST:  # the slow one's first deliveries are hanging
                time.sleep(0.02)
            tid = task_id(send(server, world, "echo fast", {"url": fast.url}))
            seen = fast.wait_for(ended)
            assert states(seen)[-1] == "TASK_STATE_COMPLETED"
            assert all(r.json[next(iter(r.json))]["taskId"] == tid for r in seen)
            # meanwhile the slow endpoint had only its first few, still held, none retried
            assert slow.received == PER_HOST
            assert slow.requests == []
            hold.set()
    finally:
        hold.set()
        slow.close()
        fast.close()


def test_addresses_the_workspace_may_not_reach_are_refused(
    relay: tuple[Server, World], hook: Hook
) -> None:
    server, world = relay
    server.store.set_push_allow_private(WS, False)
    # a literal private address, or plain http, is refused at the door: nothing stored
    r = send(server, world, "echo hi", {"url": hook.url})
    assert r.status_code == 400
    assert "configuration.taskPushNotificationConfig.url" in r.json()["error"]["message"]
    # a name is resolved and judged when it is given, as at delivery: each of these
    # reaches this machine, so the caller is told no at once (nothing stored, nothing sent)
    before = len(server.store.list_tasks(WS, limit=500))
    for host in ("localhost", "localhost.", "0", "2130706433", "0x7f000001", "0177.0.0.1",
                 "127.1", "ⓛⓞⓒⓐⓛⓗⓞⓢⓣ", "[64:ff9b::7f00:1]", "[::ffff:0:127.0.0.1]"):  # fmt: skip
        r = send(server, world, "echo hi", {"url": f"https://{host}:{hook.port}/hook"})
        assert r.status_code == 400, (host, r.text)
        assert "configuration.taskPushNotificationConfig.url" in r.json()["error"]["message"]
    assert len(server.store.list_tasks(WS, limit=500)) == before
    # with private addresses on, the cloud metadata service is still refused
    server.store.set_push_allow_private(WS, True)
    for host in ("169.254.169.254", "[fd00:ec2::254]", "[fe80::1]"):
        r = send(server, world, "echo hi", {"url": f"http://{host}/latest/meta-data"})
        assert r.status_code == 400, (host, r.text)
    assert hook.requests == []


# -- a relay process restarted with notifications undelivered ----------------------------------


def test_undelivered_notifications_survive_a_relay_restart(tmp_path: Path) -> None:
    from relay_proc import setup_pair, start_relay

    db = f"sqlite://{tmp_path / 'relay.db'}"
    home = tmp_path / "home"
    relay = start_relay(db, home)
    port = Hook.reserve()
    try:
        caller, receiver = setup_pair(relay)
        with relay.owner() as c:
            r = c.put("/api/push/settings", json={"allow_private": True})
            assert r.status_code == 200, r.text
            assert r.json()["allow_private"] is True
        headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {caller}"}
        params = {
            "message": {"messageId": uuid.uuid4().hex, "role": "ROLE_USER",
                        "parts": [{"text": "hi"}]},
            "configuration": {"returnImmediately": True, "taskPushNotificationConfig": {
                "url": f"http://127.0.0.1:{port}/hook", "token": "t"}},
        }  # fmt: skip
        r = httpx.post(
            f"{relay.url}/a2a/default/private/ops/message:send", json=params, headers=headers
        )
        tid = r.json()["task"]["id"]
        _complete_one(relay.url, receiver)
        relay.stop()  # the webhook was never up: everything is still in the outbox
        hook = Hook(port=port)
        try:
            relay = start_relay(db, home)
            seen = hook.wait_for(ended)
            assert states(seen)[0] == "TASK_STATE_SUBMITTED"
            assert states(seen)[-1] == "TASK_STATE_COMPLETED"
            assert {json.loads(s.body)["statusUpdate"]["taskId"] for s in seen
                    if "statusUpdate" in s.json} == {tid}  # fmt: skip
        finally:
            hook.close()
    finally:
        relay.stop()


def _complete_one(url: str, token: str) -> None:
    from melchior.mellan.client.receiver import ReceiverClient

    with ReceiverClient(url, token) as rc:
        deadline = time.monotonic() + 30
        while True:
            leases = rc.claim(wait=1.0)
            if leases:
                (lease,) = leases
                rc.complete(lease.task_id, lease.epoch, {"message": {"parts": [{"text": "ok"}]}})
                return
            assert time.monotonic() < deadline


def test_the_store_keeps_the_outbox_of_a_task_state_by_state(
    relay: tuple[Server, World], hook: Hook
) -> None:
    server, world = relay
    tid = task_id(send(server, world, "fail", {"url": hook.url}))
    hook.wait_for(ended)
    rows = server.store.push_attempts(tid)
    assert rows[0].state is TaskState.QUEUED
    assert rows[-1].state is TaskState.FAILED
    assert states(hook.ok())[-1] == "TASK_STATE_FAILED"


def test_the_dashboard_redraws_a_tasks_timeline_when_a_push_lands(db_url: str) -> None:
    """A task's page follows its push rows live: pending while the webhook holds the first
    notification, then delivered, without a reload — woken by the delivery itself (the
    relay's periodic re-read is set to 300 s here, so only a wake-up can redraw it)."""

    hold = threading.Event()
    hook = Hook(behaviour=Behaviour(hold=hold))
    try:
        with running(db_url, push=FAST, poll=300.0) as (server, world, _):
            server.store.set_push_allow_private(WS, True)
            tid = task_id(send(server, world, "echo hi", {"url": hook.url}))
            deadline = time.monotonic() + 60  # a hang guard
            while (t := server.store.get_task(WS, tid)) is None or not t.state.terminal:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            c, _ = sign_in(server.url, world.tokens["owner"])
            with c.stream("GET", f"/ui/tasks/{tid}/live", timeout=30) as stream:
                lines = stream.iter_lines()
                first = {d["target"]: d["html"] for _, _, d in frames(lines, 2)}
                assert "push pending" in first["timeline"]
                assert "push delivered" not in first["timeline"]
                hold.set()  # the webhook answers now
                seen = ""
                while "push delivered" not in seen:  # a read times out if nothing wakes it
                    ((_, _, frame),) = frames(lines, 1)
                    if frame["target"] == "timeline":
                        seen = frame["html"]
    finally:
        hold.set()
        hook.close()
