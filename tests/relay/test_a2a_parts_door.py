"""The Part rule at the relay's door (docs/a2a.md, "Parts"), over every binding: a ``raw``
that is not base64 is refused naming the field and queues nothing; what ProtoJSON lets a
caller send (URL-safe or unpadded base64, ``null`` for an absent field, the proto name)
is accepted and reaches the receiver as sent.

gRPC carries ``raw`` as bytes, so it cannot carry one that is not base64: there, every
byte value arrives intact, and a part the binding *can* get wrong (no content at all) is
refused by the same rule, by name, with nothing queued.

A real relay (the production app under uvicorn, gRPC in its lifespan) and a real receiver
loop on the receiver API (``tests/a2a_kit.py``; its ``mirror`` answers with the parts it
was given).
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from a2a.types import a2a_pb2, a2a_pb2_grpc
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2, status_pb2

from a2a_kit import CAPS, RECEIVER, WS, Receiver, Server, World, message, running

H = {"A2A-Version": "1.0", "content-type": "application/json"}
TENANT = f"{WS}/{RECEIVER}"
BAD_RAW = {"raw": "not base64!", "filename": "f.bin", "mediaType": "application/octet-stream"}


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, World, Receiver]]:
    db = tmp_path_factory.mktemp("parts-door") / "relay.db"
    with running(f"sqlite://{db}", grpc=True) as (server, world, rx):
        assert rx is not None
        yield server, world, rx
        assert not rx.errors, rx.errors


def auth(world: World) -> dict[str, str]:
    return {**H, "Authorization": f"Bearer {world.tokens['caller']}"}


def rpc(server: Server, world: World, params: dict[str, Any]) -> Any:
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params}
    return httpx.post(server.base(), json=body, headers=auth(world), timeout=60).json()


def rest(server: Server, world: World, params: dict[str, Any]) -> httpx.Response:
    url = f"{server.base()}/message:send"
    return httpx.post(url, json=params, headers=auth(world), timeout=60)


def tasks(server: Server) -> int:
    return len(server.store.list_tasks(WS, limit=500))


def with_parts(*parts: dict[str, Any]) -> dict[str, Any]:
    return message("mirror", parts=[{"text": "mirror"}, *parts])


def test_a_raw_that_is_not_base64_is_refused_by_name_over_json_rpc(
    relay: tuple[Server, World, Receiver],
) -> None:
    server, world, rx = relay
    before, handled = tasks(server), len(rx.handled)
    err = rpc(server, world, {"message": with_parts(BAD_RAW)})["error"]
    assert err["code"] == -32602
    assert err["message"].startswith("message.parts[1].raw: must be its bytes in base64")
    assert err["data"][1]["fieldViolations"][0]["field"] == "message.parts[1].raw"
    assert (tasks(server), len(rx.handled)) == (before, handled)


def test_a_raw_that_is_not_base64_is_refused_by_name_over_http_json(
    relay: tuple[Server, World, Receiver],
) -> None:
    server, world, rx = relay
    before, handled = tasks(server), len(rx.handled)
    for bad in ("not base64!", "QQ=", "a+b_", "Zm9v\nYmFy"):
        r = rest(server, world, {"message": with_parts({**BAD_RAW, "raw": bad})})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["status"] == "INVALID_ARGUMENT"
        assert error["details"][1]["fieldViolations"][0]["field"] == "message.parts[1].raw"
        assert "message.parts[1].raw" in error["message"]
    assert (tasks(server), len(rx.handled)) == (before, handled)


def test_what_protojson_lets_a_caller_send_is_accepted_and_carried_as_sent(
    relay: tuple[Server, World, Receiver],
) -> None:
    server, world, _ = relay
    blob = bytes([0xFB, 0xFF, 0xBF, 0x00, 0x3E])  # '+' and '/' in standard base64
    url_safe = base64.urlsafe_b64encode(blob).decode().rstrip("=")
    assert "-" in url_safe or "_" in url_safe
    parts = [
        {"raw": url_safe, "filename": "a.bin", "text": None},  # a null kind is absent
        {"raw": base64.b64encode(blob).decode(), "media_type": "image/png"},
        {"data": None, "metadata": None, "filename": None},  # data's null is a value
        {"url": "https://example.com/f", "kind": "file"},  # a field A2A does not define
    ]
    as_stored = [*parts]
    as_stored[1] = {"raw": parts[1]["raw"], "mediaType": "image/png"}  # ProtoJSON's name
    r = rest(server, world, {"message": with_parts(*parts)})
    assert r.status_code == 200, r.text
    got = rpc(server, world, {"message": with_parts(*parts)})["result"]["task"]
    for task in (r.json()["task"], got):
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"
        assert task["artifacts"][0]["parts"][1:] == as_stored


def _grpc_message(*parts: a2a_pb2.Part) -> a2a_pb2.SendMessageRequest:
    m = a2a_pb2.Message(
        role=a2a_pb2.ROLE_USER,
        message_id=uuid.uuid4().hex,
        parts=[a2a_pb2.Part(text="mirror"), *parts],
    )
    meta_struct = struct_pb2.Struct()
    meta_struct.update({"capability": CAPS[0]})
    m.metadata.CopyFrom(meta_struct)
    return a2a_pb2.SendMessageRequest(tenant=TENANT, message=m)


async def _grpc_send(server: Server, world: World, req: a2a_pb2.SendMessageRequest) -> Any:
    assert server.relay.grpc is not None
    metadata = (("authorization", f"Bearer {world.tokens['caller']}"), ("a2a-version", "1.0"))
    async with grpc.aio.insecure_channel(server.relay.grpc.target) as channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)
        try:
            return await asyncio.wait_for(stub.SendMessage(req, metadata=metadata), 60)
        except grpc.aio.AioRpcError as exc:
            return exc


def _violations(err: grpc.aio.AioRpcError) -> list[str]:
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                bad = error_details_pb2.BadRequest()
                if detail.Unpack(bad):
                    return [v.field for v in bad.field_violations]
    raise AssertionError(f"no field violations in {err!r}")


def test_over_grpc_raw_bytes_arrive_intact_and_a_part_without_content_is_refused_by_name(
    relay: tuple[Server, World, Receiver],
) -> None:
    server, world, rx = relay
    blob = bytes(range(256))
    done = asyncio.run(_grpc_send(server, world, _grpc_message(a2a_pb2.Part(raw=blob))))
    assert isinstance(done, a2a_pb2.SendMessageResponse), done
    assert done.task.artifacts[0].parts[1].raw == blob

    before, handled = tasks(server), len(rx.handled)
    empty = a2a_pb2.Part(filename="f.bin", media_type="application/octet-stream")
    err = asyncio.run(_grpc_send(server, world, _grpc_message(empty)))
    assert isinstance(err, grpc.aio.AioRpcError), err
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _violations(err) == ["message.parts[1]"]
    assert "exactly one of text, raw, url, data" in (err.details() or "")
    assert (tasks(server), len(rx.handled)) == (before, handled)
