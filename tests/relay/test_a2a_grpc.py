"""The A2A gRPC binding, through the official generated stubs (``a2a_pb2_grpc``) and the
a2a-sdk's own gRPC client transport.

A real relay (the production app under uvicorn, with ``--grpc-port``'s server in its
lifespan) and a real receiver loop serve every task, on SQLite and on two PostgreSQL
replicas (caller on one, receiver on the other). Every A2A operation is called over
gRPC; errors are read back as the status code and the ``google.rpc.Status`` details.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import grpc
import httpx
import pytest
from a2a.types import a2a_pb2, a2a_pb2_grpc
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2, status_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from a2a_kit import CAPS, RECEIVER, WS, Receiver, Server, World, pg_database, replicas, running

T = TypeVar("T")
TENANT = f"{WS}/{RECEIVER}"


@pytest.fixture(
    scope="module",
    params=["sqlite", pytest.param("postgres-2-replicas", marks=pytest.mark.postgres)],
)
def relay(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, World, Receiver]]:
    if request.param == "sqlite":
        db = tmp_path_factory.mktemp("grpc") / "relay.db"
        with running(f"sqlite://{db}", grpc=True) as (server, world, rx):
            assert rx is not None
            yield server, world, rx
            assert not rx.errors, rx.errors
    else:
        with pg_database() as url, replicas(url, grpc=True) as (server, world, rx):
            yield server, world, rx
            assert not rx.errors, rx.errors


def target(server: Server) -> str:
    assert server.relay.grpc is not None
    return server.relay.grpc.target


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await asyncio.wait_for(coro, 60)  # a deadline for a hang, not a threshold

    return asyncio.run(main())


def meta(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"), ("a2a-version", "1.0"))


def msg(text: str, **metadata: Any) -> a2a_pb2.Message:
    m = a2a_pb2.Message(
        role=a2a_pb2.ROLE_USER, message_id=uuid.uuid4().hex, parts=[a2a_pb2.Part(text=text)]
    )
    meta_struct = struct_pb2.Struct()
    meta_struct.update({"capability": CAPS[0], **metadata})
    m.metadata.CopyFrom(meta_struct)
    return m


def send_req(text: str, *, immediately: bool = False) -> a2a_pb2.SendMessageRequest:
    return a2a_pb2.SendMessageRequest(
        tenant=TENANT,
        message=msg(text),
        configuration=a2a_pb2.SendMessageConfiguration(return_immediately=immediately),
    )


def state(task: a2a_pb2.Task) -> str:
    return str(a2a_pb2.TaskState.Name(task.status.state))


def details(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo of a refused call's ``google.rpc.Status``."""
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            assert status.code == err.code().value[0]
            info = error_details_pb2.ErrorInfo()
            assert status.details[0].Unpack(info)
            return info
    raise AssertionError(f"no status details in {err!r}")


async def refused(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def until(fn: Callable[[], Awaitable[T]], ok: Callable[[T], bool]) -> T:
    while True:
        value = await fn()
        if ok(value):
            return value
        await asyncio.sleep(0.05)


async def stub_for(server: Server) -> tuple[grpc.aio.Channel, a2a_pb2_grpc.A2AServiceStub]:
    channel = grpc.aio.insecure_channel(target(server))
    return channel, a2a_pb2_grpc.A2AServiceStub(channel)


async def drain(it: AsyncIterator[T]) -> list[T]:
    return [ev async for ev in it]


# -- the card ---------------------------------------------------------------------------------


def test_card_lists_the_grpc_interface_with_the_agent_as_tenant(relay: Any) -> None:
    server, _, _ = relay
    card = httpx.get(f"{server.base()}/.well-known/agent-card.json").json()
    grpc_ifaces = [i for i in card["supportedInterfaces"] if i["protocolBinding"] == "GRPC"]
    assert grpc_ifaces == [
        {
            "url": target(server),
            "protocolBinding": "GRPC",
            "protocolVersion": "1.0",
            "tenant": TENANT,
        }
    ]


# -- every operation --------------------------------------------------------------------------


def test_send_message_blocks_until_done_and_get_task_reads_it(relay: Any) -> None:
    server, world, _ = relay

    async def go() -> None:
        channel, stub = await stub_for(server)
        async with channel:
            answer = await stub.SendMessage(
                send_req("echo hi"), metadata=meta(world.tokens["caller"])
            )
            assert answer.WhichOneof("payload") == "task"
            task = answer.task
            assert state(task) == "TASK_STATE_COMPLETED"
            assert task.artifacts[0].parts[0].text == "echo: hi"
            got = await stub.GetTask(
                a2a_pb2.GetTaskRequest(tenant=TENANT, id=task.id),
                metadata=meta(world.tokens["caller"]),
            )
            assert got.id == task.id
            assert state(got) == "TASK_STATE_COMPLETED"

    run(go())


def test_a_direct_reply_is_answered_with_a_message(relay: Any) -> None:
    """DM-MSG-001: an agent that answers with a message and no task of its own."""
    server, world, _ = relay

    async def go() -> None:
        channel, stub = await stub_for(server)
        async with channel:
            answer = await stub.SendMessage(
                send_req("say hello"), metadata=meta(world.tokens["caller"])
            )
            assert answer.WhichOneof("payload") == "message"
            assert answer.message.role == a2a_pb2.ROLE_AGENT
            assert "hello" in answer.message.parts[0].text

    run(go())


def test_streaming_send_ends_with_the_completed_task(relay: Any) -> None:
    server, world, _ = relay

    async def go() -> None:
        channel, stub = await stub_for(server)
        async with channel:
            events = await drain(
                stub.SendStreamingMessage(
                    send_req("steps 3"), metadata=meta(world.tokens["caller"])
                )
            )
            kinds = [e.WhichOneof("payload") for e in events]
            assert kinds[0] == "task"
            assert kinds.count("artifact_update") == 3
            assert events[-1].status_update.status.state == a2a_pb2.TASK_STATE_COMPLETED

    run(go())


def test_subscribe_list_and_cancel_a_held_task(relay: Any) -> None:
    server, world, _ = relay
    token = world.tokens["caller"]

    async def go() -> None:
        channel, stub = await stub_for(server.peer)
        async with channel:
            task = (
                await stub.SendMessage(send_req("hold", immediately=True), metadata=meta(token))
            ).task

            async def working() -> a2a_pb2.Task:
                return await stub.GetTask(
                    a2a_pb2.GetTaskRequest(tenant=TENANT, id=task.id), metadata=meta(token)
                )

            await until(working, lambda t: state(t) == "TASK_STATE_WORKING")
            stream = stub.SubscribeToTask(
                a2a_pb2.SubscribeToTaskRequest(tenant=TENANT, id=task.id), metadata=meta(token)
            )
            first = await stream.read()
            assert first.task.id == task.id
            listed = await stub.ListTasks(
                a2a_pb2.ListTasksRequest(tenant=TENANT), metadata=meta(token)
            )
            assert task.id in [t.id for t in listed.tasks]
            canceled = await stub.CancelTask(
                a2a_pb2.CancelTaskRequest(tenant=TENANT, id=task.id), metadata=meta(token)
            )
            assert task.id == canceled.id
            rest = []
            while (ev := await stream.read()) is not grpc.aio.EOF:
                rest.append(ev)
            assert rest[-1].status_update.status.state == a2a_pb2.TASK_STATE_CANCELED
            again = await stub.CancelTask(  # idempotent, as on the other bindings
                a2a_pb2.CancelTaskRequest(tenant=TENANT, id=task.id), metadata=meta(token)
            )
            assert state(again) == "TASK_STATE_CANCELED"
            done = (await stub.SendMessage(send_req("echo done"), metadata=meta(token))).task
            err = await refused(
                stub.CancelTask(
                    a2a_pb2.CancelTaskRequest(tenant=TENANT, id=done.id), metadata=meta(token)
                )
            )
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert details(err).reason == "TASK_NOT_CANCELABLE"

    run(go())


def test_push_config_create_get_list_delete(relay: Any) -> None:
    server, world, _ = relay
    token = world.tokens["caller"]
    server.store.set_push_allow_private(WS, True)  # the hook is on loopback, never called

    async def go() -> None:
        channel, stub = await stub_for(server)
        async with channel:
            task = (await stub.SendMessage(send_req("echo push"), metadata=meta(token))).task
            made = await stub.CreateTaskPushNotificationConfig(
                a2a_pb2.TaskPushNotificationConfig(
                    tenant=TENANT, task_id=task.id, url="http://127.0.0.1:9/a2a", token="t0k"
                ),
                metadata=meta(token),
            )
            assert made.task_id == task.id
            assert made.id
            got = await stub.GetTaskPushNotificationConfig(
                a2a_pb2.GetTaskPushNotificationConfigRequest(
                    tenant=TENANT, task_id=task.id, id=made.id
                ),
                metadata=meta(token),
            )
            assert got.url == "http://127.0.0.1:9/a2a"
            listed = await stub.ListTaskPushNotificationConfigs(
                a2a_pb2.ListTaskPushNotificationConfigsRequest(tenant=TENANT, task_id=task.id),
                metadata=meta(token),
            )
            assert [c.id for c in listed.configs] == [made.id]
            await stub.DeleteTaskPushNotificationConfig(
                a2a_pb2.DeleteTaskPushNotificationConfigRequest(
                    tenant=TENANT, task_id=task.id, id=made.id
                ),
                metadata=meta(token),
            )
            err = await refused(
                stub.GetTaskPushNotificationConfig(
                    a2a_pb2.GetTaskPushNotificationConfigRequest(
                        tenant=TENANT, task_id=task.id, id=made.id
                    ),
                    metadata=meta(token),
                )
            )
            assert err.code() == grpc.StatusCode.NOT_FOUND

    run(go())


def test_extended_card_lists_the_callers_granted_skills(relay: Any) -> None:
    server, world, _ = relay

    async def go() -> None:
        channel, stub = await stub_for(server)
        async with channel:
            card = await stub.GetExtendedAgentCard(
                a2a_pb2.GetExtendedAgentCardRequest(tenant=TENANT),
                metadata=meta(world.tokens["caller"]),
            )
            assert [s.id for s in card.skills] == [CAPS[0]]
            assert "GRPC" in [i.protocol_binding for i in card.supported_interfaces]

    run(go())


# -- refusals ---------------------------------------------------------------------------------


def test_unknown_task_and_someone_elses_task_look_the_same(relay: Any) -> None:
    server, world, _ = relay

    async def go() -> None:
        channel, stub = await stub_for(server)
        async with channel:
            task = (
                await stub.SendMessage(send_req("echo mine"), metadata=meta(world.tokens["caller"]))
            ).task
            for token, tid in (
                (world.tokens["caller"], "no-such-task"),
                (world.tokens["other"], task.id),
            ):
                err = await refused(
                    stub.GetTask(
                        a2a_pb2.GetTaskRequest(tenant=TENANT, id=tid), metadata=meta(token)
                    )
                )
                assert err.code() == grpc.StatusCode.NOT_FOUND
                info = details(err)
                assert (info.reason, info.domain) == ("TASK_NOT_FOUND", "a2a-protocol.org")
                assert info.metadata["taskId"] == tid

    run(go())


def test_credentials_version_and_tenant_are_checked(relay: Any) -> None:
    server, world, _ = relay
    get = a2a_pb2.GetTaskRequest(tenant=TENANT, id="x")

    async def go() -> None:
        channel, stub = await stub_for(server)
        async with channel:
            err = await refused(stub.GetTask(get, metadata=(("a2a-version", "1.0"),)))
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "Bearer" in (err.details() or "")
            err = await refused(stub.GetTask(get, metadata=meta("not-a-token")))
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert details(err).reason == "UNAUTHENTICATED"
            err = await refused(
                stub.GetTask(get, metadata=(("authorization", f"Bearer {world.tokens['caller']}"),))
            )
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert details(err).reason == "VERSION_NOT_SUPPORTED"
            err = await refused(
                stub.SendMessage(send_req("echo no"), metadata=meta(world.tokens["other"]))
            )
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED  # no grant to this agent
            assert details(err).reason == "PERMISSION_DENIED"
            # a tenant naming another workspace's agent: the caller's credential is not
            # good there, and its tasks are not visible through it
            rival = a2a_pb2.SendMessageRequest(tenant="rival/rival/agent", message=msg("echo x"))
            err = await refused(stub.SendMessage(rival, metadata=meta(world.tokens["caller"])))
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED
            mine = (
                await stub.SendMessage(send_req("echo mine"), metadata=meta(world.tokens["caller"]))
            ).task
            err = await refused(
                stub.GetTask(
                    a2a_pb2.GetTaskRequest(tenant="rival/rival/agent", id=mine.id),
                    metadata=meta(world.tokens["caller"]),
                )
            )
            assert err.code() == grpc.StatusCode.NOT_FOUND
            err = await refused(
                stub.GetTask(
                    a2a_pb2.GetTaskRequest(tenant=f"{TENANT}/tasks", id=mine.id),
                    metadata=meta(world.tokens["caller"]),
                )
            )
            assert err.code() == grpc.StatusCode.NOT_FOUND  # not an agent's name: refused
            assert "tenant" in (err.details() or "")
            err = await refused(
                stub.GetTask(a2a_pb2.GetTaskRequest(id="x"), metadata=meta(world.tokens["caller"]))
            )
            assert err.code() == grpc.StatusCode.NOT_FOUND
            assert "tenant" in (err.details() or "")

    run(go())


def test_an_invalid_send_names_the_field(relay: Any) -> None:
    server, world, _ = relay

    async def go() -> None:
        channel, stub = await stub_for(server)
        async with channel:
            bad = a2a_pb2.SendMessageRequest(
                tenant=TENANT, message=a2a_pb2.Message(role=a2a_pb2.ROLE_USER)
            )
            err = await refused(stub.SendMessage(bad, metadata=meta(world.tokens["caller"])))
            assert err.code() in (
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.FAILED_PRECONDITION,
            )
            assert details(err).reason

    run(go())


def test_a_stream_the_caller_drops_leaves_the_shared_watch(relay: Any) -> None:
    """A cancelled SubscribeToTask call is a gone SSE client: its follower is closed and
    the task's shared reader ends with its last follower."""
    server, world, _ = relay
    token = world.tokens["caller"]
    watches = server.relay.watches

    async def go() -> None:
        channel, stub = await stub_for(server)
        async with channel:
            before = watches.readers()
            sent = await stub.SendMessage(send_req("hold", immediately=True), metadata=meta(token))
            tid = sent.task.id
            call = stub.SubscribeToTask(
                a2a_pb2.SubscribeToTaskRequest(tenant=TENANT, id=tid), metadata=meta(token)
            )
            assert (await call.read()).task.id == tid
            assert watches.readers() == before + 1
            call.cancel()

            async def readers() -> int:
                return watches.readers()

            await until(readers, lambda n: n == before)
            await stub.CancelTask(
                a2a_pb2.CancelTaskRequest(tenant=TENANT, id=tid), metadata=meta(token)
            )

    run(go())


def test_subscribing_to_a_finished_task_is_refused_on_the_stream(relay: Any) -> None:
    server, world, _ = relay
    token = world.tokens["caller"]

    async def go() -> None:
        channel, stub = await stub_for(server)
        async with channel:
            done = (await stub.SendMessage(send_req("echo over"), metadata=meta(token))).task
            call = stub.SubscribeToTask(
                a2a_pb2.SubscribeToTaskRequest(tenant=TENANT, id=done.id), metadata=meta(token)
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call.read()
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert details(caught.value).reason == "UNSUPPORTED_OPERATION"

    run(go())


def test_the_sdk_grpc_client_streams_and_subscribes(relay: Any) -> None:
    """The a2a-sdk's own client over its gRPC transport, chosen from the card."""
    from a2a.client import ClientCallContext, ClientConfig, create_client
    from a2a.utils.constants import TransportProtocol

    server, world, _ = relay

    async def go() -> None:
        client = await create_client(
            server.base(),
            client_config=ClientConfig(
                supported_protocol_bindings=[TransportProtocol.GRPC],
                grpc_channel_factory=grpc.aio.insecure_channel,
                streaming=True,
            ),
        )
        ctx = ClientCallContext(
            service_parameters={"authorization": f"Bearer {world.tokens['caller']}"}
        )
        req = a2a_pb2.SendMessageRequest(message=msg("steps 2"))
        events = [ev async for ev in client.send_message(req, context=ctx)]
        kinds = [ev.WhichOneof("payload") for ev in events]
        assert kinds[0] == "task"
        assert kinds.count("artifact_update") == 2
        assert events[-1].status_update.status.state == a2a_pb2.TASK_STATE_COMPLETED
        held = client.send_message(a2a_pb2.SendMessageRequest(message=msg("hold")), context=ctx)
        tid = (await held.__anext__()).task.id  # then the stream is dropped: the task holds
        await held.aclose()
        stream = client.subscribe(a2a_pb2.SubscribeToTaskRequest(id=tid), context=ctx)
        first = await stream.__anext__()
        assert first.task.id == tid
        await client.cancel_task(a2a_pb2.CancelTaskRequest(id=tid), context=ctx)
        rest = [ev async for ev in stream]
        assert rest[-1].status_update.status.state == a2a_pb2.TASK_STATE_CANCELED
        await client.close()

    run(go())


def test_calls_have_request_ids_and_are_counted_by_rpc_and_status(relay: Any) -> None:
    server, world, _ = relay

    async def go() -> tuple[str, str]:
        channel, stub = await stub_for(server)
        async with channel:
            call = stub.GetTask(
                a2a_pb2.GetTaskRequest(tenant=TENANT, id="no-such"),
                metadata=(*meta(world.tokens["caller"]), ("x-request-id", "trace-grpc-1")),
            )
            with pytest.raises(grpc.aio.AioRpcError):
                await call
            echoed = dict(await call.initial_metadata())["x-request-id"]
            fresh = stub.ListTasks(
                a2a_pb2.ListTasksRequest(tenant=TENANT), metadata=meta(world.tokens["caller"])
            )
            await fresh
            return echoed, dict(await fresh.initial_metadata())["x-request-id"]

    echoed, fresh = run(go())
    assert echoed == "trace-grpc-1"
    assert fresh
    assert fresh != echoed
    scraped = httpx.get(
        f"{server.url}/metrics", headers={"authorization": f"Bearer {world.tokens['owner']}"}
    ).text
    assert 'route="grpc GetTask"' in scraped
    assert 'status="NOT_FOUND"' in scraped
    assert 'route="grpc ListTasks"' in scraped


def test_a_blocking_send_the_caller_abandons_is_kept_and_counted_cancelled(relay: Any) -> None:
    """The caller cancels a send still waiting for its held task: the relay stops waiting
    (the call is counted CANCELLED, as a gone HTTP client is 499); the task stays."""
    server, world, _ = relay
    token = world.tokens["caller"]

    async def go() -> None:
        channel, stub = await stub_for(server)
        async with channel:

            async def listed() -> set[str]:
                page = await stub.ListTasks(
                    a2a_pb2.ListTasksRequest(tenant=TENANT), metadata=meta(token)
                )
                return {t.id for t in page.tasks}

            before = await listed()
            call = stub.SendMessage(send_req("hold"), metadata=meta(token))
            after = await until(listed, lambda ids: bool(ids - before))  # admitted, waiting
            assert not call.done()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            (held,) = after - before
            got = await stub.GetTask(
                a2a_pb2.GetTaskRequest(tenant=TENANT, id=held), metadata=meta(token)
            )
            assert state(got) in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")
            await stub.CancelTask(
                a2a_pb2.CancelTaskRequest(tenant=TENANT, id=held), metadata=meta(token)
            )

    run(go())
    owner = {"authorization": f"Bearer {world.tokens['owner']}"}

    def cancelled() -> bool:
        text = httpx.get(f"{server.url}/metrics", headers=owner).text
        return any(
            'route="grpc SendMessage"' in line and 'status="CANCELLED"' in line
            for line in text.splitlines()
        )

    async def wait() -> None:
        async def look() -> bool:
            return await asyncio.to_thread(cancelled)

        await until(look, bool)

    run(wait())


@settings(max_examples=60)
@given(
    rpc=st.sampled_from(["SendMessage", "GetTask", "ListTasks", "CancelTask"]),
    raw=st.one_of(
        st.binary(max_size=300),
        # a valid request with random bytes after it: unknown or clashing fields
        st.binary(max_size=60).map(
            lambda tail: a2a_pb2.GetTaskRequest(tenant=TENANT, id="t").SerializeToString() + tail
        ),
    ),
)
def test_arbitrary_bytes_are_refused_as_the_callers_fault(relay: Any, rpc: str, raw: bytes) -> None:
    """Whatever bytes arrive, the answer is a status naming the caller's mistake (or a
    normal answer), never INTERNAL or UNKNOWN; the relay answers the next call as ever."""
    server, world, _ = relay
    with grpc.insecure_channel(target(server)) as channel:
        call = channel.unary_unary(f"/lf.a2a.v1.A2AService/{rpc}")
        code, said = grpc.StatusCode.OK, ""
        try:
            call(raw, metadata=meta(world.tokens["caller"]))
        except grpc.RpcError as err:
            code, said = err.code(), err.details()
        assert code in {
            grpc.StatusCode.OK,
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.PERMISSION_DENIED,
        }, (code, said)
        ok = a2a_pb2_grpc.A2AServiceStub(channel).ListTasks(
            a2a_pb2.ListTasksRequest(tenant=TENANT), metadata=meta(world.tokens["caller"])
        )
        assert ok.tasks is not None


def test_server_reflection_describes_the_a2a_service(relay: Any) -> None:
    """What grpcurl and other generic clients read instead of a .proto file."""
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    server, _, _ = relay
    with grpc.insecure_channel(target(server)) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        assert "lf.a2a.v1.A2AService" in set(db.get_services())
        service = db.FindFileContainingSymbol("lf.a2a.v1.A2AService")
        (described,) = [s for s in service.service if s.name == "A2AService"]
        assert {m.name for m in described.method} >= {"SendMessage", "SubscribeToTask"}
