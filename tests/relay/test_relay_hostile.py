"""Hostile input at every surface of a running relay: refused fast and by name, nothing stored.

A hostile agent holds a valid credential and writes what JSON allows and a relay must not
carry: integers spelled ``1e1000000`` (converting one to an int would stall the event
loop for seconds), lone surrogates (valid JSON, not Unicode), malformed query integers,
bodies that are not UTF-8 JSON or never arrive, headers past the limit. Each is sent over
real HTTP to a real ``mellan relay`` process on both backends; each answer is checked for
its status and its words, and the relay's state is compared before and after.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from a2a_kit import pg_database
from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.base import Store
from relay_proc import RelayProc, enqueue, setup_pair, start_relay

HUGE = "1e1000000"  # before the fix: ~20 s of one CPU on the event loop, per request
ENORMOUS = "1e100000000000"  # before the fix: a MemoryError, answered 500
A2A = {"A2A-Version": "1.0", "content-type": "application/json"}
JSON_TYPE = {"content-type": "application/json"}
ADDR = "/a2a/default/private/ops"


@dataclass
class Hostile:
    relay: RelayProc
    store: Store
    caller: str
    receiver: str

    def post(
        self, token: str | None, path: str, text: str | bytes, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        body = text.encode("utf-8") if isinstance(text, str) else text
        with self.relay.client(token) as c:
            return c.post(path, content=body, headers=JSON_TYPE if headers is None else headers)

    def rpc(self, method: str, params: str) -> dict[str, Any]:
        text = f'{{"jsonrpc":"2.0","id":7,"method":"{method}","params":{params}}}'
        r = self.post(self.caller, ADDR, text, A2A)
        assert r.status_code == 200, r.text
        reply: dict[str, Any] = r.json()
        return reply

    def snapshot(self) -> Any:
        """Everything a refused request must leave as it was."""
        ws = "default"
        tasks = self.store.list_tasks(ws, limit=500)
        return (
            [
                (t.id, t.state, t.attempt, t.lease_epoch, t.lease_expires_at, t.result)
                for t in tasks
            ],
            [len(self.store.events_after(t.id)) for t in tasks],
            [(a.id, a.description, a.capabilities) for a in self.store.list_agents(ws)],
            [(g.id, g.revoked_at) for g in self.store.list_grants(ws, include_revoked=True)],
            [(r.seq, r.action) for r in self.store.audit_since(ws, 0, 1000) if r.allowed],
        )


@pytest.fixture(
    scope="module",
    params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)],
)
def hostile(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Hostile]:
    home = tmp_path_factory.mktemp("hostile")
    database = (
        contextlib.nullcontext(f"sqlite://{home / 'relay.db'}")
        if request.param == "sqlite"
        else pg_database()
    )
    with database as url:
        relay = start_relay(url, home, "--body-timeout", "1")
        store = open_store(url)
        try:
            caller, receiver = setup_pair(relay)
            yield Hostile(relay, store, caller, receiver)
        finally:
            relay.stop()
            store.close()


def claim_one(h: Hostile) -> tuple[str, int]:
    tid = enqueue(h.store, message_id=f"m-{len(h.store.list_tasks('default', limit=500))}")
    with h.relay.client(h.receiver) as c:
        leases = c.post("/api/receiver/claim", json={"limit": 1}).json()["leases"]
    assert [x["task"]["id"] for x in leases] == [tid]
    return tid, int(leases[0]["epoch"])


def refused(r: httpx.Response, status: int, *words: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    text = str(body)
    for word in words:
        assert word in text, (word, text)
    return body


# -- 1. integers with huge exponents ----------------------------------------------------------


def test_integers_with_huge_exponents_are_refused_by_name_and_range(hostile: Hostile) -> None:
    h = hostile
    tid, epoch = claim_one(h)
    before = h.snapshot()
    owner = h.relay.owner_token
    for number in (HUGE, ENORMOUS, f"-{HUGE}"):
        r = h.post(h.receiver, f"/api/receiver/tasks/{tid}/renew", f'{{"epoch":{number}}}')
        refused(r, 400, "'epoch'", "between 0 and")
        r = h.post(h.receiver, "/api/receiver/claim", f'{{"limit":{number}}}')
        refused(r, 400, "'limit'", "between 1 and 100")
        r = h.post(owner, "/api/enrollments", f'{{"agent":"local/codex","ttl_seconds":{number}}}')
        refused(r, 400, "'ttl_seconds'", "between 30 and")
        err = h.rpc("GetTask", f'{{"id":"{tid}","historyLength":{number}}}')["error"]
        assert err["code"] == -32602, err
        assert "historyLength" in err["message"], err
        err = h.rpc("ListTasks", f'{{"pageSize":{number}}}')["error"]
        assert err["code"] == -32602, err
        assert "pageSize" in err["message"], err
    with h.relay.client(h.caller) as c:
        r = c.get(f"{ADDR}/tasks", params={"pageSize": HUGE}, headers=A2A)
    refused(r, 400, "pageSize", "INVALID_ARGUMENT")
    assert h.snapshot() == before
    # The lease still works with its real epoch: nothing about the task was disturbed.
    with h.relay.client(h.receiver) as c:
        assert c.post(f"/api/receiver/tasks/{tid}/renew", json={"epoch": epoch}).json() == {
            "outcome": "ok"
        }


def test_hostile_integers_do_not_stall_the_relay(hostile: Hostile) -> None:
    """While several requests carrying ``1e1000000`` are handled, /healthz still answers
    (before the fix each one held the event loop for ~20 s, so these four held it for over a
    minute). The deadline below is a hang guard, far above any healthy answer."""
    h = hostile
    tid, _ = claim_one(h)
    answers: list[int] = []

    def attack() -> None:
        r = h.post(h.receiver, f"/api/receiver/tasks/{tid}/renew", f'{{"epoch":{HUGE}}}')
        answers.append(r.status_code)

    threads = [threading.Thread(target=attack) for _ in range(4)]
    for t in threads:
        t.start()
    with h.relay.client() as c:
        health = c.get("/healthz", timeout=15.0)
    for t in threads:
        t.join(timeout=120)
    assert health.status_code == 200
    assert health.json()["ok"] is True
    assert answers == [400, 400, 400, 400]


# -- 2. lone surrogates -----------------------------------------------------------------------

LONE = "\\ud800"  # as JSON text: valid JSON, not Unicode


def test_lone_surrogates_are_refused_at_the_boundary_naming_the_field(hostile: Hostile) -> None:
    h = hostile
    tid, epoch = claim_one(h)
    before = h.snapshot()
    owner = h.relay.owner_token
    receiver_cases = [
        ("/api/receiver/claim", f'{{"worker":"w{LONE}"}}', "worker"),
        (
            f"/api/receiver/tasks/{tid}/progress",
            f'{{"epoch":{epoch},"kind":"status","body":{{"text":"{LONE}"}}}}',
            "body.text",
        ),
        (
            f"/api/receiver/tasks/{tid}/complete",
            f'{{"epoch":{epoch},"result":{{"message":{{"parts":[{{"text":"{LONE}"}}]}}}}}}',
            "result.message.parts[0].text",
        ),
        (f"/api/receiver/tasks/{tid}/fail", f'{{"epoch":{epoch},"error":"x{LONE}"}}', "error"),
    ]
    for path, text, field in receiver_cases:
        body = refused(h.post(h.receiver, path, text), 400, "surrogate", field)
        assert body["field"] == field
    control_cases = [
        (f'{{"id":"evil","description":"{LONE}"}}', "description"),
        (
            f'{{"id":"evil","capabilities":[{{"id":"x","description":"{LONE}"}}]}}',
            "capabilities[0].description",
        ),
        (f'{{"id":"evil","{LONE}":1}}', "body"),
    ]
    for text, field in control_cases:
        refused(h.post(owner, "/api/agents", text), 400, "surrogate", field)
    msg_text = f'{{"messageId":"m-s1","role":"ROLE_USER","parts":[{{"text":"a{LONE}"}}]}}'
    msg_id = f'{{"messageId":"m-{LONE}","role":"ROLE_USER","parts":[{{"text":"hi"}}]}}'
    for message, field in ((msg_text, "message.parts[0].text"), (msg_id, "message.messageId")):
        r = h.post(h.caller, f"{ADDR}/message:send", f'{{"message":{message}}}', A2A)
        refused(r, 400, "INVALID_ARGUMENT", "surrogate", field)
        err = h.rpc("SendMessage", f'{{"message":{message}}}')["error"]
        assert err["code"] == -32602, err
        assert "surrogate" in err["message"], err
        assert field in err["message"]
    assert h.snapshot() == before


# -- 3. malformed query integers --------------------------------------------------------------


def test_malformed_a2a_query_integers_are_invalid_params(hostile: Hostile) -> None:
    h = hostile
    tid = enqueue(h.store, message_id="m-query")
    with h.relay.client(h.caller) as c:
        for value in ("9" * 5000, "²", "1.5", "-1", " ", "0x10"):
            r = c.get(f"{ADDR}/tasks", params={"pageSize": value}, headers=A2A)
            refused(r, 400, "pageSize", "INVALID_ARGUMENT")
        for value in ("²", "9" * 5000):
            r = c.get(f"{ADDR}/tasks/{tid}", params={"historyLength": value}, headers=A2A)
            refused(r, 400, "historyLength", "INVALID_ARGUMENT")
    for params in ('{"pageSize":"²"}', '{"pageSize":"' + "9" * 5000 + '"}'):
        err = h.rpc("ListTasks", params)["error"]
        assert err["code"] == -32602, err
        assert "pageSize" in err["message"], err
    err = h.rpc("GetTask", f'{{"id":"{tid}","historyLength":"²"}}')["error"]
    assert err["code"] == -32602, err
    assert "historyLength" in err["message"], err
    with h.relay.client(h.relay.owner_token) as c:
        r = c.get("/api/audit", params={"after": "²"})
        refused(r, 400, "'after'", "whole number")
        r = c.get("/api/tasks", params={"limit": "9" * 5000})
        refused(r, 400, "'limit'", "whole number")


# -- the rest: content types, bodies that never arrive, huge headers ----------------------------


def test_control_and_receiver_bodies_must_be_utf8_json(hostile: Hostile) -> None:
    h = hostile
    before = h.snapshot()
    good = '{"id":"sneaky"}'
    owner = h.relay.owner_token
    for token, path in ((owner, "/api/agents"), (h.receiver, "/api/receiver/claim")):
        refused(h.post(token, path, good, {"content-type": "text/plain"}), 415, "text/plain")
        refused(h.post(token, path, good, {}), 415, "(none)")
        bom = b"\xef\xbb\xbf" + good.encode()
        refused(h.post(token, path, bom), 400, "byte-order mark")
        utf16 = good.encode("utf-16")
        refused(h.post(token, path, utf16), 400, "not UTF-8")
        refused(h.post(token, path, good.encode("utf-16-le")), 400, "not UTF-8")
        deep = "[" * 150 + "]" * 150
        refused(h.post(token, path, '{"x":' + deep + "}"), 400, "nested deeper than 100")
    assert h.snapshot() == before


def _raw_request(url: str, head: bytes, body: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head + body)
        out = b""
        while b"\r\n\r\n" not in out or not out.endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    return out


def test_a_body_that_never_arrives_is_answered_408(hostile: Hostile) -> None:
    """The relay runs with ``--body-timeout 1``: a body announced as 100 bytes of which one
    arrives is answered 408 with the reason, on every surface, instead of holding the
    connection for ever."""
    h = hostile
    cases = [
        ("/api/agents", h.relay.owner_token),
        ("/api/receiver/claim", h.receiver),
        (ADDR, h.caller),
        (f"{ADDR}/message:send", h.caller),
    ]
    for path, token in cases:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer {token}\r\n"
            "A2A-Version: 1.0\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        ).encode()
        answer = _raw_request(h.relay.url, head, b"{")
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"did not arrive within 1 s" in answer, answer


def test_oversized_headers_are_answered_431(hostile: Hostile) -> None:
    """80 KiB of headers sent at once (so the client is not still writing when the relay
    answers and closes) get a 431 with the reason rather than a reset."""
    host, port = h_addr(hostile.relay.url)
    filler = b"".join(f"X-Filler-{i}: ".encode() + b"a" * 1000 + b"\r\n" for i in range(80))
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: relay\r\n" + filler + b"\r\n")
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"larger than this relay accepts" in answer


def h_addr(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


# -- 4. a send cut at COMMIT is answered truthfully ---------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("when", ["after", "before"])
def test_a_send_cut_at_commit_is_answered_truthfully(
    when: str, pg_url: str, tmp_path: Path
) -> None:
    """The relay reaches PostgreSQL through a proxy that cuts the connection exactly at
    the COMMIT of the transaction storing the task. ``after``: the server committed, the
    relay never heard; it must find out and answer 200 with the task, whose acceptance
    record committed with it. ``before``: nothing committed; the 503 saying "nothing was
    stored" must be true. Either way a resend leaves exactly one task."""
    from pgproxy import PgProxy

    host, port = pg_url.split("@", 1)[1].split("/", 1)[0].split(":")
    proxy = PgProxy((host, int(port)))
    relay = start_relay(proxy.url(pg_url), tmp_path)
    store = open_store(pg_url)
    try:
        caller, _ = setup_pair(relay)
        send = {
            "message": {"messageId": "cut-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]},
            "configuration": {"returnImmediately": True},
        }
        proxy.arm(when)
        with relay.client(caller) as c:
            first = c.post(f"{ADDR}/message:send", json=send, headers={"A2A-Version": "1.0"})
        assert proxy.cut.is_set()
        stored = store.list_tasks("default")
        accepts = [r for r in store.audit_since("default", 0, 1000) if r.action == "task.accept"]
        if when == "after":
            assert first.status_code == 200, first.text
            [task] = stored
            assert first.json()["task"]["id"] == task.id
            assert [r.subject for r in accepts] == [task.id]
        else:
            assert first.status_code == 503, first.text
            assert "nothing was stored" in first.json()["error"]["message"]
            assert stored == []
            assert accepts == []
        with relay.client(caller) as c:
            again = c.post(f"{ADDR}/message:send", json=send, headers={"A2A-Version": "1.0"})
        assert again.status_code == 200, again.text
        [task] = store.list_tasks("default")
        assert again.json()["task"]["id"] == task.id
        accepts = [r for r in store.audit_since("default", 0, 1000) if r.action == "task.accept"]
        assert [r.subject for r in accepts] == [task.id]
    finally:
        relay.stop()
        store.close()
        proxy.close()
