"""A2A 1.0 to the letter: idempotency by messageId, ProtoJSON names, direct replies,
card caching, numbers exactly as written, and stream hardening.

A real relay (the production app under uvicorn on loopback) and a real receiver loop on
the receiver API (``tests/a2a_kit.py``) serve every task; requests are raw HTTP so the
exact bytes on the wire can be checked.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime, parsedate_to_datetime
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from a2a_kit import WS, Receiver, Server, World, message, running
from melchior.mellan.client.receiver import ReceiverClient

H = {"A2A-Version": "1.0", "content-type": "application/json"}


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, World, Receiver]]:
    db = tmp_path_factory.mktemp("conformance") / "relay.db"
    with running(f"sqlite://{db}") as (server, world, rx):
        assert rx is not None
        yield server, world, rx
        assert not rx.errors, rx.errors


def send(server: Server, world: World, body: dict[str, Any], who: str = "caller") -> Any:
    headers = {**H, "Authorization": f"Bearer {world.tokens[who]}"}
    return httpx.post(f"{server.base()}/message:send", json=body, headers=headers, timeout=60)


def rpc(server: Server, world: World, method: str, params: dict[str, Any]) -> Any:
    headers = {**H, "Authorization": f"Bearer {world.tokens['caller']}"}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return httpx.post(server.base(), json=body, headers=headers, timeout=60).json()


def count_tasks(server: Server) -> int:
    return len(server.store.list_tasks(WS, limit=500))


# -- idempotency by messageId -------------------------------------------------------------------


def test_a_resend_returns_the_same_task_and_queues_nothing(
    relay: tuple[Server, World, Receiver],
) -> None:
    server, world, rx = relay
    m = message("echo once")
    first = send(server, world, {"message": m}).json()["task"]
    before = count_tasks(server)
    again = send(server, world, {"message": m}).json()["task"]
    assert again["id"] == first["id"]
    assert count_tasks(server) == before
    assert rx.handled.count(first["id"]) == 1
    # the same for an answer to a task that asked for input (a turn is not run twice)
    asked = send(server, world, {"message": message("ask")}).json()["task"]
    answer = message("echo blue", taskId=asked["id"])
    done = send(server, world, {"message": answer}).json()["task"]
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    resent = send(server, world, {"message": answer})
    assert resent.status_code == 200, resent.text
    assert resent.json()["task"]["id"] == asked["id"]
    assert rx.handled.count(asked["id"]) == 2  # two turns, each run once


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"parts": [{"text": "echo something else"}]}, "other content"),
        ({"contextId": "another-context"}, "another contextId"),
    ],
)
def test_a_message_id_reused_for_something_else_is_refused_by_name(
    relay: tuple[Server, World, Receiver], change: dict[str, Any], named: str
) -> None:
    server, world, _ = relay
    m = message("echo original")
    first = send(server, world, {"message": m})
    assert first.status_code == 200
    before = count_tasks(server)
    r = send(server, world, {"message": {**m, **change}})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    assert named in error["message"]
    assert "messageId" in error["message"]
    assert count_tasks(server) == before
    err = rpc(server, world, "SendMessage", {"message": {**m, **change}})["error"]
    assert err["code"] == -32602
    assert named in err["message"]


def test_a_message_id_reused_with_another_task_id_is_refused(
    relay: tuple[Server, World, Receiver],
) -> None:
    server, world, _ = relay
    asked = send(server, world, {"message": message("ask")}).json()["task"]
    m = message("echo first")
    send(server, world, {"message": m})
    r = send(server, world, {"message": {**m, "taskId": asked["id"]}})
    assert r.status_code == 400, r.text
    assert "another taskId" in r.json()["error"]["message"]
    still = httpx.get(
        f"{server.base()}/tasks/{asked['id']}",
        headers={**H, "Authorization": f"Bearer {world.tokens['caller']}"},
    ).json()
    assert still["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"  # nothing moved


# -- field names in both spellings --------------------------------------------------------------


def test_snake_case_fields_are_read_as_protojson_requires(
    relay: tuple[Server, World, Receiver],
) -> None:
    server, world, _ = relay
    snake = {
        "message_id": secrets.token_hex(8),
        "role": "ROLE_USER",
        "parts": [{"text": "echo snake", "media_type": "text/plain"}],
    }
    task = send(server, world, {"message": snake, "configuration": {"history_length": 1}})
    assert task.status_code == 200, task.text
    body = task.json()["task"]
    assert len(body["history"]) == 1  # history_length honoured
    stored = server.store.get_task(WS, body["id"])
    assert stored is not None
    assert '"messageId"' in stored.payload
    assert '"mediaType":"text/plain"' in stored.payload  # stored as ProtoJSON writes it
    got = rpc(server, world, "GetTask", {"id": body["id"], "history_length": 1})["result"]
    assert len(got["history"]) == 1
    listed = rpc(server, world, "ListTasks", {"page_size": 1})["result"]
    assert len(listed["tasks"]) == 1
    assert listed["nextPageToken"]
    rest = httpx.get(
        f"{server.base()}/tasks",
        params={"page_size": "1", "history_length": "0"},
        headers={**H, "Authorization": f"Bearer {world.tokens['caller']}"},
    ).json()
    assert len(rest["tasks"]) == 1
    both = rpc(
        server, world, "GetTask", {"id": body["id"], "historyLength": 1, "history_length": 2}
    )
    assert both["error"]["code"] == -32602
    assert "given twice" in both["error"]["message"]


# -- direct replies -------------------------------------------------------------------------------


def test_an_agent_may_answer_with_a_message_and_no_task(
    relay: tuple[Server, World, Receiver],
) -> None:
    server, world, _ = relay
    r = send(server, world, {"message": message("say hello there")})
    assert r.status_code == 200, r.text
    reply = r.json()["message"]
    assert "task" not in r.json()
    assert reply["role"] == "ROLE_AGENT"
    assert reply["parts"] == [{"text": "hello there"}]
    assert "taskId" not in reply
    assert reply["contextId"]
    err = rpc(server, world, "SendMessage", {"message": message("say again")})
    assert err["result"]["message"]["parts"] == [{"text": "again"}]


# -- cards ----------------------------------------------------------------------------------------


def test_cards_carry_last_modified_and_answer_304(relay: tuple[Server, World, Receiver]) -> None:
    server, world, _ = relay
    url = f"{server.base()}/.well-known/agent-card.json"
    first = httpx.get(url)
    modified = first.headers["Last-Modified"]
    assert parsedate_to_datetime(modified) <= datetime.now(UTC)
    tag = first.headers["ETag"]
    assert httpx.get(url, headers={"If-None-Match": tag}).status_code == 304
    assert httpx.get(url, headers={"If-Modified-Since": modified}).status_code == 304
    older = format_datetime(parsedate_to_datetime(modified) - timedelta(days=1), usegmt=True)
    assert httpx.get(url, headers={"If-Modified-Since": older}).status_code == 200
    assert httpx.get(url, headers={"If-Modified-Since": "not a date"}).status_code == 200
    # If-None-Match decides when both are sent (a stale tag beats a fresh date)
    both = {"If-None-Match": '"stale"', "If-Modified-Since": modified}
    assert httpx.get(url, headers=both).status_code == 200
    ext = f"{server.base()}/extendedAgentCard"
    auth = {"A2A-Version": "1.0", "Authorization": f"Bearer {world.tokens['caller']}"}
    card = httpx.get(ext, headers=auth)
    assert card.status_code == 200
    assert (
        httpx.get(ext, headers={**auth, "If-None-Match": card.headers["ETag"]}).status_code == 304
    )
    since = card.headers["Last-Modified"]
    assert httpx.get(ext, headers={**auth, "If-Modified-Since": since}).status_code == 304


# -- numbers exactly as written -------------------------------------------------------------------

SPELLINGS = st.one_of(
    st.from_regex(r"-?(0|[1-9][0-9]{0,30})(\.[0-9]{1,20})?([eE][+-]?[0-9]{1,4})?", fullmatch=True),
    st.sampled_from(["6.02e23", "-1.5e-7", "1e400", "-0", "-0.0", "1E+2", "0.10", "1.0E-400"]),
)
VALUES = st.recursive(
    st.one_of(SPELLINGS, st.sampled_from(["true", "false", "null", '"x"', '"é\\u00e9"'])),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]"),
        st.lists(
            st.tuples(st.sampled_from(["a", "b", "c"]), inner), max_size=3, unique_by=lambda t: t[0]
        ).map(lambda kv: "{" + ",".join(f'"{k}":{v}' for k, v in kv) + "}"),
    ),
    max_leaves=8,
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=VALUES)
def test_any_json_a_caller_sends_comes_back_spelled_exactly_as_sent(
    relay: tuple[Server, World, Receiver], data: str
) -> None:
    """A ``data`` part's JSON text (numbers in every spelling) is byte-identical in the
    payload the receiver claims and in the task the caller reads back."""
    server, world, _ = relay
    canonical = _respell(data)  # the sender's own spelling, whitespace-free
    mid = secrets.token_hex(8)
    body = (
        '{"message":{"messageId":"' + mid + '","role":"ROLE_USER","parts":[{"text":"mirror"},'
        '{"data":' + data + "}]},"
        '"configuration":{"returnImmediately":true}}'
    )
    headers = {**H, "Authorization": f"Bearer {world.tokens['caller']}"}
    r = httpx.post(f"{server.base()}/message:send", content=body.encode(), headers=headers)
    assert r.status_code == 200, r.text
    assert canonical in r.text
    tid = r.json()["task"]["id"]
    stored = server.store.get_task(WS, tid)
    assert stored is not None
    assert canonical in stored.payload
    # the view the caller reads, once the receiver has mirrored the parts back
    for _ in range(200):
        got = httpx.get(f"{server.base()}/tasks/{tid}", headers=headers)
        if '"TASK_STATE_COMPLETED"' in got.text:
            break
    assert got.text.count(canonical) >= 2  # in the history and in the mirrored artifact


def _respell(data: str) -> str:
    """``data`` as the relay writes it: whitespace-free, every number as spelled, strings
    as UTF-8 (escapes of non-ASCII characters written as the characters)."""
    from melchior.mellan.rawjson import decode, encode

    return encode(decode(data))


def test_the_receiver_claims_the_payload_spelled_as_sent(tmp_path: Any) -> None:
    with running(f"sqlite://{tmp_path / 'r.db'}", receiver=False) as (server, world, _):
        body = (
            '{"message":{"messageId":"n1","role":"ROLE_USER","parts":[{"data":'
            '{"a":6.02e23,"b":-1.5e-7,"c":1e400,"d":-0,"e":12345678901234567890}}]},'
            '"configuration":{"returnImmediately":true}}'
        )
        headers = {**H, "Authorization": f"Bearer {world.tokens['caller']}"}
        assert httpx.post(f"{server.base()}/message:send", content=body, headers=headers).is_success
        claim = httpx.post(
            f"{server.url}/api/receiver/claim",
            json={"wait": 5},
            headers={"Authorization": f"Bearer {world.tokens['receiver']}"},
        )
        assert '{"a":6.02e23,"b":-1.5e-7,"c":1e400,"d":-0,"e":12345678901234567890}' in claim.text
        with ReceiverClient(server.url, world.tokens["receiver"]) as rc:
            assert rc.claim(wait=0) == []  # nothing left: one claim took it


# -- stream hardening -----------------------------------------------------------------------------


def test_line_separators_are_escaped_in_sse_data_lines(
    relay: tuple[Server, World, Receiver],
) -> None:
    server, world, _ = relay
    headers = {**H, "Authorization": f"Bearer {world.tokens['caller']}"}
    body = {"message": message("echo a\u2028b\u2029c")}
    with httpx.stream(
        "POST", f"{server.base()}/message:stream", json=body, headers=headers, timeout=60
    ) as s:
        raw = b"".join(s.iter_bytes())
    assert "\u2028".encode() not in raw
    assert "\u2029".encode() not in raw
    assert b"\\u2028" in raw
    events = [
        json.loads(line[6:]) for line in raw.decode().split("\n") if line.startswith("data: ")
    ]
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    texts = json.dumps(events, ensure_ascii=False)
    assert "echo: a\u2028b\u2029c" in texts
