"""The A2A wire as bytes: version and content-type rules, error shapes, cards, SSE, fidelity.

These use plain HTTP so they can check what an SDK would hide: exact status codes, the
order of checks, the JSON text of payloads, and the SSE framing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from a2a_kit import RECEIVER, WS, Server, World, message, running

ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, World]]:
    db = tmp_path_factory.mktemp("a2a-wire") / "relay.db"
    with running(f"sqlite://{db}") as (server, world, rx):
        assert rx is not None
        yield server, world


def auth(world: World, version: str | None = "1.0", **extra: str) -> dict[str, str]:
    h = {"Authorization": f"Bearer {world.tokens['caller']}", **extra}
    if version is not None:
        h["A2A-Version"] = version
    return h


def rpc_body(method: str, params: dict[str, Any], rid: Any = 1) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode()


def post(url: str, body: bytes, headers: dict[str, str], ctype: str = "application/json") -> Any:
    return httpx.post(url, content=body, headers={"Content-Type": ctype, **headers}, timeout=30)


# -- version and content type ------------------------------------------------------------------


def test_missing_version_is_0_3_and_refused(relay: tuple[Server, World]) -> None:
    server, world = relay
    r = post(server.base(), rpc_body("GetTask", {"id": "x"}, 5), auth(world, None))
    assert r.status_code == 200
    err = r.json()["error"]
    assert r.json()["id"] == 5
    assert err["code"] == -32009
    assert "'0.3'" in err["message"]
    assert err["data"][0]["@type"] == ERROR_INFO
    assert err["data"][0]["reason"] == "VERSION_NOT_SUPPORTED"
    r = httpx.get(f"{server.base()}/tasks/x", headers=auth(world, None), timeout=30)
    assert r.status_code == 400
    status = r.json()["error"]
    assert status["status"] == "FAILED_PRECONDITION"
    assert status["details"][0]["reason"] == "VERSION_NOT_SUPPORTED"
    # the query-parameter form is accepted too
    r = httpx.get(f"{server.base()}/tasks/x?A2A-Version=1.0", headers=auth(world, None))
    assert r.status_code == 404


def test_content_type_is_checked_before_the_body_is_parsed(relay: tuple[Server, World]) -> None:
    server, world = relay
    r = post(server.base(), b"not json at all", auth(world), ctype="text/plain")
    assert r.json()["error"]["code"] == -32005
    r = post(f"{server.base()}/message:send", b"not json", auth(world), ctype="text/plain")
    assert r.status_code == 415
    assert r.json()["error"]["details"][0]["reason"] == "CONTENT_TYPE_NOT_SUPPORTED"
    ok = post(
        f"{server.base()}/message:send",
        json.dumps({"message": message("echo a2a+json")}).encode(),
        auth(world),
        ctype="application/a2a+json; charset=utf-8",
    )
    assert ok.status_code == 200


def test_jsonrpc_envelope_errors(relay: tuple[Server, World]) -> None:
    server, world = relay
    cases = [
        (b"{not json", -32700, None),
        (b"[]", -32600, None),
        (b'{"jsonrpc":"1.0","id":3,"method":"GetTask"}', -32600, 3),
        (b'{"jsonrpc":"2.0","id":4,"method":"tasks/get","params":{"id":"x"}}', -32601, 4),
        (b'{"jsonrpc":"2.0","id":"s","method":"GetTask","params":[1]}', -32600, "s"),
        (b'{"jsonrpc":"2.0","id":6,"method":"GetTask","params":{}}', -32602, 6),
        (b'{"jsonrpc":"2.0","id":7,"method":"GetTask","params":{"id":"x","id":"y"}}', -32700, None),
    ]
    for body, code, rid in cases:
        r = post(server.base(), body, auth(world))
        assert r.status_code == 200, body
        assert r.json()["error"]["code"] == code, body
        assert r.json()["id"] == rid, body


def test_rest_unknown_path_and_method(relay: tuple[Server, World]) -> None:
    server, world = relay
    r = httpx.get(f"{server.base()}/message:send", headers=auth(world))
    assert r.status_code == 404
    assert r.json()["error"]["details"][0]["reason"] == "METHOD_NOT_FOUND"
    # push configs of a task that is not there (or not the caller's): as for the task
    r = httpx.delete(f"{server.base()}/tasks/x/pushNotificationConfigs/c", headers=auth(world))
    assert r.status_code == 404
    assert r.json()["error"]["details"][0]["reason"] == "TASK_NOT_FOUND"
    r = httpx.put(f"{server.base()}/tasks/x/pushNotificationConfigs/c", headers=auth(world))
    assert r.status_code == 404
    assert r.json()["error"]["details"][0]["reason"] == "METHOD_NOT_FOUND"
    # a push URL the workspace may not use is refused at the door, naming the rule
    r = post(
        f"{server.base()}/message:send",
        json.dumps(
            {
                "message": message("echo"),
                "configuration": {"taskPushNotificationConfig": {"url": "http://10.0.0.1/h"}},
            }
        ).encode(),
        auth(world),
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["details"][0]["reason"] == "INVALID_PARAMS"
    assert error["details"][0]["metadata"]["rule"] == "plain-http"
    assert "configuration.taskPushNotificationConfig.url" in error["message"]


def test_invalid_message_names_the_field(relay: tuple[Server, World]) -> None:
    server, world = relay
    bad = message("x")
    bad["parts"] = [{"text": "a", "data": {}}]
    r = post(f"{server.base()}/message:send", json.dumps({"message": bad}).encode(), auth(world))
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["details"][0]["reason"] == "INVALID_PARAMS"
    assert err["details"][1]["fieldViolations"][0]["field"] == "message.parts[0]"


# -- cards -------------------------------------------------------------------------------------


def test_public_card_is_cacheable_and_the_same_for_unknown_agents(
    relay: tuple[Server, World],
) -> None:
    server, _ = relay
    r = httpx.get(f"{server.base()}/.well-known/agent-card.json")
    assert r.status_code == 200
    assert "max-age=" in r.headers["cache-control"]
    tag = r.headers["etag"]
    again = httpx.get(
        f"{server.base()}/.well-known/agent-card.json", headers={"If-None-Match": tag}
    )
    assert again.status_code == 304
    assert again.headers["etag"] == tag
    card = r.json()
    assert card["skills"] == []
    assert [i["url"] for i in card["supportedInterfaces"]] == [server.base()] * 2
    ghost = httpx.get(f"{server.url}/a2a/{WS}/no/such/.well-known/agent-card.json").json()
    assert ghost.keys() == card.keys()
    assert ghost["skills"] == []
    encoded = httpx.get(
        f"{server.url}/a2a/{WS}/{RECEIVER.replace('/', '%2F')}/.well-known/agent-card.json"
    )
    assert encoded.json() == card


def test_extended_card_needs_a_credential_and_has_an_etag(relay: tuple[Server, World]) -> None:
    server, world = relay
    r = httpx.get(f"{server.base()}/extendedAgentCard", headers={"A2A-Version": "1.0"})
    assert r.status_code == 401
    r = httpx.get(f"{server.base()}/extendedAgentCard", headers=auth(world))
    assert r.status_code == 200
    assert r.headers["cache-control"].startswith("private")
    assert [s["id"] for s in r.json()["skills"]] == ["incident.inspect"]
    again = httpx.get(
        f"{server.base()}/extendedAgentCard",
        headers={**auth(world), "If-None-Match": r.headers["etag"]},
    )
    assert again.status_code == 304


# -- fidelity and SSE ----------------------------------------------------------------------


PAYLOAD = (
    b'{"message":{"messageId":"fid-1","role":"ROLE_USER","parts":[{"text":"mirror"},'
    b'{"data":{"n":12345678901234567890,"f":0.10000000000000000001,"e":1E+400,"neg":-0.0,'
    b'"s":"\\u00fc\\ud83d\\ude00","deep":[[[{"x":null}]]]},"mediaType":"application/json",'
    b'"metadata":{"big":98765432109876543210987}}],"metadata":{"k":[1,2.50,true]}}}'
)


def test_payload_comes_back_with_the_same_values(relay: tuple[Server, World]) -> None:
    server, world = relay
    r = post(f"{server.base()}/message:send", PAYLOAD, auth(world))
    assert r.status_code == 200, r.text
    text = r.text
    # exact numbers as digits, not floats
    for literal in ("12345678901234567890", "0.10000000000000000001", "1E+400", "-0.0",
                    "98765432109876543210987", "2.50"):  # fmt: skip
        assert literal in text, literal
    task = r.json()["task"]
    sent = json.loads(PAYLOAD)["message"]
    assert task["artifacts"][0]["parts"] == sent["parts"]
    assert task["history"][0]["parts"] == sent["parts"]
    assert task["artifacts"][0]["metadata"] == sent["metadata"]
    got = httpx.get(f"{server.base()}/tasks/{task['id']}", headers=auth(world)).text
    assert "12345678901234567890" in got
    assert "0.10000000000000000001" in got


def sse_events(resp: httpx.Response) -> list[Any]:
    events = []
    for block in resp.text.split("\n\n"):
        lines = [ln for ln in block.split("\n") if ln and not ln.startswith(":")]
        if lines:
            assert all(ln.startswith("data: ") for ln in lines), lines
            events.append(json.loads("".join(ln[6:] for ln in lines)))
    return events


@pytest.mark.parametrize("binding", ["rest", "jsonrpc"])
def test_stream_framing(relay: tuple[Server, World], binding: str) -> None:
    server, world = relay
    params = {"message": message("steps 2")}
    if binding == "rest":
        url, body = f"{server.base()}/message:stream", json.dumps(params).encode()
    else:
        url, body = server.base(), rpc_body("SendStreamingMessage", params, "s1")
    r = post(url, body, auth(world))
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    if binding == "jsonrpc":
        assert all(e["id"] == "s1" and e["jsonrpc"] == "2.0" for e in events)
        events = [e["result"] for e in events]
    assert list(events[0]) == ["task"]
    assert all(len(e) == 1 for e in events)
    assert "final" not in r.text
    last = events[-1]["statusUpdate"]["status"]
    assert last["state"] == "TASK_STATE_COMPLETED"
    assert last["message"]["parts"] == [{"text": "2 steps done"}]


def _listen(
    method: str, url: str, headers: dict[str, str], events: list[Any], first: threading.Event
) -> None:
    with httpx.stream(method, url, headers=headers, timeout=60) as s:
        for line in s.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                first.set()


def test_subscribe_accepts_get_and_post_and_stays_open_through_input_required(
    relay: tuple[Server, World],
) -> None:
    """A subscription to a task waiting for input stays open: it sees the caller's answer
    start the next turn of the *same* task, and closes on the terminal state, which its
    last event carries."""
    server, world = relay
    for method in ("GET", "POST"):
        r = post(
            f"{server.base()}/message:send",
            json.dumps({"message": message("ask")}).encode(),
            auth(world),
        )
        task = r.json()["task"]
        assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        events: list[Any] = []
        first = threading.Event()
        url = f"{server.base()}/tasks/{task['id']}:subscribe"
        listener = threading.Thread(target=_listen, args=(method, url, auth(world), events, first))
        listener.start()
        assert first.wait(30), "no snapshot"
        answer = message("echo the blue one", taskId=task["id"])
        r = post(
            f"{server.base()}/message:send", json.dumps({"message": answer}).encode(), auth(world)
        )
        assert r.status_code == 200, r.text
        done = r.json()["task"]
        assert done["id"] == task["id"]  # the same task, its next turn
        assert done["status"]["state"] == "TASK_STATE_COMPLETED"
        listener.join(timeout=60)
        assert not listener.is_alive()
        assert events[0]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
        states = [e["statusUpdate"]["status"]["state"] for e in events if "statusUpdate" in e]
        assert "TASK_STATE_INPUT_REQUIRED" not in states[-1:]


def test_history_length(relay: tuple[Server, World]) -> None:
    server, world = relay
    r = post(
        f"{server.base()}/message:send",
        json.dumps({"message": message("echo h"), "configuration": {"historyLength": 0}}).encode(),
        auth(world),
    )
    task = r.json()["task"]
    assert "history" not in task
    url = f"{server.base()}/tasks/{task['id']}"
    whole = httpx.get(url, headers=auth(world)).json()
    # the answer is the status message, and history what came before it: the caller's
    assert [m["role"] for m in whole["history"]] == ["ROLE_USER"]
    assert whole["status"]["message"]["role"] == "ROLE_AGENT"
    one = httpx.get(url, params={"historyLength": 1}, headers=auth(world)).json()["history"]
    assert [m["role"] for m in one] == ["ROLE_USER"]


def test_sse_frames_keepalive_and_a_late_error() -> None:
    import asyncio

    from melchior.mellan.relay.surfaces.a2a import sse
    from melchior.mellan.relay.surfaces.a2a.errors import TaskNotFound

    async def events() -> Any:
        yield {"task": {"id": "t"}}
        await asyncio.sleep(0.2)
        yield sse.QUIET  # looked, nothing new (a stream's source does so every poll interval)
        raise TaskNotFound(metadata={"taskId": "t"})

    async def collect() -> bytes:
        chunks = []
        async for chunk in sse._frames(events(), sse.BARE, lambda e: e.rest_body(), 0.01):
            chunks.append(chunk)
        return b"".join(chunks)

    out = asyncio.run(collect()).decode()
    assert out.startswith('data: {"task":{"id":"t"}}\n\n')
    assert ": keepalive\n\n" in out
    tail = out.rsplit("\n\n", 2)[-2]
    assert tail.startswith("event: error\ndata: ")
    assert json.loads(tail.split("data: ", 1)[1])["error"]["code"] == 404


def test_work_waits_queued_while_the_receiver_is_offline(tmp_path: Any) -> None:
    from a2a_kit import Receiver

    with running(f"sqlite://{tmp_path / 'r.db'}", receiver=False) as (server, world, _):
        body = {"message": message("echo later"), "configuration": {"returnImmediately": True}}
        r = post(f"{server.base()}/message:send", json.dumps(body).encode(), auth(world))
        task = r.json()["task"]
        assert task["status"]["state"] == "TASK_STATE_SUBMITTED"
        url = f"{server.base()}/tasks/{task['id']}:subscribe"
        with httpx.stream("POST", url, headers=auth(world), timeout=60) as s:
            lines = s.iter_lines()
            first = json.loads(next(ln for ln in lines if ln.startswith("data:"))[5:])
            assert first["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
            rx = Receiver(server.url, world.tokens["receiver"])  # the destination comes online
            try:
                events = [json.loads(ln[5:]) for ln in lines if ln.startswith("data:")]
            finally:
                rx.stop()
        states = [e["statusUpdate"]["status"]["state"] for e in events if "statusUpdate" in e]
        arts = [
            e["artifactUpdate"]["artifact"]["artifactId"] for e in events if "artifactUpdate" in e
        ]
        assert arts == ["echo"]
        assert states[-1] == "TASK_STATE_COMPLETED"
        assert set(states) <= {"TASK_STATE_WORKING", "TASK_STATE_COMPLETED"}


def test_list_filters(relay: tuple[Server, World]) -> None:
    server, world = relay
    ctx = "ctx-filters"
    for text in ("echo a", "fail", "ask"):
        body = {"message": message(text, contextId=ctx)}
        r = post(f"{server.base()}/message:send", json.dumps(body).encode(), auth(world))
        assert r.is_success, r.text
    url = f"{server.base()}/tasks"

    def listed(**params: Any) -> Any:
        return httpx.get(url, params={"contextId": ctx, **params}, headers=auth(world)).json()

    every = listed()
    assert every["totalSize"] == 3
    assert every["nextPageToken"] == ""
    assert all("artifacts" not in t and "history" not in t for t in every["tasks"])
    failed = listed(status="TASK_STATE_FAILED")
    assert [t["status"]["state"] for t in failed["tasks"]] == ["TASK_STATE_FAILED"]
    assert failed["totalSize"] == 1
    rich = listed(status="TASK_STATE_COMPLETED", includeArtifacts="true", historyLength=1)
    (task,) = rich["tasks"]
    assert task["artifacts"][0]["parts"] == [{"text": "echo: a"}]
    assert [m["role"] for m in task["history"]] == ["ROLE_USER"]  # the answer: status
    assert task["status"]["message"]["role"] == "ROLE_AGENT"
    assert listed(status="TASK_STATE_REJECTED")["tasks"] == []
    assert listed(statusTimestampAfter="2999-01-01T00:00:00Z")["totalSize"] == 0
