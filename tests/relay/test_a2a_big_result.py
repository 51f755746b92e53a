"""A big answer read through A2A: sent once, read whole, and never a reason for the relay
to stop serving others.

A real relay process (SQLite and PostgreSQL), a receiver completing through the receiver
API, and real clients: raw HTTP, the official a2a-sdk client. The GIL check builds a view
and its bytes with the very functions GetTask uses and records the size of every JSON C
call (``json.loads``/``json.dumps``) they make: that is what held the GIL for a whole
15 MiB answer, stalling the event loop even from a worker thread.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import secrets
import threading
import types
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types import GetTaskRequest
from a2a.utils.constants import TransportProtocol

from melchior.mellan import rawjson
from melchior.mellan.client.receiver import ReceiverClient
from melchior.mellan.relay.store.base import CredentialKind, Principal, Store, Task, TaskState
from melchior.mellan.relay.surfaces.a2a import jsontext, listing, ops, tasks, views
from melchior.mellan.relay.surfaces.a2a.access import Caller
from melchior.mellan.relay.surfaces.a2a.paths import Target
from melchior.mellan.relay.surfaces.a2a.requests import parse_list
from relay_proc import (
    RelayProc,
    db_url_fixture,
    enqueue,
    relay_fixture,
    setup_pair,
    store_fixture,
)

__all__ = ["db_url_fixture", "relay_fixture", "store_fixture"]

MIB = 1024 * 1024


def completed(relay: RelayProc, store: Store, text: str) -> tuple[str, str]:
    """(caller token, task id) of a task a receiver completed with ``text`` as its answer."""
    caller, ops = setup_pair(relay)
    task_id = enqueue(store)
    with ReceiverClient(relay.url, ops) as rc:
        (lease,) = rc.claim(wait=5)
        assert rc.complete(task_id, lease.epoch, {"message": {"parts": [{"text": text}]}}).ok
    return caller, task_id


def big_text() -> str:
    """Several MiB, non-ASCII, with the characters JSON must escape, and a unique marker."""
    return '"\\\n' + secrets.token_hex(8) + "é" * (3 * MIB) + 'end"'


def base_of(relay: RelayProc) -> str:
    return f"{relay.url}/a2a/default/private/ops"


def test_the_a2a_sdk_client_reads_a_big_answer_whole_on_both_bindings(
    relay: RelayProc, store: Store
) -> None:
    """The official client parses the spliced, chunked answer: the whole text, once, as the
    status message."""
    text = big_text()
    caller, task_id = completed(relay, store, text)

    async def go(binding: str) -> Any:
        async with httpx.AsyncClient(
            headers={"Authorization": f"Bearer {caller}"}, timeout=60
        ) as http:
            config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding])
            client = await create_client(base_of(relay), client_config=config)
            try:
                return await client.get_task(GetTaskRequest(id=task_id))
            finally:
                await client.close()

    for binding in (TransportProtocol.JSONRPC, TransportProtocol.HTTP_JSON):
        got = asyncio.run(go(binding))
        assert got.status.message.parts[0].text == text
        assert all(text not in (p.text for p in m.parts) for m in got.history)


def test_healthz_is_answered_while_a_big_read_is_unfinished(relay: RelayProc, store: Store) -> None:
    """Ordering, not time: a GetTask whose reader has taken only its first bytes is still
    in flight; a /healthz sent then is answered, and only after it the big read is taken
    to its end (whole, the answer once). A relay whose loop were held by the big answer
    (one blocking write of it, or a parse holding the GIL) could not answer in between."""
    text = big_text()
    caller, task_id = completed(relay, store, text)
    url = urlsplit(relay.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
    try:
        headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {caller}"}
        conn.request("GET", f"{urlsplit(base_of(relay)).path}/tasks/{task_id}", headers=headers)
        response = conn.getresponse()
        assert response.status == 200
        length = int(response.getheader("Content-Length") or 0)
        first = response.read(64 * 1024)  # the read has begun, and is far from over
        assert 0 < len(first) < length
        health = httpx.get(f"{relay.url}/healthz", timeout=60)
        assert health.status_code == 200
        rest = response.read()  # only now is the big read finished
    finally:
        conn.close()
    body = (first + rest).decode()
    assert len(first) + len(rest) == length
    assert body.count(json.dumps(text, ensure_ascii=False)[1:-1]) == 1
    assert json.loads(body)["status"]["message"]["parts"][0]["text"] == text


def test_list_tasks_builds_its_views_off_the_event_loop_each_answer_once(
    relay: RelayProc, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of big answers with history and artifacts: every task view is built on a
    worker thread (the page read and its views are one hop), and each answer is in the
    page once. Real store, real relay rows; the views are recorded where they are built."""
    texts = [big_text(), big_text()]
    _, ops = setup_pair(relay)
    with ReceiverClient(relay.url, ops) as rc:
        for text in texts:
            task_id = enqueue(store)
            (lease,) = rc.claim(wait=5)
            assert rc.complete(task_id, lease.epoch, {"message": {"parts": [{"text": text}]}}).ok
    built_on: list[int] = []
    real_view = views.task_view

    def recording(*args: Any, **kw: Any) -> Any:
        built_on.append(threading.get_ident())
        return real_view(*args, **kw)

    monkeypatch.setattr(views, "task_view", recording)
    caller = Caller(
        Principal("default", CredentialKind.AGENT, "local/codex", "c1"),
        Target("default", "private/ops", ()),
    )
    req = parse_list({"historyLength": 10, "includeArtifacts": True})

    async def go() -> tuple[int, dict[str, Any]]:
        async def call(fn: Any, *args: Any) -> Any:
            return await asyncio.to_thread(fn, *args)

        fake = types.SimpleNamespace(store=store, call=call)
        return threading.get_ident(), await listing.list_tasks(fake, caller, req)  # type: ignore[arg-type]

    loop_thread, page = asyncio.run(go())
    assert len(built_on) == 2
    assert loop_thread not in built_on
    body = jsontext.dumpb(page).decode()
    for text in texts:
        assert body.count(json.dumps(text, ensure_ascii=False)[1:-1]) == 1


def _task(result: str) -> Task:
    return Task(
        id="t1", workspace="default", caller="local/a", receiver="private/b", capability="run",
        context_id="c1", state=TaskState.SUCCEEDED, payload='{"parts":[{"text":"go"}]}',
        metadata="{}", message_id="m1", session_key=None, chain="", hop=1, path=(),
        attempt=1, max_attempts=3, lease_epoch=1, lease_owner=None, lease_expires_at=None,
        result=result, error=None, created_at="2026-01-01T00:00:00Z",
        updated_at="2026-01-01T00:00:01Z",
    )  # fmt: skip


def test_a_big_view_never_parses_or_encodes_the_answer_in_one_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The view and its bytes, as GetTask builds them, make no JSON C call over more than
    a small part of a 4 MiB answer: the answer is spliced (its stored JSON text), not
    parsed and written again — each of those was one call holding the GIL over all of it.
    Records real calls (the real functions still do the work)."""
    sizes: list[int] = []
    real = rawjson.json

    def loads(text: Any, **kw: Any) -> Any:
        sizes.append(len(text))
        return real.loads(text, **kw)

    def dumps(value: Any, **kw: Any) -> str:
        out = real.dumps(value, **kw)
        sizes.append(len(out))
        return out

    text = "ü" * (4 * MIB) + '"\\'
    result = jsontext.dumps({"message": {"role": "ROLE_AGENT", "parts": [{"text": text}]}})
    seen = tasks.Seen(_task(result), [], [])
    monkeypatch.setattr(rawjson, "json", types.SimpleNamespace(loads=loads, dumps=dumps))
    answer = {"jsonrpc": "2.0", "id": 1, "result": tasks._view(seen)}
    body = jsontext.dumpb(answer)  # the join of the chunks GetTask sends
    monkeypatch.undo()
    assert max(sizes) < MIB // 4, f"a JSON call over {max(sizes)} characters"
    assert body.decode().count(json.dumps(text, ensure_ascii=False)[1:-1]) == 1
    assert json.loads(body)["result"]["status"]["message"]["parts"] == [{"text": text}]


def test_get_task_answers_a_big_result_byte_identical_on_both_bindings_read_after_read(
    relay: RelayProc, store: Store
) -> None:
    """The stored answer's JSON text (read back from the store in pieces, then kept) is in
    every answer byte for byte, on JSON-RPC and HTTP+JSON, the first read as the later
    ones (those come from the caches: they must not differ by a byte)."""
    text = big_text() + "😀\u2028\t" * 1000  # 4-byte, 3-byte UTF-8 and escapes to the end
    caller, task_id = completed(relay, store, text)
    stored = store.get_task("default", task_id)
    assert stored is not None
    assert stored.result is not None
    literal = json.dumps(text, ensure_ascii=False).encode()  # as the receiver client sent it
    assert stored.result.encode().count(literal) == 1
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {caller}"}
    rpc = {"jsonrpc": "2.0", "id": 7, "method": "GetTask", "params": {"id": task_id}}
    reads: list[list[bytes]] = []
    with httpx.Client(headers=headers, timeout=60) as c:
        for _ in range(2):
            bodies = [
                c.get(f"{base_of(relay)}/tasks/{task_id}").content,
                c.post(base_of(relay), json=rpc).content,
            ]
            for body in bodies:
                assert body.count(literal) == 1
            rest_task = json.loads(bodies[0])
            rpc_task = json.loads(bodies[1])["result"]
            assert rest_task == rpc_task
            assert rest_task["status"]["message"]["parts"][0]["text"] == text
            reads.append(bodies)
    assert reads[0] == reads[1]


def test_a_kept_answer_is_parsed_and_encoded_once_across_views() -> None:
    """Two GetTask answers of one finished big result (the store hands out one ``str`` for
    it) share its bytes: the second view neither decodes the result nor encodes the
    answer again (the same ``bytes`` objects), and still says every byte of it."""
    text = "é" * (3 * MIB) + '"\\'
    result = jsontext.dumps({"message": {"role": "ROLE_AGENT", "parts": [{"text": text}]}})
    seen = tasks.Seen(_task(result), [], [])
    first = jsontext.dumpb_chunks(tasks._view(seen))
    second = jsontext.dumpb_chunks(tasks._view(seen))
    big = [i for i, chunk in enumerate(first) if len(chunk) >= jsontext.SLICE]
    assert big  # the answer's text is several slices
    assert all(first[i] is second[i] for i in big)
    assert b"".join(first) == b"".join(second)
    assert json.loads(b"".join(second))["status"]["message"]["parts"] == [{"text": text}]
    # A different str with the same content is not the kept one: parsed afresh, same bytes.
    other = tasks.Seen(_task("".join([result[:10], result[10:]])), [], [])
    third = jsontext.dumpb_chunks(tasks._view(other))
    assert not any(third[i] is first[i] for i in big)
    assert b"".join(third) == b"".join(first)


def test_a_small_answer_is_encoded_on_the_loop_a_big_one_on_a_worker_thread() -> None:
    """Where a task-carrying answer's bytes are made: a small SendMessage answer on the
    event loop (a worker-thread hop costs more than encoding it, and it is on the path a
    blocking caller waits for), one of a MiB on a worker thread, as before —
    the same bytes either way. Real views and encoder; the hops are recorded where they run."""
    small_result = jsontext.dumps({"message": {"role": "ROLE_AGENT", "parts": [{"text": "ok"}]}})
    big_result = jsontext.dumps({"message": {"role": "ROLE_AGENT", "parts": [{"text": "é" * MIB}]}})
    hops: list[int] = []

    async def go(result: str) -> tuple[int, dict[str, Any], list[bytes]]:
        async def call(fn: Any, *args: Any) -> Any:
            def run() -> Any:
                hops.append(threading.get_ident())
                return fn(*args)

            return await asyncio.to_thread(run)

        fake = types.SimpleNamespace(call=call)
        answer = tasks._answer(tasks.Seen(_task(result), [], []), None)
        chunks = await ops.encoded(fake, "SendMessage", answer)  # type: ignore[arg-type]
        return threading.get_ident(), answer, chunks

    _, small, chunks = asyncio.run(go(small_result))
    assert hops == []  # encoded where the answer was made
    assert b"".join(chunks) == jsontext.dumpb(small)
    loop_thread, big, chunks = asyncio.run(go(big_result))
    assert len(hops) == 1
    assert hops[0] != loop_thread
    assert b"".join(chunks) == jsontext.dumpb(big)


def test_within_counts_text_to_the_limit() -> None:
    """The size check counts stored text and strings (and one per value), stops once over."""
    value = {"a": [rawjson.Raw('"' + "x" * 98 + '"'), "yz", 3]}
    size = 1 + 2 + 1 + 101 + 3 + 1  # the dict, "a", the list, the Raw, "yz", 3: one each + text
    assert jsontext.within(value, size)
    assert not jsontext.within(value, size - 1)
