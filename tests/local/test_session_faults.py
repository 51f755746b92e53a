"""The registry's faults, each provoked for real: stale sockets, half-started servers,
replaced inodes, wrong modes, a deleted directory, other uids and bad calls."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from melchior.session import serve as serve_mod
from melchior.session.client import Unreachable, call_once, connect, request
from melchior.session.registry import probe, sweep
from melchior.wire import frames
from melchior.wire.calls import Refused
from session_harness import WAIT, Harness, melchior


@pytest.fixture
def harness(runtime_dir: Path, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(runtime_dir, tmp_path / "config")
    yield h
    h.close()


def test_a_killed_serve_is_found_stale_on_the_first_call_and_removed(harness: Harness) -> None:
    root = harness.start()
    victim = harness.start()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    assert victim.at.exists()  # killed: it did not get to clean up
    r = root.tool("--verb=tell", f"--who={victim.id}", "--message=are you there?")
    assert r.rc == 1
    assert r.error["code"] == "stale"
    assert r.error["receipt"] == "refused"
    assert not victim.at.exists()
    r = root.tool("--verb=tell", f"--who={victim.id}", "--message=again?")
    assert r.rc == 1
    assert r.error["code"] == "unknown"


def test_who_probes_and_does_not_list_a_killed_serve(harness: Harness) -> None:
    root = harness.start()
    alive = harness.start()
    victim = harness.start()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    assert victim.at.exists()  # killed: it did not get to clean up
    r = harness.tool("--verb=who")  # the operator sees every session there is
    assert r.rc == 0
    assert {e["id"] for e in r.result} == {root.id, alive.id}
    assert not victim.at.exists()  # found stale by the probe and removed
    r = root.tool("--verb=who")
    assert r.rc == 0
    assert {e["id"] for e in r.result} == {alive.id}
    assert alive.tool("--verb=status").rc == 0  # probed sessions keep answering


def test_sweep_waits_once_and_keeps_a_socket_that_starts_listening(tmp_path: Path) -> None:
    late = tmp_path / "alpha-beta"
    dead = tmp_path / "gamma-delta"
    live = tmp_path / "eta-theta"
    s_late, s_dead, s_live = (socket.socket(socket.AF_UNIX) for _ in range(3))
    try:
        s_late.bind(os.fspath(late))  # bound, not listening yet: refuses like a dead one
        s_dead.bind(os.fspath(dead))
        s_dead.close()  # bound then closed: a killed serve's leftover
        s_live.bind(os.fspath(live))
        s_live.listen(1)
        pauses: list[None] = []

        def pause() -> None:
            pauses.append(None)
            s_late.listen(1)

        paths = {"late": late, "dead": dead, "live": live, "gone": tmp_path / "no-such"}
        assert sweep(paths, pause=pause) == {"late", "live"}
        assert len(pauses) == 1  # one shared pause, not one per refused entry
        assert late.exists()
        assert live.exists()
        assert not dead.exists()
    finally:
        for s in (s_late, s_dead, s_live):
            s.close()


def test_a_full_backlog_is_busy_not_dead(tmp_path: Path) -> None:
    """A listener that is not accepting fills up; EAGAIN must not read as dead (A3)."""
    path = tmp_path / "alpha-beta"
    server = socket.socket(socket.AF_UNIX)
    server.bind(os.fspath(path))
    server.listen(0)
    waiting: list[socket.socket] = []
    try:
        while True:  # fill the backlog until the kernel says "try again"
            c = socket.socket(socket.AF_UNIX)
            c.setblocking(False)
            waiting.append(c)
            try:
                c.connect(os.fspath(path))
            except BlockingIOError:
                break
        assert probe(path, pause=lambda: None) == "live"
        assert sweep({"busy": path}, pause=lambda: None) == {"busy"}
        assert path.exists()
    finally:
        for c in waiting:
            c.close()
        server.close()


def test_a_server_between_bind_and_listen_is_not_mistaken_for_dead(tmp_path: Path) -> None:
    path = tmp_path / "alpha-beta"
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.fspath(path))  # bound, not listening: refuses exactly like a dead one
    try:
        assert probe(path, pause=lambda: s.listen(1)) == "live"
        assert path.exists()
    finally:
        s.close()


def test_publishing_uses_a_hidden_name_until_listening(harness: Harness) -> None:
    root = harness.start()
    half = harness.registry / ".kappa-pi.tmp"
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.fspath(half))
    try:
        assert {x["id"] for x in harness.tool("--verb=who").result} == {root.id}
        assert half.exists()
    finally:
        s.close()


def test_a_replaced_inode_is_not_unlinked_by_the_prober(tmp_path: Path) -> None:
    path = tmp_path / "alpha-beta"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(os.fspath(path))
    dead.close()
    fresh = socket.socket(socket.AF_UNIX)

    def replace() -> None:
        os.unlink(path)
        fresh.bind(os.fspath(path))
        fresh.listen(1)

    try:
        assert probe(path, pause=replace) == "live"
        assert path.exists()
    finally:
        fresh.close()


def test_a_replaced_inode_is_not_unlinked_by_serve_on_exit(harness: Harness) -> None:
    root = harness.start()
    other = socket.socket(socket.AF_UNIX)
    tmp = harness.registry / ".replacement"
    other.bind(os.fspath(tmp))
    os.replace(tmp, root.at)
    try:
        assert root.close() == 0
        assert root.at.exists()  # the replacement survived serve's clean-up
    finally:
        other.close()


def test_a_wrong_mode_directory_is_refused(harness: Harness) -> None:
    harness.start().close()
    harness.registry.chmod(0o755)
    proc = subprocess.run(melchior("serve"), env=harness.env(), capture_output=True, timeout=WAIT)
    assert proc.returncode == 2
    assert b"chmod 700" in proc.stderr
    r = harness.tool("--verb=who")
    assert r.rc == 1
    assert "0755" in r.error["reason"]


def test_a_deleted_runtime_directory_is_recovered(harness: Harness) -> None:
    root = harness.start()
    child = root.spawn()
    shutil.rmtree(harness.runtime_dir / "melchior")
    root.doing(busy=False)  # a doing line makes serve check at once
    child.doing(busy=False)
    again = root.next_event("listening")
    assert again["recovered"] is True
    assert Path(again["at"]) == root.at
    assert child.next_event("listening")["recovered"] is True
    assert child.tool("--verb=status").one["parent"] == root.id
    r = child.tool("--verb=tell", f"--who={root.id}", "--message=still here")
    assert r.one["receipt"] == "delivered"


def test_unknown_verb_bad_args_and_unknown_family_are_refused_replies(harness: Harness) -> None:
    root = harness.start()
    with pytest.raises(Refused) as exc:
        call_once(root.at, "dance", [], sender=None, who=root.id)
    assert exc.value.code == "unknown-verb"
    assert "status" in exc.value.reason
    with pytest.raises(Refused) as exc:
        call_once(root.at, "tell", [42], sender=None, who=root.id)
    assert exc.value.code == "bad-args"
    with pytest.raises(Refused) as exc:
        call_once(root.at, "tell", ["x", "shout"], sender=None, who=root.id)
    assert exc.value.code == "bad-args"
    assert "attention" in exc.value.reason
    with pytest.raises(Refused) as exc:
        call_once(root.at, "tell", ["x" * (1024 * 1024 + 1)], sender=None, who=root.id)
    assert exc.value.code == "too-large"
    with pytest.raises(Refused) as exc:
        call_once(root.at, "ask", ["anonymous?"], sender=None, who=root.id)
    assert exc.value.code == "anonymous"
    sock = connect(root.at, who=root.id)
    try:
        reply = request(sock, {"call": "status", "args": [], "family": 99}, who=root.id)
        assert reply["ok"] is False
        assert reply["error"]["code"] == "unknown-family"
        # The connection is still usable after a refusal.
        reply = request(sock, {"call": "status", "args": []}, who=root.id)
        assert reply["ok"] is True
        lone = rb'{"call":"tell","args":["\ud800"]}'  # valid JSON, not valid Unicode
        sock.sendall(struct.pack(">I", len(lone)) + lone)
        reply = frames.recv(sock)
        assert reply is not None
        assert reply["error"]["code"] == "bad-args"
        assert "surrogate" in reply["error"]["reason"]
        sock.sendall(struct.pack(">I", 3) + b"\xff\xfe\xfd")
        bad = frames.recv(sock)
        assert bad is not None
        assert bad["error"]["code"] == "bad-encoding"
        # A repeated key is refused, not "last one wins": this would otherwise answer 'verbs'.
        twice = b'{"call":"status","call":"verbs","args":[]}'
        sock.sendall(struct.pack(">I", len(twice)) + twice)
        dup = frames.recv(sock)
        assert dup is not None
        assert dup["ok"] is False
        assert dup["error"]["code"] == "bad-json"
        assert "duplicate key 'call'" in dup["error"]["reason"]
        reply = request(sock, {"call": "status", "args": []}, who=root.id)
        assert reply["ok"] is True  # and the connection is still usable
    finally:
        sock.close()


def test_the_verbs_call_matches_melchior_verbs(harness: Harness) -> None:
    root = harness.start()
    listed = call_once(root.at, "verbs", [], sender=None, who=root.id)
    printed = subprocess.run(melchior("verbs"), capture_output=True, check=True, timeout=WAIT)
    import json

    assert json.loads(printed.stdout)["result"] == listed
    assert {v["name"] for v in listed} >= {"status", "tell", "ask", "answer", "report", "end"}


def test_oversized_and_non_utf8_reports_are_refused_and_nothing_is_lost(harness: Harness) -> None:
    from melchior.session.reports import MAX_REPORT

    root = harness.start()
    assert root.tool("--verb=report", "--message=keep me").one["revision"] == 1
    big = root.tool("--verb=report", "--about=-", stdin=b"x" * (MAX_REPORT + 1))
    assert big.rc == 1
    assert "limit" in big.error["reason"]
    assert "nothing was stored" in big.error["reason"]
    bad = root.tool("--verb=report", "--about=-", stdin=b"ok so far \xc3\x28")
    assert bad.rc == 1
    assert "not valid UTF-8" in bad.error["reason"]
    assert "offset 10" in bad.error["reason"]
    kept = root.tool("--verb=report", "--about=json").one
    assert (kept["text"], kept["revision"]) == ("keep me", 1)


# -- other uids ------------------------------------------------------------------------------


def _serve_in_process(path: Path, fake_uid: int | None, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """Serve one connection of a peer the way serve does (Serve.protocol); what it read."""
    from melchior.session.identity import Identity
    from melchior.session.registry import Registry

    if fake_uid is not None:
        monkeypatch.setattr(serve_mod, "peer_uid", lambda _sock: fake_uid)

    async def main() -> bytes:
        me = Identity("demo", "alpha-beta", "main", None, None)
        srv = serve_mod.Serve(me, Registry(path.parent, "demo"), "instance", serve_mod.Output(None))
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(srv.protocol, path=os.fspath(path))
        async with server:
            os.chmod(path, 0o777)
            proc = await asyncio.create_subprocess_exec(
                *_peer_cmd(path, drop=fake_uid is None), stdout=asyncio.subprocess.PIPE
            )
            out, _ = await proc.communicate()
            return out

    return asyncio.run(main())


def _peer_cmd(path: Path, *, drop: bool) -> list[str]:
    code = (
        "import os,socket,struct,sys\n"
        + ("os.setgid(65534); os.setuid(65534)\n" if drop else "")
        + "s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        # A refused peer is told at once, before it says anything.
        "sys.stdout.buffer.write(s.recv(65536))\n"
    )
    return [sys.executable, "-c", code, os.fspath(path)]


@pytest.mark.skipif(os.getuid() != 0, reason="a real second uid needs root to switch to")
def test_a_peer_of_another_uid_is_refused_by_kernel_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="mo-", dir="/tmp"))
    d.chmod(0o777)  # reachable by uid 65534: only the credential check stands in the way
    try:
        got = _serve_in_process(d / "alpha-beta", None, monkeypatch)
    finally:
        shutil.rmtree(d)
    assert b"other-uid" in got
    assert b"own user" in got


def test_a_peer_of_another_uid_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got = _serve_in_process(tmp_path / "alpha-beta", os.getuid() + 1, monkeypatch)
    assert b"other-uid" in got


@pytest.mark.skipif(os.getuid() != 0, reason="a real second uid needs root to switch to")
def test_the_client_refuses_a_server_of_another_uid() -> None:
    """A socket served by another user (here: nobody, for real) is never called."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="mu-", dir="/tmp"))
    d.chmod(0o777)  # nobody may bind here; only the credential check stands in the way
    path = d / "alpha-beta"
    code = (
        "import os,socket,sys\n"
        "os.setgid(65534); os.setuid(65534); os.umask(0)\n"
        "s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(4)\n"
        "print('ready', flush=True)\n"
        "c,_=s.accept(); sys.stdout.write(repr(c.recv(100))+'\\n'); sys.stdout.flush()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, os.fspath(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        with pytest.raises(Unreachable) as exc:
            connect(path, who="alpha-beta")
        assert exc.value.code == "other-uid"
        proc.wait(timeout=WAIT)
        assert proc.stdout.read() == "b''\n"  # closed before a byte was sent
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(d)
