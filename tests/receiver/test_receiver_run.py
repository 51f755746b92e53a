"""``mellan receiver run`` as a real process beside a real relay, on SQLite and PostgreSQL:
a task sent through the A2A entry is run by the route's ``command`` adapter and its
result returns to the caller; the refusals (no route, outside the allow-list) and the
turn-aware follow-up."""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path
from typing import Any

from receiver_kit import (
    CAPABILITY,
    RECEIVER,
    Net,
    executions,
    make_net,
    receiving,
    result_text,
    wait_for,
    worker_route,
    write_config,
)
from relay_proc import RelayProc, db_url_fixture, relay_fixture

__all__ = ["db_url_fixture", "relay_fixture"]


def setup(relay: RelayProc, tmp_path: Path) -> tuple[Net, Path, Path]:
    net = make_net(relay, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    return net, work, write_config(tmp_path / "receiver.toml", net, work)


def test_a_sent_task_runs_once_and_its_answer_returns(relay: RelayProc, tmp_path: Path) -> None:
    net, work, config = setup(relay, tmp_path)
    count = tmp_path / "count"
    worker_route(net, work, tmp_path / "worker.py")
    with receiving(net, config, env={"COUNT_FILE": str(count)}) as rp:
        task_id = net.send("hello there")
        view = net.settled(task_id)
        assert view["state"] == "succeeded", (view["error"], rp.lines)
        assert result_text(view) == "done: HELLO THERE (turn 1)"
        artifacts = view["result"]["artifacts"]
        assert artifacts[0]["parts"][0]["text"] == "done: HELLO THERE (turn 1)"
        rp.wait_line(f"task {task_id}: complete acknowledged")
        # the claims are the receiver's heartbeat: the relay shows it online, as it said
        with net.owner() as c:
            seen = c.get("/api/agents/private/ops").json()["receiver"]
        assert seen["online"] is True, seen
        assert seen["info"]["adapters"] == ["command"]
        assert seen["info"]["concurrency"] == 2
        # the spool is empty once the relay acknowledged
        assert list((tmp_path / "state" / "spool").glob("*.json")) == []
    assert executions(count, task_id) == 1
    assert executions(count, task_id, "end") == 1


def test_a_direct_reply_answers_a_blocking_send_with_the_message(
    relay: RelayProc, tmp_path: Path
) -> None:
    """A route with ``reply_exit``: a program that exits with it answered with a message and
    no task work (A2A's direct reply, the TCK's DM-MSG-001), so a blocking SendMessage gets
    that Message back, not a Task; the same program exiting 0 still answers with a task."""
    net, work, config = setup(relay, tmp_path)
    worker_route(net, work, tmp_path / "worker.py", reply_exit=5)
    body: dict[str, Any] = {"metadata": {"capability": CAPABILITY}}
    with receiving(net, config) as rp, relay.client(net.caller_token) as c:
        answers = []
        for text in ("reply the weather is fine", "hello"):
            body["message"] = {"messageId": secrets.token_hex(8), "role": "ROLE_USER",
                               "parts": [{"text": text}]}  # fmt: skip
            r = c.post(f"/a2a/default/{RECEIVER}/message:send", json=body,
                       headers={"A2A-Version": "1.0"}, timeout=60)  # fmt: skip
            assert r.status_code == 200, (r.text, rp.lines)
            answers.append(r.json())
    reply, task = answers
    assert set(reply) == {"message"}, reply
    assert reply["message"]["role"] == "ROLE_AGENT"
    assert reply["message"]["parts"] == [{"text": "reply: the weather is fine"}]
    assert "taskId" not in reply["message"]
    assert task["task"]["status"]["state"] == "TASK_STATE_COMPLETED", task
    assert task["task"]["artifacts"][0]["parts"] == [{"text": "done: HELLO (turn 1)"}]


def test_a_program_answers_with_a_file_and_data_parts(relay: RelayProc, tmp_path: Path) -> None:
    """A route with ``stdout = "parts"``: the program prints A2A parts, and the caller's task
    carries them as the answer's artifact, a file and data as printed (the TCK's DM-ART-001)."""
    net, work, config = setup(relay, tmp_path)
    worker_route(net, work, tmp_path / "worker.py", stdout="parts")
    with receiving(net, config) as rp:
        task_id = net.send("parts the value")
        view = net.settled(task_id)
        assert view["state"] == "succeeded", (view["error"], rp.lines)
    (artifact,) = view["result"]["artifacts"]
    assert artifact["parts"] == [
        {"raw": "dGNr", "filename": "output.txt", "mediaType": "text/plain"},
        {"data": {"key": "the value", "count": 42}},
    ]


def test_no_approved_route_fails_the_task_for_good(relay: RelayProc, tmp_path: Path) -> None:
    net, work, config = setup(relay, tmp_path)
    net.propose(adapter="command", cwd=str(work), options={"argv": ["true"]})  # not approved
    with receiving(net, config):
        view = net.settled(net.send("hello"))
    assert view["state"] == "failed"
    assert view["attempt"] == 1  # not retried
    assert "(no-route)" in view["error"]
    assert "mellan route approve" in view["error"]


def test_routes_outside_the_allow_list_are_refused_naming_the_rule(
    relay: RelayProc, tmp_path: Path
) -> None:
    net, work, config = setup(relay, tmp_path)
    count = tmp_path / "count"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = tmp_path / "worker.py"
    cases = [
        ({"adapter": "codex", "cwd": str(work)}, "adapter-not-allowed", "allow.adapters"),
        (
            {"adapter": "command", "cwd": str(elsewhere),
             "options": {"argv": [sys.executable, str(script)]}},
            "cwd-not-allowed", "allow.cwd",
        ),
        (
            {"adapter": "command", "cwd": str(work / ".." / "elsewhere"),
             "options": {"argv": [sys.executable, str(script)]}},
            "cwd-not-allowed", "allow.cwd",
        ),
        (
            {"adapter": "command", "cwd": str(work), "options": {"argv": ["/bin/sh", "-c", "id"]}},
            "program-not-allowed", "allow.programs",
        ),
        (
            {"adapter": "command", "cwd": str(work),
             "options": {"argv": [sys.executable, str(script)], "env": {"LD_PRELOAD": "/x.so"}}},
            "env-not-allowed", "allow.route_env",
        ),
    ]  # fmt: skip
    (work / "link").symlink_to(elsewhere)
    cases.append(
        (
            {
                "adapter": "command",
                "cwd": str(work / "link"),
                "options": {"argv": [sys.executable, str(script)]},
            },
            "cwd-not-allowed",
            "allow.cwd",
        )
    )
    script.write_text("print('ran')\n")
    with receiving(net, config, env={"COUNT_FILE": str(count)}):
        for body, rule, key in cases:
            net.route(**body)
            view = net.settled(net.send("hello"))
            assert view["state"] == "failed", (rule, view)
            assert f"refused by the receiver ({rule})" in view["error"], view["error"]
            assert key in view["error"]
            assert view["attempt"] == 1
    assert not count.exists()


def test_an_answer_after_input_required_is_the_next_turn(relay: RelayProc, tmp_path: Path) -> None:
    net, work, config = setup(relay, tmp_path)
    count = tmp_path / "count"
    worker_route(net, work, tmp_path / "worker.py")
    with receiving(net, config, env={"COUNT_FILE": str(count)}):
        task_id = net.send("ask me")
        view = net.settled(task_id)
        assert view["state"] == "input_required"
        assert result_text(view) == "which one?"
        net.send("the blue one", task=task_id)
        view = net.settled(task_id)
    assert view["state"] == "succeeded", view
    assert view["turn"] == 2
    assert result_text(view) == "done: THE BLUE ONE (turn 2)"
    assert executions(count, task_id) == 2


def test_status_file_and_command(relay: RelayProc, tmp_path: Path) -> None:
    import subprocess

    from relay_proc import MELLAN

    net, work, config = setup(relay, tmp_path)
    worker_route(net, work, tmp_path / "worker.py")
    with receiving(net, config) as rp:
        task_id = net.send("sleep 30")
        rp.wait_line(f"task {task_id}: started turn 1")

        def running() -> dict[str, object] | None:
            out = subprocess.run(
                [MELLAN, "receiver", "status", "--json", "--config", str(config)],
                capture_output=True, text=True, env={**net.relay.env, "RECEIVER_TOKEN": "x"},
            )  # fmt: skip
            state = json.loads(out.stdout) if out.returncode == 0 else None
            if state and state["running"] and state["running"][0]["last_progress"]:
                return state
            return None

        state = wait_for(running, "the status to show the running task")
        assert state["alive"] is True
        assert state["agent"] == "private/ops"
        (row,) = state["running"]
        assert row["task"] == task_id
        assert row["adapter"] == "command"
        assert row["capability"] == "incident.inspect"
        assert row["turn"] == 1
        assert "started" in row["last_progress"]
        text = subprocess.run(
            [MELLAN, "receiver", "status", "--config", str(config)],
            capture_output=True, text=True, env={**net.relay.env, "RECEIVER_TOKEN": "x"},
        ).stdout  # fmt: skip
        assert task_id in text
        assert "incident.inspect" in text
        assert "LAST PROGRESS" in text
        with net.owner() as c:
            c.post(f"/api/tasks/{task_id}/cancel")
        net.settled(task_id)
    after = subprocess.run(
        [MELLAN, "receiver", "status", "--config", str(config)],
        capture_output=True, text=True, env={**net.relay.env, "RECEIVER_TOKEN": "x"},
    )  # fmt: skip
    assert after.returncode == 1
    assert "is not running" in after.stdout


def test_a_task_that_ended_is_off_the_status_by_the_time_its_caller_hears(
    relay: RelayProc, tmp_path: Path
) -> None:
    """A task's start and end reach the status file at once, not at its next half-second
    write: ``mellan receiver status`` run as soon as the relay says a task ended shows no
    task running (it showed the finished one, in docs/receiver.md's walk-through, once
    the relay's own path got fast)."""
    import subprocess

    from relay_proc import MELLAN

    net, work, config = setup(relay, tmp_path)
    worker_route(net, work, tmp_path / "worker.py")
    with receiving(net, config):
        for i in range(3):
            net.settled(net.send(f"quick {i}"))
            out = subprocess.run(
                [MELLAN, "receiver", "status", "--json", "--config", str(config)],
                capture_output=True, text=True, env={**net.relay.env, "RECEIVER_TOKEN": "x"},
            )  # fmt: skip
            state = json.loads(out.stdout)
            assert state["running"] == [], state
            assert state["finished"] == i + 1, state


def test_a_signed_wake_up_makes_it_claim_now_and_a_bad_one_is_refused(
    relay: RelayProc, tmp_path: Path
) -> None:
    import socket
    import time

    import httpx

    from melchior.mellan.signing import sign

    net = make_net(relay, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = write_config(
        tmp_path / "receiver.toml", net, work,
        extra=f'[wake]\nlisten = "127.0.0.1:{port}"\nsecret_env = "WAKE_SECRET"\n',
    )  # fmt: skip
    text = config.read_text().replace("wait = 5", "wait = 0\npoll = 3600")
    config.write_text(text)
    worker_route(net, work, tmp_path / "worker.py")
    url = f"http://127.0.0.1:{port}/wake"
    body = b'{"agent":"private/ops","workspace":"default"}'
    with receiving(net, config, env={"WAKE_SECRET": "s3cret"}) as rp:
        rp.wait_line(f"wake webhook listening on 127.0.0.1:{port}")
        rp.wait_line("no work; claiming again every 3600 s")
        task_id = net.send("hello")
        # refused: wrong secret, no signature, outside the replay window; nothing happens
        bad = [
            sign("other", body, time.time()),
            {},
            sign("s3cret", body, time.time() - 3600),
        ]
        for headers in bad:
            r = httpx.post(url, content=body, headers=headers)
            assert r.status_code == 401, r.text
        rp.wait_line("wake-up refused (replay-window)")
        rp.wait_line("wake-up refused (bad-signature)")
        rp.wait_line("wake-up refused (unsigned)")
        assert httpx.get(url).status_code == 405
        assert net.task(task_id)["state"] == "queued"  # it polls hourly; nobody woke it
        r = httpx.post(url, content=body, headers=sign("s3cret", body, time.time()))
        assert r.status_code == 204
        view = net.settled(task_id)
    assert view["state"] == "succeeded"


def test_the_relay_wakes_a_polling_receiver_when_work_is_queued(
    relay: RelayProc, tmp_path: Path
) -> None:
    """The relay's signed wake-up (its owner set the agent's wake URL and got the secret)
    reaches the receiver's listener, which claims at once instead of in an hour."""
    import socket

    net = make_net(relay, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with net.owner() as c:
        c.put("/api/push/settings", json={"allow_private": True})  # loopback is private
        r = c.put("/api/wake", json={"agent": "private/ops", "url": f"http://127.0.0.1:{port}/"})
        assert r.status_code == 200, r.text
        secret = r.json()["secret"]
    config = write_config(
        tmp_path / "receiver.toml", net, work,
        extra=f'[wake]\nlisten = "127.0.0.1:{port}"\nsecret_env = "WAKE_SECRET"\n',
    )  # fmt: skip
    config.write_text(config.read_text().replace("wait = 5", "wait = 0\npoll = 3600"))
    worker_route(net, work, tmp_path / "worker.py")
    with receiving(net, config, env={"WAKE_SECRET": secret}) as rp:
        rp.wait_line("no work; claiming again every 3600 s")
        view = net.settled(net.send("hello"))
        assert view["state"] == "succeeded"
        assert not any("wake-up refused" in line for line in rp.lines)


def test_tasks_run_side_by_side_up_to_the_concurrency(relay: RelayProc, tmp_path: Path) -> None:
    """Three tasks that each wait until all three run at once: they can only finish if
    the receiver runs them side by side (concurrency 3)."""
    net = make_net(relay, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    config = write_config(tmp_path / "receiver.toml", net, work, concurrency=3)
    worker_route(net, work, tmp_path / "worker.py")
    meet = tmp_path / "meet"
    meet.mkdir()
    with receiving(net, config):
        tasks = [net.send(f"meet 3 {meet}", context=f"ctx-{i}") for i in range(3)]
        views = [net.settled(t) for t in tasks]
    assert [v["state"] for v in views] == ["succeeded"] * 3, [v["error"] for v in views]


def test_a_wake_address_in_use_stops_the_receiver_naming_the_key(
    relay: RelayProc, tmp_path: Path
) -> None:
    import socket

    net = make_net(relay, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(
            tmp_path / "receiver.toml", net, work,
            extra=f'[wake]\nlisten = "127.0.0.1:{port}"\nsecret = "s"\n',
        )  # fmt: skip
        with receiving(net, config) as rp:
            assert rp.finish() == 78
    assert any(f"wake.listen: cannot listen on 127.0.0.1:{port}" in line for line in rp.lines)
