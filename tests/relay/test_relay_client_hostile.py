"""The relay client against a stand-in relay that lies: every answer it cannot use is
refused with one clear :class:`RelayError`, nothing read past its bounds.

The stand-in is real HTTP on loopback from a thread of the test process; each path
answers the bytes a test gives it (status, headers, body, written as they are)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from melchior.mellan import AsyncRelayClient, RelayClient, RelayError
from melchior.mellan.rawjson import encode

WS, AGENT = "ws", "private/ops"
BASE = f"/a2a/{WS}/private/ops"
LIMIT = 64 * 1024
TASK = b'{"id":"t1","contextId":"c1","status":{"state":"TASK_STATE_COMPLETED"}}'


@dataclass
class Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    length: bool = True
    """Whether a Content-Length is sent (else the body ends when the connection closes)."""


@dataclass
class StandIn:
    answers: dict[str, Answer] = field(default_factory=dict)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def client(self) -> RelayClient:
        return RelayClient(self.url, "tok", workspace=WS, max_answer=LIMIT)

    def async_client(self) -> AsyncRelayClient:
        return AsyncRelayClient(self.url, "tok", workspace=WS, max_answer=LIMIT)


def handler(stand_in: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            if length:
                self.rfile.read(length)
            found = stand_in.answers.get(self.path.split("?")[0])
            if found is None:
                found = Answer(404, {"content-type": "application/json"}, b'{"error": {}}')
            self.send_response(found.status)
            for k, v in found.headers.items():
                self.send_header(k, v)
            if found.length and "content-length" not in {k.lower() for k in found.headers}:
                self.send_header("content-length", str(len(found.body)))
            if not found.length:
                self.send_header("connection", "close")
                self.close_connection = True
            self.end_headers()
            try:
                self.wfile.write(found.body)
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading: that is the point

        do_GET = do_POST = _answer

    return Handler


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    found = StandIn()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(found))
    server.daemon_threads = True
    found.server = server
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()


def json_answer(body: bytes, status: int = 200) -> Answer:
    return Answer(status, {"content-type": "application/json"}, body)


def sse(body: bytes) -> Answer:
    return Answer(200, {"content-type": "text/event-stream"}, body, length=False)


def refused(stand_in: StandIn, path: str, answer: Answer) -> RelayError:
    stand_in.answers[path] = answer
    with stand_in.client() as c:
        try:
            if path.endswith(":stream"):
                list(c.stream(AGENT, "hi"))
            else:
                c.get(AGENT, path.rsplit("/", 1)[1])
        except RelayError as exc:
            return exc
    raise AssertionError(f"{path}: the answer was accepted")


# -- too big ------------------------------------------------------------------------------


def test_a_declared_body_over_the_limit_is_refused_before_it_is_read(stand_in: StandIn) -> None:
    answer = json_answer(b"x" * (LIMIT * 2))
    no = refused(stand_in, BASE + "/tasks/big", answer)
    assert no.code == "bad-answer"
    assert f"exceeds {LIMIT} bytes" in str(no)


def test_an_undeclared_body_is_read_only_up_to_the_limit(stand_in: StandIn) -> None:
    answer = Answer(200, {"content-type": "application/json"}, b"[" * (LIMIT * 4), length=False)
    no = refused(stand_in, BASE + "/tasks/endless", answer)
    assert f"exceeds {LIMIT} bytes" in str(no)
    stand_in.answers[BASE + "/tasks/endless"] = answer

    async def scenario() -> RelayError:
        async with stand_in.async_client() as c:
            try:
                await c.get(AGENT, "endless")
            except RelayError as exc:
                return exc
        raise AssertionError("an endless answer was accepted")

    assert f"exceeds {LIMIT} bytes" in str(asyncio.run(scenario()))


def test_an_error_page_over_the_limit_is_refused_too(stand_in: StandIn) -> None:
    no = refused(stand_in, BASE + "/tasks/e", json_answer(b" " * (LIMIT + 1), status=500))
    assert f"exceeds {LIMIT} bytes" in str(no)


# -- not the JSON it says it is -----------------------------------------------------------


def test_lone_surrogates_are_refused_naming_where(stand_in: StandIn) -> None:
    body = rb'{"id":"t\ud800","contextId":"c","status":{"state":"TASK_STATE_COMPLETED"}}'
    no = refused(stand_in, BASE + "/tasks/s", json_answer(body))
    assert no.code == "bad-answer"
    assert "surrogate" in str(no)
    assert no.status is None


def test_a_huge_exponent_where_an_id_belongs_is_refused_and_costs_nothing(
    stand_in: StandIn,
) -> None:
    body = b'{"id":1e999999999,"contextId":"c","status":{"state":"TASK_STATE_COMPLETED"}}'
    no = refused(stand_in, BASE + "/tasks/e", json_answer(body))
    assert "the task id is not a string" in str(no)
    digits = b'{"id":' + b"9" * 50_000 + b',"status":{"state":"TASK_STATE_COMPLETED"}}'
    no = refused(stand_in, BASE + "/tasks/d", json_answer(digits))
    assert "the task id is not a string" in str(no)


def test_a_huge_exponent_in_data_is_kept_exactly_never_converted(stand_in: StandIn) -> None:
    body = TASK[:-1] + b',"metadata":{"n":1e999999999,"m":-0}}'
    stand_in.answers[BASE + "/tasks/t1"] = json_answer(body)
    with stand_in.client() as c:
        got = c.get(AGENT, "t1")
    n = got.raw["metadata"]["n"]
    assert isinstance(n, Decimal)
    assert encode(n) == "1e999999999"  # as written, not respelt
    assert got.text == body.decode()


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"<html>hello</html>", "is not JSON"),
        (b'{"id":"a","id":"b"}', "duplicate object key"),
        (b'{"n": NaN}', "is not JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"task": "not an object"}', "a task is not a JSON object"),
        (b"[]", "without a task"),
        (b'{"message": {"parts": []}}', "without a task"),
        (b"[" * 200 + b"]" * 200, "nested deeper than 100 levels"),
        (b"[" * 50_000, "nested too deeply"),
    ],
)
def test_answers_that_are_not_a_task_are_refused(stand_in: StandIn, body: bytes, said: str) -> None:
    stand_in.answers[BASE + "/message:send"] = json_answer(body)
    with stand_in.client() as c, pytest.raises(RelayError) as no:
        c.send(AGENT, "hi")
    assert no.value.code == "bad-answer"
    assert said in str(no.value)


def test_an_error_that_is_not_the_relays_says_what_came_back(stand_in: StandIn) -> None:
    page = Answer(502, {"content-type": "text/html"}, b"<h1>Bad\nGateway\x1b[31m</h1>")
    no = refused(stand_in, BASE + "/tasks/p", page)
    assert no.status == 502
    assert not no.said
    assert str(no).startswith("HTTP 502 from GET ")
    assert "\n" not in str(no)
    assert "\x1b" not in str(no)
    body = b'{"error": {"code": "x", "reason": "line one\\nline two\\u001b"}}'
    no = refused(stand_in, BASE + "/tasks/q", json_answer(body, status=400))
    assert no.sentence == "line one line two "
    assert str(no) == "line one line two  (x, HTTP 400)"


# -- streams ------------------------------------------------------------------------------

FIRST = b'data: {"task":' + TASK + b"}\n\n"


def test_malformed_utf8_in_a_stream_is_refused(stand_in: StandIn) -> None:
    no = refused(stand_in, BASE + "/message:stream", sse(FIRST + b"data: \xff\xfe\n\n"))
    assert no.code == "bad-answer"
    assert "event stream is malformed" in str(no)
    assert "not UTF-8" in str(no)


def test_an_endless_stream_line_is_refused_at_the_limit(stand_in: StandIn) -> None:
    no = refused(stand_in, BASE + "/message:stream", sse(FIRST + b"data: " + b"x" * LIMIT * 3))
    assert "event stream is malformed" in str(no)
    assert str(LIMIT) in str(no)

    async def scenario() -> RelayError:
        async with stand_in.async_client() as c:
            try:
                [e async for e in c.stream(AGENT, "hi")]
            except RelayError as exc:
                return exc
        raise AssertionError("an endless line was accepted")

    assert "event stream is malformed" in str(asyncio.run(scenario()))


def test_a_stream_event_of_the_wrong_shape_is_refused(stand_in: StandIn) -> None:
    for bad in (b'data: {"nothing": 1}\n\n', b"data: [1]\n\n", b'data: {"task": {"id": 7}}\n\n'):
        no = refused(stand_in, BASE + "/message:stream", sse(bad))
        assert no.code == "bad-answer"


def test_an_error_event_is_the_relays_refusal_with_its_exact_text(stand_in: StandIn) -> None:
    said = b'{"error":{"code":500,"status":"INTERNAL","message":"it fell over"}}'
    no = refused(stand_in, BASE + "/message:stream", sse(FIRST + b"event: error\ndata: " + said))
    assert (no.status, no.code, no.sentence) == (500, "INTERNAL", "it fell over")
    assert no.text == said.decode()


def test_a_stream_yields_events_as_they_come_and_ends_cleanly(stand_in: StandIn) -> None:
    done = b'data: {"statusUpdate":{"taskId":"t1","status":{"state":"TASK_STATE_COMPLETED"}}}'
    stand_in.answers[BASE + "/message:stream"] = sse(FIRST + b": keepalive\n\n" + done)
    with stand_in.client() as c:
        events = list(c.stream(AGENT, "hi"))
    assert [e.kind for e in events] == ["task", "statusUpdate"]
    assert events[-1].state == "TASK_STATE_COMPLETED"


def test_a_relay_that_never_answers_is_given_up_on(stand_in: StandIn) -> None:
    gate = threading.Event()

    class Silent(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            gate.wait(30)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Silent)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with (
            RelayClient(url, "tok", workspace=WS, timeout=0.5) as c,
            pytest.raises(RelayError) as no,
        ):
            c.get(AGENT, "t1")
        assert no.value.unreachable
        assert "did not answer within 0.5 s" in str(no.value)
    finally:
        gate.set()
        server.shutdown()
        server.server_close()


def test_mellan_send_prints_a_streams_error_then_says_it_failed(
    stand_in: StandIn, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from melchior.mellan.commands import send

    said = b'{"error":{"code":500,"status":"INTERNAL","message":"it fell over"}}'
    stand_in.answers[BASE + "/message:stream"] = sse(FIRST + b"event: error\ndata: " + said)
    monkeypatch.setenv("MELLAN_TOKEN", "tok")
    parser = argparse.ArgumentParser()
    send.add_arguments(parser)
    args = [AGENT, "hi", "--stream", "--json", "--relay", stand_in.url, "--workspace", WS]
    assert send.run(parser.parse_args(args)) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == ['{"task":' + TASK.decode() + "}", said.decode()]
    assert err.strip() == "mellan: stream failed: it fell over"
    stand_in.answers[BASE + "/message:send"] = json_answer(b"<html>down</html>", status=503)
    plain = [AGENT, "hi", "--relay", stand_in.url, "--workspace", WS]
    assert send.run(parser.parse_args(plain)) == 3  # the relay's store is down: exit 3
    assert "refused: HTTP 503 from POST " in capsys.readouterr().err


def test_the_cli_reads_a_control_answer_only_up_to_the_limit(stand_in: StandIn) -> None:
    from melchior.mellan.client.caller import MAX_ANSWER
    from melchior.mellan.commands._common import CliError, Target, call

    stand_in.answers["/api/agents"] = Answer(200, {}, b" " * (MAX_ANSWER + 1), length=False)
    with pytest.raises(CliError, match=f"exceeds {MAX_ANSWER} bytes"):
        call(Target(stand_in.url, "tok"), "GET", "/api/agents")
    stand_in.answers["/api/grants"] = json_answer(
        b'{"error": {"code": "nope", "reason": "no"}}', 403
    )
    with pytest.raises(CliError, match=r"^refused: no \(nope, HTTP 403\)$"):
        call(Target(stand_in.url, "tok"), "GET", "/api/grants")
