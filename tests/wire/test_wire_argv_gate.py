"""argv output parsing and gate-wire, including a run over every wire fixture in the repo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from melchior.wire import WireError, argv, frames
from melchior.wire.gate import FORBIDDEN_TAGS, check, scan_frames, scan_lines
from paths_kit import REPO


def test_argv_parse_exactly_one_object() -> None:
    assert argv.parse(b'{"ok":true,"family":1,"n":0,"result":[]}\n') == {
        "ok": True,
        "family": 1,
        "n": 0,
        "result": [],
    }
    with pytest.raises(WireError, match="printed nothing"):
        argv.parse(b"  \n")
    with pytest.raises(WireError, match="more than one line"):
        argv.parse(b'{"a":1}\n{"b":2}\n')
    with pytest.raises(WireError, match="not JSON"):
        argv.parse(b"Traceback (most recent call last):")


@pytest.mark.parametrize("key", FORBIDDEN_TAGS)
def test_every_competing_tag_key_is_refused(key: str) -> None:
    offences = check({key: "message", "text": "hi"})
    assert any(k == key for k, _ in offences)


def test_clean_messages_pass() -> None:
    for msg in (
        {"call": "status", "args": []},
        {"event": "listening", "at": "x"},
        {"ok": True, "family": 1, "n": 1, "result": [{"type": "nested is fine"}]},
    ):
        assert check(msg) == []


def test_scan_lines_names_line_and_key() -> None:
    data = b'{"event":"a"}\n\n{"type":"b"}\nnope\n'
    found = [str(o) for o in scan_lines("f", data)]
    assert "f:3: type: tag key 'type' is not allowed; the tag key is 'event'" in found
    assert any(s.startswith("f:4: -:") for s in found)
    assert not any(s.startswith("f:1") for s in found)


def test_scan_frames() -> None:
    data = frames.pack({"event": "ok"}) + frames.pack({"kind": "x"})
    found = scan_frames("cap", data)
    assert next((o.line, o.key) for o in found) == (2, "kind")
    assert scan_frames("cap", frames.pack({"event": "ok"})[:-1])[0].reason.startswith(
        "connection closed inside a frame"
    )


def _run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "melchior.cli", *args], input=stdin, capture_output=True, check=False
    )


def test_gate_wire_command_exit_status_and_json(tmp_path: Path) -> None:
    good = tmp_path / "good.ndjson"
    good.write_text('{"event":"doing","busy":true,"working_for":7,"waiting":0}\n')
    bad = tmp_path / "bad.ndjson"
    bad.write_text('{"action":"go"}\n')
    assert _run("gate-wire", str(good)).returncode == 0
    res = _run("gate-wire", str(good), str(bad))
    assert res.returncode == 1
    assert f"{bad}:1: action:" in res.stdout.decode()
    res = _run("gate-wire", "--json", "-", stdin=b'{"method":"x"}\n')
    report = json.loads(res.stdout)
    assert report["ok"] is False
    assert report["offences"][0]["key"] == "method"
    cap = tmp_path / "cap.bin"
    cap.write_bytes(frames.pack({"call": "status", "args": []}))
    assert _run("gate-wire", "--frames", str(cap)).returncode == 0
    res = _run("gate-wire", str(tmp_path / "missing"))
    assert res.returncode == 2
    assert b"cannot read" in res.stderr


def test_every_wire_fixture_in_the_repo_passes_the_gate() -> None:
    fixtures = sorted(
        p for p in REPO.rglob("*.ndjson") if ".venv" not in p.parts and ".git" not in p.parts
    )
    assert fixtures, "the repository should hold wire fixtures (tests/fixtures/wire/*.ndjson)"
    for path in fixtures:
        offences = scan_lines(str(path.relative_to(REPO)), path.read_bytes())
        assert offences == [], "\n".join(map(str, offences))
