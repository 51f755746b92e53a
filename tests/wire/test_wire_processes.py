"""Two real processes talking over a real unix socket and a real pipe."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from melchior.wire import Refused, WireError, call, frames, unwrap
from paths_kit import TESTS

PEER = TESTS / "peers" / "wire_peer.py"


@pytest.fixture
def peer() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    d = tempfile.mkdtemp(prefix="mw-", dir="/tmp")
    path = f"{d}/peer"
    proc = subprocess.Popen(
        [sys.executable, str(PEER), path], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    first = json.loads(proc.stdout.readline())
    assert first == {"event": "listening", "at": path}
    yield proc, path
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    Path(path).unlink(missing_ok=True)
    Path(d).rmdir()


def _connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    return s


def _ask(s: socket.socket, msg: dict[str, object]) -> dict[str, object]:
    frames.send(s, msg)
    reply = frames.recv(s)
    assert reply is not None
    return reply


def test_calls_refusals_and_events_over_a_socket(peer: tuple[subprocess.Popen[bytes], str]) -> None:
    _, path = peer
    with _connect(path) as s:
        assert unwrap(_ask(s, call("echo", ["ψ", 12345678901234567890], id="a"))) == [
            "ψ",
            12345678901234567890,
        ]
        with pytest.raises(Refused, match="refused on purpose"):
            unwrap(_ask(s, call("refuse")))
        frames.send(s, {"event": "note", "text": "no answer expected"})
        # a bad body is refused and the connection stays usable
        s.sendall(struct.pack(">I", 5) + b"\xff\xfe\xfd{}")
        bad = _ask(s, call("echo", [1]))  # the refusal of the bad body comes first
        assert bad["ok"] is False
        assert "UTF-8" in str(bad["error"])
        assert unwrap(frames.recv(s) or {}) == [1]
        assert unwrap(_ask(s, call("events"))) == [{"event": "note", "text": "no answer expected"}]
        reply = _ask(s, {"type": "status"})
        assert reply["ok"] is False
        assert "neither a call" in str(reply["error"])
        reply = _ask(s, {"call": "echo", "args": [], "family": 99})
        assert reply["ok"] is False
        assert "newer" in str(reply["error"])


def test_oversized_frame_is_refused_then_closed(peer: tuple[subprocess.Popen[bytes], str]) -> None:
    _, path = peer
    with _connect(path) as s:
        s.sendall(struct.pack(">I", 4096))  # peer's limit is 1024; no body follows
        reply = frames.recv(s)
        assert reply is not None
        assert reply["ok"] is False
        assert "over the 1024-byte limit" in str(reply["error"])
        assert frames.recv(s) is None  # closed by the peer
    with _connect(path) as s:  # the server itself is fine
        assert unwrap(_ask(s, call("echo", ["still here"]))) == ["still here"]


def test_zero_length_frame_is_refused_then_closed(
    peer: tuple[subprocess.Popen[bytes], str],
) -> None:
    _, path = peer
    with _connect(path) as s:
        s.sendall(b"\x00\x00\x00\x00")
        reply = frames.recv(s)
        assert reply is not None
        assert "length is 0" in str(reply["error"])
        assert frames.recv(s) is None


def test_truncated_frame_from_client_does_not_hurt_server(
    peer: tuple[subprocess.Popen[bytes], str],
) -> None:
    _, path = peer
    with _connect(path) as s:
        s.sendall(frames.pack(call("echo", ["x" * 50]))[:20])
    with _connect(path) as s:
        assert unwrap(_ask(s, call("echo", [2]))) == [2]


def test_pipe_both_directions_and_exit_on_eof(peer: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, _ = peer
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(b'{"event":"doing","busy":true,"working_for":7,"waiting":0}\n')
    proc.stdin.write(b"garbage\n")
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline()) == {
        "event": "pong",
        "got": {"event": "doing", "busy": True, "working_for": 7, "waiting": 0},
    }
    refusal = json.loads(proc.stdout.readline())
    assert refusal["event"] == "refused"
    assert "line 2" in refusal["reason"]
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0


def test_client_sees_truncation_when_server_dies(tmp_path: Path) -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(frames.pack({"ok": True, "family": 1, "n": 0, "result": []})[:7])
        a.close()
        with pytest.raises(WireError, match="inside a frame"):
            frames.recv(b)
