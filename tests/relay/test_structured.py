"""Structured concurrency: stopping serve or a relay leaves no task behind, unawaited.

Each runs as a real process in asyncio debug mode with warnings shown, is given work (a
message in flight, a long-poll waiting, a send accepted) and is then stopped the ways it
is stopped in life. Asyncio reports a task that was never awaited ("Task was destroyed
but it is pending", "coroutine … was never awaited", "Task exception was never
retrieved"); none of those may appear.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay_proc import setup_pair, start_relay
from session_harness import Harness

DEBUG = {"PYTHONASYNCIODEBUG": "1", "PYTHONWARNINGS": "default", "PYTHONDEVMODE": "1"}
LEAKS = ("was destroyed but it is pending", "was never awaited", "never retrieved")


def leaks(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(mark in line for mark in LEAKS)]


@pytest.fixture
def harness(runtime_dir: Path, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(runtime_dir, tmp_path / "config")
    yield h
    h.close()


@pytest.mark.parametrize("stop", ["pipe-closed", "sigterm"])
def test_stopping_serve_awaits_every_task(harness: Harness, stop: str) -> None:
    a = harness.start(harness.env(**DEBUG))
    b = harness.start(harness.env(**DEBUG))
    told = b.tool("--verb=tell", f"--who={a.id}", "--message=hello")
    assert told.one["receipt"] == "delivered"
    a.next_event("message")
    if stop == "sigterm":
        a.proc.send_signal(signal.SIGTERM)
    else:
        assert a.proc.stdin is not None
        a.proc.stdin.close()
    assert a.proc.wait(timeout=30) == 0
    err = a.proc.stderr.read().decode() if a.proc.stderr else ""
    assert not leaks(err), err


def test_stopping_a_relay_awaits_every_task(tmp_path: Path) -> None:
    relay = start_relay(f"sqlite://{tmp_path / 'relay.db'}", tmp_path, extra_env=DEBUG)
    try:
        caller, receiver = setup_pair(relay)
        waiting = threading.Thread(
            target=lambda: relay.client(receiver).post(
                "/api/receiver/claim", json={"wait": 30}, timeout=60
            ),
            daemon=True,
        )
        waiting.start()  # a long-poll in flight when the relay is told to stop
        with relay.client(caller) as c:
            sent = c.post(
                "/a2a/default/private/ops/message:send",
                json={
                    "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "x"}]},
                    "configuration": {"returnImmediately": True},
                },
                headers={"A2A-Version": "1.0"},
            )
        assert sent.status_code == 200, sent.text
    finally:
        code = relay.stop()
    waiting.join(timeout=60)
    assert code == 0, relay.lines
    output = "\n".join(relay.lines)
    assert not leaks(output), output


def test_the_relay_lifespan_owns_its_tasks_and_leaves_none(tmp_path: Path) -> None:
    """In process: after the app's lifespan ends, no task it started is left, awaited or
    not — the sweeper and the accept batcher lived in its task group; and accepts made
    while it ran were committed by that batcher."""
    import asyncio

    import httpx

    from melchior.mellan.relay.context import Relay
    from melchior.mellan.relay.notify import LocalNotifier
    from melchior.mellan.relay.server.app import create_app
    from melchior.mellan.relay.store import open_store
    from melchior.mellan.relay.store.base import NewTask

    store = open_store(f"sqlite://{tmp_path / 'relay.db'}")
    store.ensure_workspace("w")

    async def go() -> set[asyncio.Task[object]]:
        relay = Relay(store=store, notifier=LocalNotifier(), public_url="http://relay")
        app = create_app(relay)
        async with app.router.lifespan_context(app):
            names = {t.get_name() for t in asyncio.all_tasks()}
            assert {"mellan-lease-sweeper", "mellan-accept-batcher"} <= names
            _, created = await relay.batcher.enqueue(
                NewTask("w", "a", "b", "c", '{"x":1}', message_id="m1")
            )
            assert created
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://relay"
            ) as c:
                assert (await c.get("/healthz")).json()["ok"] is True
        return set(asyncio.all_tasks()) - {asyncio.current_task()}  # type: ignore[arg-type]

    left = asyncio.run(go())
    store.close()
    assert left == set(), left
