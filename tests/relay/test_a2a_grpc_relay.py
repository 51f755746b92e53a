"""``mellan relay --grpc-port``: the gRPC binding as deployed, in a real relay process, on
SQLite and PostgreSQL — reached by the a2a-sdk's own gRPC client from the agent card,
and fed hostile input (oversized and malformed messages, unknown fields, a spent
deadline, a wrong token) that it refuses without harm, answering normally after.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import uuid
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import httpx
import pytest
from a2a.client import ClientCallContext, ClientConfig, create_client
from a2a.types import a2a_pb2, a2a_pb2_grpc
from a2a.utils.constants import TransportProtocol
from a2a.utils.errors import TaskNotFoundError
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2, status_pb2

from relay_proc import (  # noqa: F401
    MELLAN,
    RelayProc,
    db_url_fixture,
    relay_env,
    setup_pair,
    start_relay,
)

T = TypeVar("T")
MAX_BODY = 256 * 1024
TENANT = "default/private/ops"
START_TIMEOUT = 60.0  # a deadline for a broken start, not a measured threshold


@pytest.fixture(name="relay")
def grpc_relay(db_url: str, tmp_path: Path) -> Iterator[RelayProc]:
    r = start_relay(db_url, tmp_path, "--grpc-port", "0", "--max-body", str(MAX_BODY))
    try:
        yield r
    finally:
        assert r.stop() == 0, r.lines[-20:]


def grpc_target(relay: RelayProc) -> str:
    """The ``host:port`` of the relay's 'A2A over gRPC … on …' status line."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        for line in relay.lines:
            if "A2A over gRPC" in line:
                return line.rsplit(" on ", 1)[1].strip()
        time.sleep(0.05)
    raise AssertionError(f"no gRPC status line: {relay.lines}")


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await asyncio.wait_for(coro, 60)  # a deadline for a hang, not a threshold

    return asyncio.run(main())


def meta(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"), ("a2a-version", "1.0"))


def message(text: str) -> a2a_pb2.Message:
    m = a2a_pb2.Message(
        role=a2a_pb2.ROLE_USER, message_id=uuid.uuid4().hex, parts=[a2a_pb2.Part(text=text)]
    )
    s = struct_pb2.Struct()
    s.update({"capability": "incident.inspect"})
    m.metadata.CopyFrom(s)
    return m


def queued_send(text: str) -> a2a_pb2.SendMessageRequest:
    """A send that returns at once: no receiver runs in these tests, so it stays queued."""
    return a2a_pb2.SendMessageRequest(
        tenant=TENANT,
        message=message(text),
        configuration=a2a_pb2.SendMessageConfiguration(return_immediately=True),
    )


def test_the_sdk_client_finds_grpc_on_the_card_and_sends_gets_and_cancels(
    relay: RelayProc,
) -> None:
    caller, _ = setup_pair(relay)
    target = grpc_target(relay)
    base = f"{relay.url}/a2a/default/private/ops"

    card = httpx.get(f"{base}/.well-known/agent-card.json").json()

    async def go() -> None:
        assert {
            "url": target,
            "protocolBinding": "GRPC",
            "protocolVersion": "1.0",
            "tenant": TENANT,
        } in card["supportedInterfaces"]
        config = ClientConfig(
            supported_protocol_bindings=[TransportProtocol.GRPC],
            grpc_channel_factory=grpc.aio.insecure_channel,
            streaming=False,
        )
        client = await create_client(base, client_config=config)
        ctx = ClientCallContext(service_parameters={"authorization": f"Bearer {caller}"})
        req = queued_send("inspect the outage")
        req.tenant = ""  # the sdk's tenant decorator fills in the card's
        sent = [ev async for ev in client.send_message(req, context=ctx)]
        task = sent[0].task
        assert a2a_pb2.TaskState.Name(task.status.state) == "TASK_STATE_SUBMITTED"
        got = await client.get_task(a2a_pb2.GetTaskRequest(id=task.id), context=ctx)
        assert got.id == task.id
        canceled = await client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id), context=ctx)
        assert canceled.status.state == a2a_pb2.TASK_STATE_CANCELED
        with pytest.raises(TaskNotFoundError):
            await client.get_task(a2a_pb2.GetTaskRequest(id="nope"), context=ctx)
        await client.close()

    run(go())


def test_hostile_input_is_refused_and_the_relay_still_answers(relay: RelayProc) -> None:
    caller, _ = setup_pair(relay)
    target = grpc_target(relay)

    async def go() -> None:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = a2a_pb2_grpc.A2AServiceStub(channel)
            raw = channel.unary_unary("/lf.a2a.v1.A2AService/SendMessage")
            codes: dict[str, Any] = {}

            # over the body limit: grpc refuses it before the relay reads a byte
            big = queued_send("x" * (MAX_BODY + 1))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.SendMessage(big, metadata=meta(caller))
            codes["oversized"] = caught.value.code()

            # bytes that are not a protobuf message at all
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await raw(b"\xff\xff\xff\xff\x0f", metadata=meta(caller))
            codes["malformed"] = caught.value.code()
            assert "not a valid SendMessageRequest" in (caught.value.details() or "")

            # a deadline already spent
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.SendMessage(queued_send("late"), metadata=meta(caller), timeout=0)
            codes["deadline"] = caught.value.code()

            # a credential nobody issued
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.SendMessage(queued_send("who"), metadata=meta("mln_forged"))
            codes["token"] = caught.value.code()

            assert codes == {
                "oversized": grpc.StatusCode.RESOURCE_EXHAUSTED,
                "malformed": grpc.StatusCode.INVALID_ARGUMENT,
                "deadline": grpc.StatusCode.DEADLINE_EXCEEDED,
                "token": grpc.StatusCode.UNAUTHENTICATED,
            }

            # unknown fields (field 111, as a future version might add) are skipped, as proto3 says
            wire = queued_send("from the future").SerializeToString() + b"\xfa\x06\x03abc"
            answer = a2a_pb2.SendMessageResponse.FromString(await raw(wire, metadata=meta(caller)))
            assert answer.task.id

            # and the relay answers as before, over gRPC and HTTP
            sent = await stub.SendMessage(queued_send("still here"), metadata=meta(caller))
            listed = await stub.ListTasks(
                a2a_pb2.ListTasksRequest(tenant=TENANT), metadata=meta(caller)
            )
            assert sent.task.id in [t.id for t in listed.tasks]
            assert len(listed.tasks) == 2  # nothing refused was stored

    run(go())
    assert httpx.get(f"{relay.url}/healthz").status_code == 200


def test_a_busy_grpc_port_stops_the_start_with_the_reason(db_url: str, tmp_path: Path) -> None:
    first = start_relay(db_url, tmp_path / "a", "--grpc-port", "0")
    try:
        port = grpc_target(first).rsplit(":", 1)[1]
        second = subprocess.run(
            [MELLAN, "relay", "--database", db_url, "--port", "0", "--grpc-port", port,
             "--owner-token-file", str(tmp_path / "b.token")],
            capture_output=True, text=True, timeout=60, env=relay_env(tmp_path / "b"),
        )  # fmt: skip
    finally:
        assert first.stop() == 0
    assert second.returncode == 1, second.stdout + second.stderr
    assert f"cannot listen for gRPC on 127.0.0.1:{port}" in second.stderr + second.stdout


def test_grpc_is_served_with_the_https_certificate(tmp_path: Path) -> None:
    """With --tls-cert/--tls-key the gRPC port speaks TLS with the same certificate: a
    client trusting the CA is answered, a plaintext one and one trusting another CA are not."""
    import trustme

    from relay_proc import wait_line
    from tls_kit import ca_file, server_pair, setup_agents

    ca = trustme.CA(organization_name="mellan grpc test CA")
    crt, key = server_pair(ca, tmp_path)
    cafile = ca_file(ca, tmp_path)
    relay = start_relay(
        f"sqlite://{tmp_path / 'relay.db'}", tmp_path,
        "--tls-cert", str(crt), "--tls-key", str(key), "--grpc-port", "0",
    )  # fmt: skip
    try:
        caller, _ = setup_agents(relay, cafile)
        target = grpc_target(relay)
        assert any("A2A over gRPC (TLS)" in line for line in relay.lines)
        other = trustme.CA().cert_pem.bytes()

        async def go() -> None:
            trusted = grpc.ssl_channel_credentials(root_certificates=cafile.read_bytes())
            async with grpc.aio.secure_channel(target, trusted) as channel:
                stub = a2a_pb2_grpc.A2AServiceStub(channel)
                sent = await stub.SendMessage(queued_send("over tls"), metadata=meta(caller))
                assert sent.task.id
            for channel in (
                grpc.aio.insecure_channel(target),
                grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(other)),
            ):
                async with channel:
                    stub = a2a_pb2_grpc.A2AServiceStub(channel)
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await stub.SendMessage(queued_send("no"), metadata=meta(caller))
                    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE

        run(go())

        # SIGHUP with a pair from another CA: new gRPC connections get it, as HTTPS does
        rotated = trustme.CA(organization_name="rotated grpc CA")
        new_ca = ca_file(rotated, tmp_path, "new.pem")
        server_pair(rotated, tmp_path)  # overwrites relay.crt / relay.key
        mark = len(relay.lines)
        relay.proc.send_signal(signal.SIGHUP)
        wait_line(relay, "certificate reloaded", mark)

        async def after() -> None:
            fresh = grpc.ssl_channel_credentials(root_certificates=new_ca.read_bytes())
            async with grpc.aio.secure_channel(target, fresh) as channel:
                stub = a2a_pb2_grpc.A2AServiceStub(channel)
                assert (
                    await stub.SendMessage(queued_send("rotated"), metadata=meta(caller))
                ).task.id
            stale = grpc.ssl_channel_credentials(root_certificates=cafile.read_bytes())
            async with grpc.aio.secure_channel(target, stale) as channel:
                stub = a2a_pb2_grpc.A2AServiceStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.SendMessage(queued_send("stale"), metadata=meta(caller))
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE

        run(after())
    finally:
        assert relay.stop() == 0


def test_a_send_over_the_limit_is_resource_exhausted_with_when_to_retry(
    db_url: str, tmp_path: Path
) -> None:
    relay = start_relay(
        db_url, tmp_path, "--grpc-port", "0", "--limits-burst", "1", "--limits-send-rate", "0.001"
    )
    try:
        caller, _ = setup_pair(relay)
        target = grpc_target(relay)

        async def go() -> None:
            async with grpc.aio.insecure_channel(target) as channel:
                stub = a2a_pb2_grpc.A2AServiceStub(channel)
                await stub.SendMessage(queued_send("first"), metadata=meta(caller))
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.SendMessage(queued_send("second"), metadata=meta(caller))
                err = caught.value
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                trailing = dict(err.trailing_metadata() or ())
                assert int(trailing["retry-after"]) > 0
                status = status_pb2.Status.FromString(trailing["grpc-status-details-bin"])
                info = error_details_pb2.ErrorInfo()
                assert status.details[0].Unpack(info)
                assert info.reason == "QUOTA_EXCEEDED"
                assert info.metadata["retryAfter"] == trailing["retry-after"]
                listed = await stub.ListTasks(
                    a2a_pb2.ListTasksRequest(tenant=TENANT), metadata=meta(caller)
                )
                assert len(listed.tasks) == 1  # nothing was stored for the refused send

        run(go())
    finally:
        assert relay.stop() == 0
