"""Interop with the official a2a-sdk 1.3 Python client, over JSON-RPC and HTTP+JSON.

A real relay (uvicorn on loopback, SQLite store) and a real receiver loop on the
receiver API serve every task; the client is the SDK's own ``create_client`` reading
the relay's agent card. Each test runs over both bindings.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientCallContext, ClientConfig, create_client
from a2a.types import (
    AuthenticationInfo,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.constants import TransportProtocol
from a2a.utils.errors import (
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
    VersionNotSupportedError,
)
from google.protobuf import json_format

from a2a_kit import CAPS, WS, Receiver, Server, World, pg_database, replicas, running

T = TypeVar("T")
BINDINGS = [TransportProtocol.JSONRPC, TransportProtocol.HTTP_JSON]


@pytest.fixture(
    scope="module",
    params=["sqlite", pytest.param("postgres-2-replicas", marks=pytest.mark.postgres)],
)
def relay(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, World, Receiver]]:
    """One relay on SQLite; or two replicas on PostgreSQL, the caller on one, the receiver on
    the other, and subscriptions on a third connection to the receiver's replica."""
    if request.param == "sqlite":
        db = tmp_path_factory.mktemp("a2a") / "relay.db"
        with running(f"sqlite://{db}") as (server, world, rx):
            assert rx is not None
            yield server, world, rx
            assert not rx.errors, rx.errors
    else:
        with pg_database() as url, replicas(url) as (server, world, rx):
            yield server, world, rx
            assert not rx.errors, rx.errors


@pytest.fixture(params=BINDINGS, ids=["jsonrpc", "http+json"])
def binding(request: pytest.FixtureRequest) -> Any:
    return request.param


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await asyncio.wait_for(coro, 60)  # a deadline for a hang, not a threshold

    return asyncio.run(main())


async def client_for(
    server: Server, token: str, binding: str, *, streaming: bool = False, agent: str | None = None
) -> Any:
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    return await create_client(
        server.base(agent) if agent else server.base(),
        client_config=ClientConfig(
            httpx_client=http, supported_protocol_bindings=[binding], streaming=streaming
        ),
    )


def msg(text: str, **kw: Any) -> Message:
    return Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[Part(text=text)], **kw)


async def one(it: AsyncIterator[Any]) -> Any:
    async for ev in it:
        return ev
    raise AssertionError("no response")


async def collect(it: AsyncIterator[Any]) -> list[Any]:
    return [ev async for ev in it]


def state(task: Any) -> str:
    return str(TaskState.Name(task.status.state))


async def until(fn: Callable[[], Awaitable[T]], ok: Callable[[T], bool]) -> T:
    while True:
        value = await fn()
        if ok(value):
            return value
        await asyncio.sleep(0.05)


# -- cards ---------------------------------------------------------------------------------


def test_public_card_names_both_bindings_and_no_capabilities(relay: Any, binding: str) -> None:
    server, world, _ = relay

    async def go() -> None:
        async with httpx.AsyncClient() as http:
            card = await A2ACardResolver(http, server.base()).get_agent_card()
        client = await client_for(server, world.tokens["caller"], binding)
        bindings = {i.protocol_binding for i in card.supported_interfaces}
        assert bindings == {"JSONRPC", "HTTP+JSON"}
        assert {i.protocol_version for i in card.supported_interfaces} == {"1.0"}
        assert len(card.skills) == 0
        assert card.capabilities.streaming
        assert card.capabilities.extended_agent_card
        assert card.capabilities.push_notifications
        await client.close()

    run(go())


def test_extended_card_lists_exactly_the_granted_capabilities(relay: Any, binding: str) -> None:
    server, world, _ = relay

    async def skills(who: str) -> list[str]:
        client = await client_for(server, world.tokens[who], binding)
        card = await client.get_extended_agent_card(GetExtendedAgentCardRequest())
        await client.close()
        return sorted(s.id for s in card.skills)

    assert run(skills("caller")) == [CAPS[0]]
    assert run(skills("other")) == []
    assert run(skills("rival")) == []
    assert run(skills("owner")) == sorted(CAPS)


# -- send ----------------------------------------------------------------------------------


def test_send_blocks_until_completed(relay: Any, binding: str) -> None:
    server, world, _ = relay

    async def go() -> Any:
        client = await client_for(server, world.tokens["caller"], binding)
        ev = await one(client.send_message(SendMessageRequest(message=msg("echo hello"))))
        await client.close()
        return ev.task

    task = run(go())
    assert state(task) == "TASK_STATE_COMPLETED"
    assert task.status.message.parts[0].text == "echo: hello"
    assert task.artifacts[0].parts[0].text == "echo: hello"
    assert task.history[0].parts[0].text == "echo hello"
    assert task.history[0].task_id == task.id
    assert task.context_id


def test_send_return_immediately_then_get(relay: Any, binding: str) -> None:
    server, world, rx = relay

    async def go() -> tuple[Any, Any, Any]:
        client = await client_for(server, world.tokens["caller"], binding)
        req = SendMessageRequest(
            message=msg("hold"), configuration=SendMessageConfiguration(return_immediately=True)
        )
        first = (await one(client.send_message(req))).task
        working = await until(
            lambda: client.get_task(GetTaskRequest(id=first.id)),
            lambda t: state(t) == "TASK_STATE_WORKING" and len(t.status.message.parts) > 0,
        )
        rx.release(first.id)
        done = await until(
            lambda: client.get_task(GetTaskRequest(id=first.id, history_length=1)),
            lambda t: state(t) == "TASK_STATE_COMPLETED",
        )
        await client.close()
        return first, working, done

    first, working, done = run(go())
    assert state(first) in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")
    assert working.status.message.parts[0].text == "holding"
    assert done.status.message.parts[0].text == "released"
    # the answer is the status message, not also history's last: the last before it is the
    # superseded working message (as the a2a-sdk's own server keeps a task)
    assert len(done.history) == 1
    assert done.history[0].parts[0].text == "holding"


def test_answering_input_required_continues_the_same_task(relay: Any, binding: str) -> None:
    """The caller's answer (with the task's id) is the task's next turn: the same task id,
    the state goes INPUT_REQUIRED → … → COMPLETED, and the history shows both turns."""
    server, world, _ = relay

    async def go() -> tuple[Any, Any, Any]:
        client = await client_for(server, world.tokens["caller"], binding)
        asked = (await one(client.send_message(SendMessageRequest(message=msg("ask"))))).task
        follow = msg("echo the second", task_id=asked.id)
        answered = (await one(client.send_message(SendMessageRequest(message=follow)))).task
        got = await client.get_task(GetTaskRequest(id=asked.id, history_length=10))
        await client.close()
        return asked, answered, got

    asked, answered, got = run(go())
    assert state(asked) == "TASK_STATE_INPUT_REQUIRED"
    assert asked.status.message.parts[0].text == "which one?"
    assert answered.id == asked.id
    assert answered.context_id == asked.context_id
    assert state(answered) == "TASK_STATE_COMPLETED"
    texts = [(Role.Name(m.role), m.parts[0].text) for m in got.history]
    assert texts == [  # the question joined the history once the caller answered it
        ("ROLE_USER", "ask"),
        ("ROLE_AGENT", "which one?"),
        ("ROLE_USER", "echo the second"),
    ]
    assert got.status.message.parts[0].text == "echo: the second"  # once, not in history


def test_message_to_terminal_task_is_refused(relay: Any, binding: str) -> None:
    server, world, _ = relay

    async def go() -> None:
        client = await client_for(server, world.tokens["caller"], binding)
        done = (await one(client.send_message(SendMessageRequest(message=msg("echo x"))))).task
        with pytest.raises(UnsupportedOperationError):
            await one(client.send_message(SendMessageRequest(message=msg("more", task_id=done.id))))
        with pytest.raises(TaskNotFoundError):
            await one(client.send_message(SendMessageRequest(message=msg("x", task_id="nope"))))
        await client.close()

    run(go())


def test_repeated_message_id_returns_the_same_task(relay: Any, binding: str) -> None:
    server, world, rx = relay

    async def go() -> tuple[Any, Any]:
        client = await client_for(server, world.tokens["caller"], binding)
        m = msg("echo once")
        a = (await one(client.send_message(SendMessageRequest(message=m)))).task
        b = (await one(client.send_message(SendMessageRequest(message=m)))).task
        await client.close()
        return a, b

    a, b = run(go())
    assert a.id == b.id
    assert rx.handled.count(a.id) == 1


def test_failed_task_reports_failed_with_the_reason(relay: Any, binding: str) -> None:
    server, world, _ = relay

    async def go() -> Any:
        client = await client_for(server, world.tokens["caller"], binding)
        ev = await one(client.send_message(SendMessageRequest(message=msg("fail"))))
        await client.close()
        return ev.task

    task = run(go())
    assert state(task) == "TASK_STATE_FAILED"
    assert task.status.message.parts[0].text == "it broke"


# -- streaming -----------------------------------------------------------------------------


def test_stream_task_first_then_updates_then_closes(relay: Any, binding: str) -> None:
    server, world, _ = relay

    async def go() -> list[Any]:
        client = await client_for(server, world.tokens["caller"], binding, streaming=True)
        events = await collect(client.send_message(SendMessageRequest(message=msg("steps 3"))))
        await client.close()
        return events

    events = run(go())
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task"
    assert kinds[-1] == "status_update"
    assert state(events[-1].status_update) == "TASK_STATE_COMPLETED"
    chunks = [e.artifact_update for e in events if e.WhichOneof("payload") == "artifact_update"]
    # the stream may start after some chunks were stored; those are in the Task snapshot
    snap = events[0].task
    snapshot_text = [p.text for a in snap.artifacts for p in a.parts]
    streamed = [p.text for c in chunks for p in c.artifact.parts]
    assert snapshot_text + streamed == ["chunk-0", "chunk-1", "chunk-2"]
    assert all(c.task_id == snap.id for c in chunks)


def test_subscribe_after_disconnect_sees_the_rest(relay: Any, binding: str) -> None:
    server, world, rx = relay

    async def go() -> tuple[Any, list[Any]]:
        client = await client_for(server, world.tokens["caller"], binding, streaming=True)
        stream = client.send_message(SendMessageRequest(message=msg("hold")))
        first = await stream.__anext__()  # the Task, then hang up
        await stream.aclose()
        task_id = first.task.id
        await until(
            lambda: client.get_task(GetTaskRequest(id=task_id)),
            lambda t: state(t) == "TASK_STATE_WORKING",
        )
        third = await client_for(server.peer, world.tokens["caller"], binding, streaming=True)
        sub = third.subscribe(SubscribeToTaskRequest(id=task_id))
        snap = await sub.__anext__()
        rx.release(task_id)
        rest = await collect(sub)
        await client.close()
        await third.close()
        return snap, rest

    snap, rest = run(go())
    assert snap.WhichOneof("payload") == "task"
    assert state(snap.task) == "TASK_STATE_WORKING"
    assert state(rest[-1].status_update) == "TASK_STATE_COMPLETED"


def test_subscribe_to_terminal_task_is_unsupported(relay: Any, binding: str) -> None:
    server, world, _ = relay

    async def go() -> None:
        client = await client_for(server, world.tokens["caller"], binding, streaming=True)
        done = [e async for e in client.send_message(SendMessageRequest(message=msg("echo x")))]
        with pytest.raises(UnsupportedOperationError):
            await collect(client.subscribe(SubscribeToTaskRequest(id=done[0].task.id)))
        with pytest.raises(TaskNotFoundError):
            await collect(client.subscribe(SubscribeToTaskRequest(id="no-such-task")))
        await client.close()

    run(go())


# -- cancel ----------------------------------------------------------------------------------


def test_cancel_running_task(relay: Any, binding: str) -> None:
    server, world, rx = relay

    async def go() -> tuple[Any, Any, Any]:
        client = await client_for(server, world.tokens["caller"], binding)
        req = SendMessageRequest(
            message=msg("hold"), configuration=SendMessageConfiguration(return_immediately=True)
        )
        task = (await one(client.send_message(req))).task
        await until(
            lambda: client.get_task(GetTaskRequest(id=task.id)),
            lambda t: state(t) == "TASK_STATE_WORKING",
        )
        cancelled = await client.cancel_task(CancelTaskRequest(id=task.id))
        again = await client.cancel_task(CancelTaskRequest(id=task.id))  # idempotent
        done = (await one(client.send_message(SendMessageRequest(message=msg("echo y"))))).task
        with pytest.raises(TaskNotCancelableError):
            await client.cancel_task(CancelTaskRequest(id=done.id))
        with pytest.raises(TaskNotFoundError):
            await client.cancel_task(CancelTaskRequest(id="no-such-task"))
        await until(lambda: asyncio.sleep(0, rx.cancelled), lambda c: task.id in c)
        await client.close()
        return cancelled, again, done

    cancelled, again, done = run(go())
    assert state(cancelled) == "TASK_STATE_CANCELED"
    assert state(again) == "TASK_STATE_CANCELED"
    # One record per decision, written with the cancel itself: the won cancel once (the
    # repeat adds nothing), the refused one with its rule.
    records = [
        (r.subject, r.allowed, r.rule)
        for r in server.store.audit_since(WS, 0, 10_000)
        if r.action == "task.cancel"
    ]
    assert records.count((cancelled.id, True, "caller")) == 1
    assert (done.id, False, "finished") in records


# -- list ------------------------------------------------------------------------------------


def test_list_pages_through_the_callers_tasks(relay: Any, binding: str) -> None:
    server, world, _ = relay

    async def go() -> tuple[list[str], list[Any], set[str]]:
        client = await client_for(server, world.tokens["caller"], binding)
        ctx = uuid.uuid4().hex
        sent = []
        for i in range(5):
            m = msg(f"echo {i}", context_id=ctx)
            sent.append((await one(client.send_message(SendMessageRequest(message=m)))).task.id)
        pages, token = [], ""
        while True:
            page = await client.list_tasks(
                ListTasksRequest(context_id=ctx, page_size=2, page_token=token)
            )
            pages.append(page)
            token = page.next_page_token
            if not token:
                break
        other = await client_for(server, world.tokens["other"], binding)
        theirs = await other.list_tasks(ListTasksRequest(context_id=ctx))
        await other.close()
        await client.close()
        return sent, pages, {t.id for t in theirs.tasks}

    sent, pages, theirs = run(go())
    assert [len(p.tasks) for p in pages] == [2, 2, 1]
    assert all(p.total_size == 5 and p.page_size == 2 for p in pages)
    listed = [t.id for p in pages for t in p.tasks]
    assert listed == list(reversed(sent))  # newest first
    assert all(len(t.history) == 0 and len(t.artifacts) == 0 for p in pages for t in p.tasks)
    assert theirs == set()


# -- push notifications --------------------------------------------------------------------


def test_push_notifications_through_the_sdk(relay: Any, binding: str) -> None:
    """A config given with the send (the SDK's ``task_push_notification_config``) hears the
    task to its end at a real webhook; configs are then made, read, listed and deleted
    with the SDK's own calls."""
    from webhook_kit import Hook, Seen, ended, states

    def first(seen: list[Seen]) -> list[Seen]:
        return [r for r in seen if "?2" not in r.path]

    server, world, _ = relay
    server.store.set_push_allow_private(WS, True)
    hook = Hook()

    async def go() -> tuple[Any, Any, Any, Any]:
        client = await client_for(server, world.tokens["caller"], binding)
        auth = AuthenticationInfo(scheme="Bearer", credentials="hook-secret")
        push = TaskPushNotificationConfig(url=hook.url, token="tok", authentication=auth)
        config = SendMessageConfiguration(
            return_immediately=True, task_push_notification_config=push
        )
        sent = await one(client.send_message(SendMessageRequest(message=msg("echo hi"),
                                                                configuration=config)))  # fmt: skip
        tid = sent.task.id
        made = await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=tid, id="second", url=hook.url + "?2")
        )
        got = await client.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=tid, id="second")
        )
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=tid)
        )
        await client.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=tid, id="second")
        )
        after = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=tid)
        )
        await client.close()
        return made, got, listed, after

    try:
        made, got, listed, after = run(go())
        # the first config's deliveries (the second one may have heard a state or two
        # before it was deleted; it carries no authentication)
        seen = first(hook.wait_for(lambda s: ended(first(s))))
    finally:
        hook.close()
    assert (made.id, made.url, got.url) == ("second", hook.url + "?2", hook.url + "?2")
    assert len(listed.configs) == 2
    assert [c.id for c in after.configs] == [listed.configs[0].id]
    assert listed.configs[0].authentication.scheme == "Bearer"
    assert listed.configs[0].authentication.credentials == ""  # write-only
    assert states(seen)[-1] == "TASK_STATE_COMPLETED"
    assert all(r.headers["authorization"] == "Bearer hook-secret" for r in seen)


# -- errors ----------------------------------------------------------------------------------


def test_error_classes_map_to_sdk_exceptions(relay: Any, binding: str) -> None:
    server, world, _ = relay

    async def go() -> None:
        client = await client_for(server, world.tokens["caller"], binding)
        with pytest.raises(TaskNotFoundError):
            await client.get_task(GetTaskRequest(id="no-such-task"))
        with pytest.raises(TaskNotFoundError):
            await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id="t", url="https://example.com/hook")
            )
        with pytest.raises(InvalidParamsError):
            await client.get_task(GetTaskRequest(id="x", history_length=-1))
        old = ClientCallContext(service_parameters={"A2A-Version": "0.3"})
        with pytest.raises(VersionNotSupportedError):
            await client.get_task(GetTaskRequest(id="x"), context=old)
        await client.close()

    run(go())


def test_payload_survives_the_sdk_round_trip(relay: Any, binding: str) -> None:
    """What the SDK can represent (its data parts are protobuf Values) comes back equal."""
    server, world, _ = relay

    async def go() -> Any:
        client = await client_for(server, world.tokens["caller"], binding)
        data = json_format.ParseDict({"k": ["v", 1.5, True, None, {"z": "ü"}]}, Part().data)
        m = Message(
            role=Role.ROLE_USER,
            message_id=uuid.uuid4().hex,
            parts=[Part(text="mirror", media_type="text/plain"), Part(data=data)],
        )
        ev = await one(client.send_message(SendMessageRequest(message=m)))
        await client.close()
        return m, ev.task

    sent, task = run(go())
    assert list(task.artifacts[0].parts) == list(sent.parts)


def test_two_subscribers_on_two_replicas_see_the_same_events(relay: Any, binding: str) -> None:
    server, world, rx = relay

    async def go() -> tuple[list[Any], list[Any]]:
        a = await client_for(server, world.tokens["caller"], binding, streaming=True)
        b = await client_for(server.peer, world.tokens["caller"], binding, streaming=True)
        req = SendMessageRequest(
            message=msg("hold"), configuration=SendMessageConfiguration(return_immediately=True)
        )
        task = (await one(a.send_message(req))).task
        await until(
            lambda: a.get_task(GetTaskRequest(id=task.id)),
            lambda t: state(t) == "TASK_STATE_WORKING" and len(t.status.message.parts) > 0,
        )
        sa = a.subscribe(SubscribeToTaskRequest(id=task.id))
        sb = b.subscribe(SubscribeToTaskRequest(id=task.id))
        first_a, first_b = await sa.__anext__(), await sb.__anext__()
        assert first_a.task.id == first_b.task.id == task.id
        rx.release(task.id)
        rest_a, rest_b = await asyncio.gather(collect(sa), collect(sb))
        await a.close()
        await b.close()
        return rest_a, rest_b

    rest_a, rest_b = run(go())
    assert rest_a == rest_b
    assert state(rest_a[-1].status_update) == "TASK_STATE_COMPLETED"
