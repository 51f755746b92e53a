"""serve, fork and the tree, end to end: real serve children on real pipes and sockets."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from session_harness import WAIT, Harness, melchior


@pytest.fixture
def harness(runtime_dir: Path, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(runtime_dir, tmp_path / "config")
    yield h
    h.close()


def test_a_root_session_listens_answers_and_leaves_nothing_behind(harness: Harness) -> None:
    root = harness.start()
    assert root.at == harness.registry / root.id
    st = os.lstat(root.at)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) & 0o077 == 0
    assert st.st_mode & stat.S_ISVTX  # sticky: exempt from the runtime dir's clean-up
    status = root.tool("--verb=status").one
    assert status == {
        "id": root.id,
        "project": "demo",
        "role": "main",
        "parent": None,
        "busy": False,
        "working_for": None,
        "waiting": 0,
    }
    assert root.close() == 0
    assert not root.at.exists()


def test_doing_events_show_in_status(harness: Harness) -> None:
    root = harness.start()
    root.doing(busy=True, working_for=7, waiting=2)
    # The pipe is asynchronous: poll until serve has read the line.
    for _ in range(200):
        status = root.tool("--verb=status").one
        if status["busy"]:
            break
    assert status["busy"] is True
    assert status["working_for"] == 7
    assert status["waiting"] == 2


def test_fork_prints_exactly_the_seed_shape(harness: Harness) -> None:
    root = harness.start()
    minted = root.fork()
    assert list(minted) == ["project", "role", "id", "parent", "token", "environment"]
    assert minted["project"] == "demo"
    assert minted["parent"] == root.id
    assert minted["role"] == "sub"
    assert len(minted["token"]) >= 32
    assert minted["environment"] == {
        "MAGI_MELCHIOR_PROJECT": "demo",
        "MAGI_MELCHIOR_ID": minted["id"],
        "MAGI_MELCHIOR_PARENT": root.id,
        "MAGI_MELCHIOR_TOKEN": minted["token"],
    }


def test_children_and_grandchildren_come_up_as_children(harness: Harness) -> None:
    root = harness.start()
    child = root.spawn()
    grandchild = child.spawn()
    assert (harness.registry / f"{child.id}.parent").read_text().strip() == root.id
    assert (harness.registry / f"{grandchild.id}.parent").read_text().strip() == child.id
    g = grandchild.tool("--verb=status").one
    assert (g["role"], g["parent"]) == ("sub", child.id)
    listed = {s["id"]: s for s in root.tool("--verb=who").result}
    assert listed[child.id]["rule"] == "family"
    assert listed[grandchild.id]["rule"] == "instance"


def test_a_child_with_the_wrong_token_does_not_start(harness: Harness) -> None:
    root = harness.start()
    minted = root.fork()
    env = harness.env(**{**minted["environment"], "MAGI_MELCHIOR_TOKEN": "not-the-token"})
    proc = subprocess.run(
        melchior("serve"), env=env, capture_output=True, timeout=WAIT, stdin=subprocess.PIPE
    )
    assert proc.returncode == 2
    assert b"does not match the secret" in proc.stderr
    assert not (harness.registry / minted["id"]).exists()


def test_an_id_nobody_minted_does_not_start(harness: Harness) -> None:
    env = harness.env(MAGI_MELCHIOR_ID="omega-omega")
    proc = subprocess.run(melchior("serve"), env=env, capture_output=True, timeout=WAIT)
    assert proc.returncode == 2
    assert b"never minted" in proc.stderr


def test_serve_without_a_pipe_refuses_a_regular_file(harness: Harness, tmp_path: Path) -> None:
    f = tmp_path / "stdin"
    f.write_text("")
    with f.open("rb") as stdin:
        proc = subprocess.run(
            melchior("serve"), env=harness.env(), capture_output=True, timeout=WAIT, stdin=stdin
        )
    assert proc.returncode == 2
    assert b"harness's pipe" in proc.stderr


def test_bad_lines_on_the_pipe_are_skipped_not_fatal(harness: Harness) -> None:
    root = harness.start()
    assert root.proc.stdin is not None
    root.proc.stdin.write(b"not json\n" + b'{"type":"doing"}\n' + b"\xff\xfe\n")
    root.proc.stdin.flush()
    root.doing(busy=True)
    for _ in range(200):
        if root.tool("--verb=status").one["busy"]:
            break
    else:
        raise AssertionError("serve stopped reading its pipe after bad lines")


def test_pipe_lines_past_asyncio_s_64_kib_default_are_read(harness: Harness) -> None:
    """asyncio's StreamReader gives up on lines over 64 KiB unless told otherwise (A3)."""
    root = harness.start()
    root.doing(busy=True, working_for=7, waiting=0, detail="x" * 200_000)
    for _ in range(200):
        if root.tool("--verb=status").one["working_for"] == 7:
            break
    else:
        raise AssertionError("a 200 KB doing line was not read")
    assert root.proc.stdin is not None
    root.proc.stdin.write(b'{"event":"doing","pad":"' + b"y" * (3 << 20) + b'"}\n')
    root.proc.stdin.flush()  # over the pipe's 1 MiB line cap: skipped, not fatal
    root.doing(busy=False, working_for=8, waiting=0)
    for _ in range(200):
        if root.tool("--verb=status").one["working_for"] == 8:
            break
    else:
        raise AssertionError("serve stopped reading its pipe after an oversized line")


def test_sigterm_cleans_up_like_a_closed_pipe(harness: Harness) -> None:
    import signal

    root = harness.start()
    root.proc.send_signal(signal.SIGTERM)
    assert root.proc.wait(timeout=WAIT) == 0
    assert not root.at.exists()


def test_one_serve_per_session(harness: Harness) -> None:
    root = harness.start()
    env = harness.env(MAGI_MELCHIOR_ID=root.id)
    proc = subprocess.run(melchior("serve"), env=env, capture_output=True, timeout=WAIT)
    assert proc.returncode == 2
    assert b"already being served" in proc.stderr
    assert root.tool("--verb=status").one["id"] == root.id  # the first is untouched


def test_a_root_restarted_after_a_crash_keeps_its_id(harness: Harness) -> None:
    import signal

    first = harness.start()
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    again = harness.start(harness.env(MAGI_MELCHIOR_ID=first.id))
    assert again.id == first.id
    assert again.tool("--verb=status").one["role"] == "main"


def test_fork_needs_a_live_parent_and_records_the_role(harness: Harness) -> None:
    proc = subprocess.run(melchior("fork"), env=harness.env(), capture_output=True, timeout=WAIT)
    assert proc.returncode == 1
    assert b"who is the parent" in proc.stdout
    proc = subprocess.run(
        melchior("fork", "--parent=omega-psi"), env=harness.env(), capture_output=True, timeout=WAIT
    )
    assert proc.returncode == 1
    assert b"no session omega-psi" in proc.stdout
    root = harness.start()
    front = root.spawn("main")
    assert front.tool("--verb=status").one["role"] == "main"
    assert (harness.registry / f"{front.id}.role").read_text().strip() == "main"


def test_closing_the_pipe_with_a_client_connected_exits_quietly(harness: Harness) -> None:
    import socket

    root = harness.start()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(root.at))
    try:
        assert root.proc.stdin is not None
        root.proc.stdin.close()
        assert root.proc.wait(timeout=WAIT) == 0
        assert root.proc.stderr is not None
        assert root.proc.stderr.read() == b""
        assert not root.at.exists()
    finally:
        client.close()
