"""The relay client (``melchior.mellan.RelayClient`` and ``AsyncRelayClient``) against a
real relay and a real receiver (tests/a2a_kit.py): every method, and every refusal
decoded into one :class:`RelayError` with the relay's status, code, reason and words."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from a2a_kit import CALLER, CAPS, OTHER, RECEIVER, WS, Receiver, Server, World, seed
from melchior.mellan import (
    AsyncRelayClient,
    RelayClient,
    RelayError,
    TaskEvent,
    TaskView,
    TransportError,
)

MAX_BODY = 256 * 1024


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, World, Receiver]]:
    db = tmp_path_factory.mktemp("relay-client") / "relay.db"
    server = Server(f"sqlite://{db}", relay={"max_body": MAX_BODY})
    world = seed(server.store)
    rx = Receiver(server.url, world.tokens["receiver"])
    try:
        yield server, world, rx
    finally:
        rx.stop()
        server.stop()


@pytest.fixture
def client(relay: tuple[Server, World, Receiver]) -> Iterator[RelayClient]:
    server, world, _ = relay
    with RelayClient(server.url, world.tokens["caller"]) as c:
        yield c


def until_working(client: RelayClient, task_id: str) -> TaskView:
    for _ in range(600):
        got = client.get(RECEIVER, task_id)
        if got.state == "TASK_STATE_WORKING":
            return got
        asyncio.run(asyncio.sleep(0.05))
    raise AssertionError(f"task {task_id} never started: {got}")


# -- every method ---------------------------------------------------------------------------


def test_whoami_says_whom_the_credential_acts_as(client: RelayClient) -> None:
    me = client.whoami()
    assert (me.kind, me.subject, me.workspace) == ("agent", CALLER, WS)
    assert me.credential_id
    assert client.workspace() == WS


def test_send_returns_at_once_then_wait_follows_it_to_its_answer(client: RelayClient) -> None:
    accepted = client.send(RECEIVER, "echo at once", capability=CAPS[0])
    assert accepted.id
    assert accepted.context_id
    assert accepted.receipt.kind == "queued"
    assert accepted.receipt.message_id == accepted.id
    assert '"task"' in accepted.text  # SendMessage's whole answer, as the relay wrote it
    seen: list[TaskEvent] = []
    done = client.wait(RECEIVER, accepted, on_event=seen.append)
    assert done.state == "TASK_STATE_COMPLETED"
    assert done.answer == "echo: at once"
    assert done.artifact_text() == "echo: at once"
    assert done.receipt.kind == "answered"
    assert done.raw["id"] == accepted.id
    assert not seen or seen[-1].state in ("TASK_STATE_COMPLETED", "TASK_STATE_WORKING")


def test_send_with_wait_gives_the_finished_task(client: RelayClient) -> None:
    done = client.send(RECEIVER, "echo waited", wait=True)
    assert (done.state, done.answer) == ("TASK_STATE_COMPLETED", "echo: waited")
    failed = client.send(RECEIVER, "fail", wait=True)
    assert failed.failed
    assert failed.receipt.kind == "delivered"
    asked = client.send(RECEIVER, "ask", wait=True)
    assert asked.state == "TASK_STATE_INPUT_REQUIRED"
    assert asked.answer == "which one?"
    again = client.send(RECEIVER, "echo the red one", task=asked.id, wait=True)
    assert again.id == asked.id
    assert again.answer == "echo: the red one"


def test_a_stream_runs_to_completed(client: RelayClient) -> None:
    events = list(client.stream(RECEIVER, "steps 3", capability=CAPS[0]))
    assert events[0].kind == "task"
    first = events[0].task
    assert first is not None
    assert first.id
    chunks = [e for e in events if e.kind == "artifactUpdate"]
    assert [e.describe() for e in chunks] == [f"artifact out: chunk-{i}" for i in range(3)]
    assert events[-1].kind == "statusUpdate"
    assert events[-1].state == "TASK_STATE_COMPLETED"
    assert events[-1].said == "3 steps done"
    assert events[-1].text.startswith("{")  # the exact JSON of the event


def test_subscribe_get_list_and_cancel(client: RelayClient, relay: Any) -> None:
    _, _, rx = relay
    held = client.send(RECEIVER, "hold this", context="ctx-client-list")
    until_working(client, held.id)
    page = client.list(RECEIVER, context="ctx-client-list")
    assert [t.id for t in page.tasks] == [held.id]
    assert page.total == 1
    followed = client.subscribe(RECEIVER, held.id)
    first = next(followed)
    assert first.kind == "task"
    assert first.state == "TASK_STATE_WORKING"
    rx.release(held.id)
    rest = list(followed)
    assert rest[-1].state == "TASK_STATE_COMPLETED"
    assert client.get(RECEIVER, held.id).answer == "released"

    other = client.send(RECEIVER, "hold then cancel")
    until_working(client, other.id)
    cancelled = client.cancel(RECEIVER, other.id)
    assert cancelled.id == other.id
    final = client.wait(RECEIVER, other.id)
    assert final.state == "TASK_STATE_CANCELED"
    assert final.receipt.kind == "delivered"


def test_the_async_client_does_the_same(relay: Any) -> None:
    server, world, rx = relay

    async def scenario() -> None:
        async with AsyncRelayClient(server.url, world.tokens["caller"]) as c:
            assert (await c.whoami()).subject == CALLER
            done = await c.send(RECEIVER, "echo async", wait=True)
            assert done.answer == "echo: async"
            events = [e async for e in c.stream(RECEIVER, "steps 2")]
            assert events[-1].state == "TASK_STATE_COMPLETED"
            held = await c.send(RECEIVER, "hold async", context="ctx-async")
            for _ in range(600):
                if (await c.get(RECEIVER, held.id)).state == "TASK_STATE_WORKING":
                    break
                await asyncio.sleep(0.05)
            page = await c.list(RECEIVER, context="ctx-async")
            assert [t.id for t in page.tasks] == [held.id]
            followed = c.subscribe(RECEIVER, held.id)
            first = await anext(followed)  # subscribed before it ends (else: use GetTask)
            assert first.state == "TASK_STATE_WORKING"
            rx.release(held.id)
            states = [e.state async for e in followed]
            assert states[-1] == "TASK_STATE_COMPLETED"
            with pytest.raises(RelayError) as no:
                await c.cancel(RECEIVER, held.id)
            assert no.value.reason == "TASK_NOT_CANCELABLE"
            with pytest.raises(RelayError) as nothing:
                await c.get(RECEIVER, "t-nope")
            assert nothing.value.status == 404

    asyncio.run(scenario())


# -- refusals, decoded once ------------------------------------------------------------------


def test_a_bad_credential_is_401_in_the_relays_words(relay: Any) -> None:
    server, _, _ = relay
    with RelayClient(server.url, "not-a-token") as c, pytest.raises(RelayError) as no:
        c.whoami()
    assert no.value.status == 401
    assert no.value.said
    assert no.value.sentence
    assert "HTTP 401" in str(no.value)
    with (
        RelayClient(server.url, "not-a-token", workspace=WS) as c,
        pytest.raises(RelayError) as a2a,
    ):
        c.send(RECEIVER, "echo x")
    assert a2a.value.status == 401


def test_no_grant_is_403_and_an_unknown_task_404(relay: Any, client: RelayClient) -> None:
    server, world, _ = relay
    with RelayClient(server.url, world.tokens["other"]) as c, pytest.raises(RelayError) as no:
        c.send(RECEIVER, "echo x")
    assert no.value.status == 403
    assert no.value.code == "PERMISSION_DENIED"
    assert "no such capability is available to you" in no.value.sentence
    assert str(no.value).endswith("(PERMISSION_DENIED, HTTP 403)")
    with pytest.raises(RelayError) as unknown:
        client.get(RECEIVER, "t-nope")
    assert (unknown.value.status, unknown.value.reason) == (404, "TASK_NOT_FOUND")
    with pytest.raises(RelayError) as nobody:
        client.send(OTHER, "echo x")
    assert nobody.value.status == 403  # no agent reads like no grant


def test_a_body_over_the_limit_is_413(client: RelayClient) -> None:
    with pytest.raises(RelayError) as big:
        client.send(RECEIVER, "x" * (MAX_BODY + 1))
    assert big.value.status == 413
    assert big.value.reason == "PAYLOAD_TOO_LARGE"


def test_a_send_over_the_rate_is_429_with_retry_after(relay: Any, client: RelayClient) -> None:
    server, world, _ = relay
    owner = {"Authorization": f"Bearer {world.tokens['owner']}"}

    def limits(**values: Any) -> None:
        r = httpx.put(f"{server.url}/api/limits/{CALLER}", json=values, headers=owner, timeout=30)
        assert r.status_code == 200, r.text

    limits(send_rate=0.001, burst=1)
    try:
        over = send_until_refused(client)
        assert over.status == 429
        assert over.code == "RESOURCE_EXHAUSTED"
        assert over.reason == "QUOTA_EXCEEDED"
        assert over.retry_after is not None
        assert over.retry_after > 0
        assert over.details["limit"]
    finally:
        limits(reset=True)


def send_until_refused(client: RelayClient) -> RelayError:
    for _ in range(3):
        try:
            client.send(RECEIVER, "echo fast")
        except RelayError as exc:
            return exc
    raise AssertionError("three sends at a burst of one were all accepted")


def test_a_control_api_refusal_reads_the_same_way(client: RelayClient) -> None:
    with pytest.raises(RelayError) as no:
        client.call("GET", "/api/tasks/t-nope")
    assert no.value.status == 404
    assert no.value.sentence
    assert no.value.code not in ("", "error")


def test_a_relay_that_is_not_there_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with RelayClient(f"http://127.0.0.1:{port}", "tok") as c, pytest.raises(RelayError) as gone:
        c.whoami()
    assert gone.value.status is None
    assert gone.value.unreachable
    assert "cannot reach the relay" in str(gone.value)


def test_a_token_in_clear_to_another_machine_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(TransportError, match=r"plain HTTP to 192\.0\.2\.7"):
        RelayClient("http://192.0.2.7:8787", "secret-token")
    with pytest.raises(TransportError, match="plain HTTP"):
        AsyncRelayClient("http://relay.example.net", "secret-token")


def test_arguments_that_are_not_ids_are_refused_before_sending(client: RelayClient) -> None:
    for agent in ("", "a b", "a\nb", "x" * 300):
        with pytest.raises(RelayError, match="is not an agent id") as no:
            client.send(agent, "echo x")
        assert no.value.status is None
    with pytest.raises(RelayError, match="is not a task id"):
        client.get(RECEIVER, "")
