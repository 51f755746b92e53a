"""Progress held and coalesced by the receiver (issue 25): a task that ends within the
window costs one report request, a long task's status still reaches a subscriber before
its completion, order is kept, and a receiver killed mid-window loses nothing the spool
promised. A real relay and ``mellan receiver run`` as a subprocess; requests are counted
from the relay's ``/metrics`` (by route template), never timed."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from melchior.mellan.receiver.progress import HOLD_LIMIT, Outbox
from receiver_kit import (
    RECEIVER,
    Net,
    executions,
    make_net,
    receiving,
    result_text,
    start_receiver,
    worker_route,
    write_config,
)
from relay_proc import RelayProc, db_url_fixture, relay_fixture

__all__ = ["db_url_fixture", "relay_fixture"]

HOLD = "progress_debounce = 60"  # a window no test outlives: what is held stays held
TASK_ROUTES = "/api/receiver/tasks/{task_id}/"


def setup(relay: RelayProc, tmp_path: Path, top: str = "") -> tuple[Net, Path, Path]:
    """A relay, a work directory and a receiver configuration with ``top`` (top-level
    keys) before its tables."""
    net = make_net(relay, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    config = write_config(tmp_path / "receiver.toml", net, work)
    config.write_text(f"{top}\n{config.read_text(encoding='utf-8')}", encoding="utf-8")
    return net, work, config


def task_requests(net: Net) -> dict[str, float]:
    """Requests the relay served per receiver task verb (progress, complete, fail, …)."""
    with net.owner() as c:
        r = c.get("/metrics")
    assert r.status_code == 200, r.text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            route = s.labels.get("route", "")
            if s.name == "mellan_request_duration_seconds_count" and route.startswith(TASK_ROUTES):
                verb = route.removeprefix(TASK_ROUTES)
                counts[verb] = counts.get(verb, 0.0) + s.value
    return counts


def test_a_fast_task_costs_one_report_request(relay: RelayProc, tmp_path: Path) -> None:
    net, work, config = setup(relay, tmp_path, HOLD)
    worker_route(net, work, tmp_path / "worker.py")
    with receiving(net, config) as rp:
        before = task_requests(net)
        task_id = net.send("quick")
        view = net.settled(task_id)
        assert view["state"] == "succeeded", (view["error"], rp.lines)
        rp.wait_line(f"task {task_id}: complete acknowledged")
        rp.wait_line(f"task {task_id}: status: started")  # the status was said, and held
        after = task_requests(net)
    spent = {verb: after[verb] - before.get(verb, 0.0) for verb in after}
    assert spent.get("progress", 0.0) == 0, spent  # the completion superseded it
    assert spent.get("complete") == 1, spent
    assert sum(v for k, v in spent.items() if k != "renew") == 1, spent
    assert result_text(view) == "done: QUICK (turn 1)"


def subscribe(net: Net, task_id: str, seen: list[dict[str, Any]], on: Any) -> None:
    """Read the caller's SubscribeToTask stream to its end, calling ``on`` per item."""
    url = f"{net.relay.url}/a2a/default/{RECEIVER}/tasks/{task_id}:subscribe"
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {net.caller_token}"}
    with httpx.stream("GET", url, headers=headers, timeout=60) as s:
        assert s.status_code == 200, s.read()
        for line in s.iter_lines():
            if line.startswith("data: "):
                item = json.loads(line[6:])
                seen.append(item)
                on(item)


def test_a_long_tasks_status_reaches_a_subscriber_before_its_completion(
    relay: RelayProc, tmp_path: Path
) -> None:
    net, work, config = setup(relay, tmp_path, "progress_debounce = 0.1")
    worker_route(net, work, tmp_path / "worker.py")
    go_on = tmp_path / "go-on"
    seen: list[dict[str, Any]] = []

    def on(item: dict[str, Any]) -> None:
        # the turn goes on only once the caller saw its status: no clock decides
        if "(pid " in json.dumps(item):
            go_on.touch()

    with receiving(net, config) as rp:
        task_id = net.send(f"wait-for {go_on}")
        reader = threading.Thread(target=subscribe, args=(net, task_id, seen, on))
        reader.start()
        reader.join(60)
        assert not reader.is_alive(), rp.lines
        view = net.settled(task_id)
    assert view["state"] == "succeeded", (view["error"], rp.lines)
    said = [i for i, item in enumerate(seen) if "(pid " in json.dumps(item)]
    done = [
        i
        for i, item in enumerate(seen)
        if item.get("statusUpdate", {}).get("status", {}).get("state") == "TASK_STATE_COMPLETED"
    ]
    assert said, seen
    assert done, seen
    assert said[0] < done[0], seen
    assert done[-1] == len(seen) - 1  # nothing after the completion


def test_a_receiver_killed_mid_window_loses_nothing_the_spool_promised(
    relay: RelayProc, tmp_path: Path
) -> None:
    net, work, config = setup(relay, tmp_path, HOLD)
    count = tmp_path / "count"
    worker_route(net, work, tmp_path / "worker.py")
    env = {"COUNT_FILE": str(count)}
    before = task_requests(net)
    hook = {"MELLAN_RECEIVER_TEST_HOOK": "kill-after-spool"}
    dying = start_receiver(net, config, env={**env, **hook})
    task_id = net.send("hello")
    assert dying.finish() == -signal.SIGKILL  # killed right after the spool, status held
    assert any(f"task {task_id}: status: started" in line for line in dying.lines)
    assert executions(count, task_id, "end") == 1
    assert len(list((tmp_path / "state" / "spool").glob("*.json"))) == 1
    assert net.task(task_id)["state"] == "leased"  # the relay has heard nothing yet
    assert task_requests(net).get("progress", 0.0) == before.get("progress", 0.0)
    with receiving(net, config, env=env) as rp:
        view = net.settled(task_id)
        assert view["state"] == "succeeded", (view["error"], rp.lines)
        rp.wait_line(f"task {task_id}: complete acknowledged")
    assert result_text(view) == "done: HELLO (turn 1)"
    assert executions(count, task_id) == 1  # reported from the spool, not run again
    assert list((tmp_path / "state" / "spool").glob("*.json")) == []


# -- the outbox's order, event by event -------------------------------------------------------


def status(text: str, **detail: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"message": {"role": "ROLE_AGENT", "parts": [{"text": text}]}}
    if detail:
        body["detail"] = detail
    return body


def texts(body: dict[str, Any]) -> list[str]:
    return [p["text"] for p in body["message"]["parts"]]


async def drive(debounce: float, script: list[tuple[str, dict[str, Any]] | str]) -> list[Any]:
    """Run an outbox in a task group, feeding it ``script`` (``"yield"``: let it send what
    it holds, with a zero window; ``"close"``: the turn ended); what it sent, in order."""
    sent: list[tuple[str, dict[str, Any]]] = []
    sending = asyncio.Event()

    async def send(kind: str, body: dict[str, Any]) -> None:
        sent.append((kind, body))
        sending.set()

    box = Outbox(send, debounce)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(box.run())
        for step in script:
            if step == "yield":
                sending.clear()
                await sending.wait()
            elif step == "close":
                box.close()
            else:
                assert not isinstance(step, str)
                box.add(*step)
    return sent


def test_adjacent_statuses_merge_and_everything_else_keeps_its_order() -> None:
    m1 = {"role": "ROLE_AGENT", "parts": [{"text": "m1"}]}
    art = {"artifactId": "a", "parts": [{"text": "x"}]}
    usage = {"message": {"parts": [{"text": "usage: tokens 3"}]}, "usage": {"tokens": 3}}
    sent = asyncio.run(
        drive(0, [
            ("status", status("started", pid=7)), ("status", status("line 1")),
            ("message", m1), ("status", status("line 2")), ("artifact", art),
            ("status", usage), ("status", status("line 3")), "yield", "close",
        ])
    )  # fmt: skip
    assert [k for k, _ in sent] == ["status", "message", "status", "artifact", "status", "status"]
    assert texts(sent[0][1]) == ["started", "line 1"]
    assert sent[0][1]["detail"] == {"pid": 7}
    assert sent[1][1] == m1
    assert texts(sent[2][1]) == ["line 2"]
    assert sent[3][1] == art
    assert sent[4][1] == usage  # a usage line is not merged away
    assert texts(sent[5][1]) == ["line 3"]


def test_the_end_of_the_turn_drops_held_statuses_and_sends_the_rest_first() -> None:
    m1 = {"role": "ROLE_AGENT", "parts": [{"text": "m1"}]}
    sent = asyncio.run(
        drive(60, [("status", status("started")), ("message", m1), ("status", status("b")),
                   "close"])
    )  # fmt: skip
    assert sent == [("message", m1)]
    assert asyncio.run(drive(60, [("status", status("started")), "close"])) == []


def test_a_full_outbox_is_sent_at_once_and_holds_the_adapter_until_taken() -> None:
    """Beside a slow relay a chatty turn waits for its outbox rather than growing it."""

    async def go() -> tuple[int, list[str]]:
        sent: list[str] = []

        async def send(kind: str, body: dict[str, Any]) -> None:
            sent.append(body["parts"][0]["text"])

        box = Outbox(send, 3600)  # a window no test waits out
        async with asyncio.TaskGroup() as tg:
            tg.create_task(box.run())
            for i in range(HOLD_LIMIT + 1):
                await box.put("message", {"role": "ROLE_AGENT", "parts": [{"text": f"m{i}"}]})
            sent_before_the_end = len(sent)
            box.close()
        return sent_before_the_end, sent

    before_the_end, sent = asyncio.run(go())
    assert before_the_end == HOLD_LIMIT  # the full outbox went without its window
    assert sent == [f"m{i}" for i in range(HOLD_LIMIT + 1)]
