"""Every refusal is a policy decision: it names its rule, on the socket and at the relay.

The refusal tables in docs/local.md and docs/mellan.md are walked: each documented code
is provoked for real (a live ``melchior serve``, a live ``mellan relay``) and its reply
must carry the ``rule`` that decided it — the mark of a :class:`~melchior.policy.Decision`
turned into a wire refusal by the one helper (:func:`melchior.envelope.refusal`). A code
added to a table without being provoked here fails the walk; and no module of the local
layer builds a refusal by hand.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from melchior.session.client import connect, request
from paths_kit import REPO
from relay_proc import RelayProc, enqueue, setup_pair, start_relay
from session_harness import Harness

ROOT = REPO


def documented(doc: str, start: str, end: str) -> set[str]:
    text = (ROOT / "docs" / doc).read_text()
    section = text[text.index(start) : text.index(end, text.index(start))]
    return set(re.findall(r"`([a-z][a-z-]+)`", section))


def test_no_local_module_builds_a_refusal_by_hand() -> None:
    """Refusals on the local layer come from ``envelope.refusal``/``deny``/``check`` only."""
    src = ROOT / "src" / "melchior"
    for path in [src / "tool.py", *sorted((src / "session").glob("*.py"))]:
        code = path.read_text()
        assert not re.search(r"\bRefused\(", code), f"{path.name} builds a Refused by hand"


# -- the local socket --------------------------------------------------------------------------


@pytest.fixture
def harness(runtime_dir: Path, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(runtime_dir, tmp_path / "config")
    yield h
    h.close()


def _call(at: Path, who: str, msg: dict[str, Any]) -> dict[str, Any]:
    sock = connect(at, who=who)
    try:
        reply = request(sock, msg, who=who)
    finally:
        sock.close()
    assert reply["ok"] is False, reply
    error: dict[str, Any] = reply["error"]
    return error


def test_every_documented_socket_refusal_names_its_rule(harness: Harness) -> None:
    root = harness.start()
    stranger = harness.start()  # a second main: a front door, but no child of root
    child = root.spawn()
    at, me = root.at, root.id
    big = "x" * (1024 * 1024 + 1)
    hop5 = {"chain": "c", "hop": 5, "path": ["a", "b", "c", "d"]}
    asked = request(
        connect(child.at, who=child.id),
        {"call": "ask", "args": ["which?"], "from": root.id},
        who=child.id,
    )["result"][0]["about"]
    seen: dict[str, set[str]] = {}

    def provoke(code: str, msg: dict[str, Any], target: Path = at, who: str = me) -> None:
        error = _call(target, who, msg)
        assert error["code"] == code, error
        assert error["rule"], error  # every refusal names the rule that decided it
        assert error["receipt"] == "refused", error
        seen.setdefault(code, set()).add(error["rule"])

    provoke("unknown-verb", {"call": "dance", "args": []})
    provoke("bad-args", {"call": "tell", "args": [42]})
    provoke("bad-from", {"call": "tell", "args": ["x"], "from": "not an id"})
    live = {root.id, stranger.id, child.id}  # ids are minted at random: pick one not minted
    nobody = next(i for i in ("omega-omega", "omega-psi", "psi-omega", "psi-psi") if i not in live)
    provoke("unknown-sender", {"call": "tell", "args": ["x"], "from": nobody})
    provoke("anonymous", {"call": "ask", "args": ["who am I talking to?"]})
    provoke("bad-chain", {"call": "tell", "args": ["x"], "chain": {"chain": "", "hop": 1}})
    provoke("refused", {"call": "tell", "args": ["x"], "chain": hop5})
    provoke("too-large", {"call": "tell", "args": [big]})
    provoke("unknown-task", {"call": "task", "args": [f"{me}@nothing"], "from": me})
    provoke("refused", {"call": "end", "args": ["wrong token"]})
    provoke(
        "refused",
        {"call": "answer", "args": [asked, "mine"], "from": stranger.id},
        target=root.at,
        who=root.id,
    )
    provoke(
        "refused",
        {"call": "report", "args": [1, "0" * 64], "from": stranger.id},
        target=root.at,
        who=root.id,
    )
    # the sender's side (the tool), with the rules the tool decides
    ended = root.tool("--verb=end", f"--who={stranger.id}")
    assert ended.rc == 1
    assert ended.error["rule"] == "minter-ends"
    seen.setdefault(ended.error["code"], set()).add(ended.error["rule"])
    answered = stranger.tool("--verb=answer", f"--about={asked}", "--message=not mine")
    assert answered.error["rule"] == "callee-answers"
    seen.setdefault(answered.error["code"], set()).add(answered.error["rule"])
    assert seen["refused"] >= {"hop-limit", "token", "minter-ends", "callee-answers"}
    assert "children-report" in seen["refused"]
    # the table: every code is provoked above, or is one no test can provoke here
    unprovokable = {"harness-gone", "other-uid", "internal"}  # each has its own test
    wire = {"bad-json", "bad-encoding", "unknown-family"}  # the wire's, below policy
    rules = {"project-wall", "instance-wall", "hop-limit", "token", "minter-ends"}
    rules |= {"callee-answers", "answered-once", "children-report"}
    table = documented("local.md", "- Refusal codes:", "- Text limits") - {"rule"}
    assert table - rules - wire - unprovokable == set(seen), table


def test_a_peer_of_another_uid_gets_a_refusal_naming_its_rule() -> None:
    """``other-uid`` is decided before any call is read; it still names its rule."""
    from melchior.session import serve as serve_mod

    msg = serve_mod.other_uid_refusal()
    assert msg["error"]["code"] == "other-uid"
    assert msg["error"]["rule"] == "other-uid"
    assert msg["error"]["receipt"] == "refused"


# -- the relay ------------------------------------------------------------------------------------


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[RelayProc]:
    r = start_relay(f"sqlite://{tmp_path / 'relay.db'}", tmp_path, "--body-timeout", "1")
    try:
        yield r
    finally:
        r.stop()


def _raw(url: str, head: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_every_documented_relay_refusal_names_its_rule(relay: RelayProc, tmp_path: Path) -> None:
    caller, receiver = setup_pair(relay)
    from melchior.mellan.relay.store import open_store

    store = open_store(f"sqlite://{tmp_path / 'relay.db'}")
    tid = enqueue(store)
    store.close()
    seen: dict[str, str] = {}

    def check(r: httpx.Response, status: int, code: str) -> None:
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["code"] == code, error
        assert error["rule"], error
        seen[code] = error["rule"]

    owner = relay.owner_token
    with relay.client() as c:
        check(c.get("/api/whoami"), 401, "unauthenticated")
        check(c.get("/api/whoami", headers={"authorization": "Bearer nope"}), 401, "bad-credential")
    with relay.client(caller) as c:
        check(c.post("/api/agents", json={"id": "x"}), 403, "owner-only")
        check(c.get("/api/tasks/none"), 404, "not-found")
        check(c.get("/api/nowhere"), 404, "no-such-endpoint")
        check(c.delete("/api/whoami"), 405, "method-not-allowed")
    with relay.client(owner) as c:
        check(c.post("/api/receiver/claim", json={}), 403, "agent-only")
        check(c.post("/api/agents", json={"id": "local/codex"}), 409, "exists")
        check(c.post("/api/agents", json={"id": "bad id"}), 400, "bad-request")
        bad = c.post("/api/agents", content=b"{", headers={"content-type": "application/json"})
        check(bad, 400, "bad-json")
        lone = b'{"id":"x","description":"\\ud800"}'
        check(c.post("/api/agents", content=lone, headers={"content-type": "application/json"}),
              400, "unfit-json")  # fmt: skip
        check(c.post("/api/agents", content=b"{}", headers={"content-type": "text/plain"}),
              415, "unsupported-media-type")  # fmt: skip
        huge = b'{"id":"' + b"x" * (16 * 1024 * 1024) + b'"}'
        check(c.post("/api/agents", content=huge, headers={"content-type": "application/json"}),
              413, "payload-too-large")  # fmt: skip
        check(c.post("/api/grants", json={"caller": "local/codex", "receiver": "local/codex",
              "capabilities": ["x"]}), 400, "self")  # fmt: skip
    with relay.client(receiver) as c:
        check(c.post(f"/api/receiver/tasks/{tid}/renew", json={"epoch": 9}), 409, "lease-lost")
    late = _raw(
        relay.url,
        f"POST /api/agents HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer {owner}\r\n"
        "Content-Type: application/json\r\nContent-Length: 50\r\n\r\n{".encode(),
    )
    body = late.split(b"\r\n\r\n", 1)[1]
    assert late.startswith(b"HTTP/1.1 408 ")
    assert b'"rule":"request-timeout"' in body
    seen["request-timeout"] = "request-timeout"
    # the table: every common code provoked, but the two no request can provoke at will
    table = documented("mellan.md", "Common codes:", "### Limits")
    unprovokable = {"database-unavailable", "internal"}  # each has its own fault test
    missing = table - unprovokable - {"field"} - set(seen)
    assert not missing, missing
