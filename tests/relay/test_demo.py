"""``mellan demo`` as a newcomer runs it: every step works, the answer and the plane's
exchange are printed with a working one-time dashboard link, Ctrl-C stops it cleanly,
and nothing is read from or left in the user's own state."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dashboard_kit import browser, csrf_of, post_form

MELLAN = str(Path(sys.executable).parent / "mellan")
DEADLINE = 120.0  # for something broken on a loaded machine, not a measured threshold


def env_for(tmp_path: Path) -> dict[str, str]:
    """The user's environment: their own state directories, a stored login, a token."""
    env = dict(os.environ)
    for kind in ("DATA", "CONFIG", "STATE", "CACHE"):
        (tmp_path / "home" / kind.lower()).mkdir(parents=True)
        env[f"XDG_{kind}_HOME"] = str(tmp_path / "home" / kind.lower())
    env["MELLAN_TOKEN"] = "mln_the_users_own_token"
    env["MELLAN_RELAY"] = "http://127.0.0.1:9"
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    return env


def nothing_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_the_demo_shows_the_whole_system_and_leaves_nothing(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    done = subprocess.run(
        [MELLAN, "demo", "--exit"], capture_output=True, text=True, env=env, timeout=DEADLINE
    )
    out = done.stdout
    assert done.returncode == 0, (out, done.stderr)
    # the task went through a real receiver and came back
    assert "completed: inspected (incident.inspect for local/codex): what broke last night?" in out
    assert "complete acknowledged (ok)" in out
    # two agents talked: a held note, answered y, the answer routed back
    assert "planner | question: write to ledger? y / n" in out
    assert "planner | note: note to ledger delivered (hop 1, operator-yes)" in out
    assert "planner | done: ledger says: We spent 1234 EUR in August." in out
    # each step printed the command a person types
    for said in ("$ mellan relay", "$ mellan grant add local/codex private/ops incident.inspect",
                 "$ mellan route approve rt_", "$ mellan dashboard link"):  # fmt: skip
        assert said in out
    assert re.search(r"sign in once with: http://127\.0\.0\.1:\d+/ui/signin/link\?code=", out)
    # nothing left: its own directory is gone, the user's state untouched
    root = re.search(r"agents in (\S+)", out)
    assert root is not None
    assert not Path(root.group(1)).exists()
    assert nothing_under(tmp_path / "home") == []
    assert list((tmp_path / "tmp").iterdir()) == []


def _free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_the_demo_keeps_serving_until_ctrl_c_and_its_link_signs_in(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    proc = subprocess.Popen(
        [MELLAN, "demo"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C stops them" in line:
                break
        text = "".join(lines)
        assert "Ctrl-C stops them" in text, text
        found = re.search(
            r"sign in once with: (http://127\.0\.0\.1:(\d+))(/ui/signin/link\S+)", text
        )
        assert found is not None, text
        base, port, path = found.group(1), int(found.group(2)), found.group(3)
        # the printed link signs a browser in to the demo's dashboard
        c = browser(base)
        page = c.get(path)
        assert page.status_code == 200
        code = path.split("code=", 1)[1]
        r = post_form(c, "/ui/signin/link", {"csrf": csrf_of(page.text), "code": code})
        assert r.status_code == 303, r.text
        tasks = c.get("/ui/tasks")
        assert tasks.status_code == 200
        assert "incident.inspect" in tasks.text
        # Ctrl-C: the receiver and the relay stop, the directory goes, exit 0
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, rest
    assert "stopped; nothing of the demo is left behind" in rest
    assert _free(port)
    assert list((tmp_path / "tmp").iterdir()) == []
    assert nothing_under(tmp_path / "home") == []
