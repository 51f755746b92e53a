"""docs/dashboard.md and the README: every picture they show exists, every dashboard page
they name is a route, and every page has its screenshot."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from starlette.routing import Route

from doc_kit import free_port, run_bash, script_bin, sh_blocks
from melchior.mellan.relay.surfaces.dashboard import routes
from paths_kit import REPO

ROOT = REPO
DOC = ROOT / "docs" / "dashboard.md"


def test_every_picture_shown_exists_and_every_page_has_one() -> None:
    pictures = set()
    for doc in (DOC, ROOT / "README.md"):
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", doc.read_text()):
            path = (doc.parent / target).resolve()
            assert path.is_file(), f"{doc.name} shows {target}, which does not exist"
            pictures.add(path.stem)
    assert {
        "overview",
        "agents",
        "grants",
        "tasks",
        "task",
        "audit",
        "tasks-phone",
        "routes",
    } <= pictures


def test_pages_the_doc_names_are_routes() -> None:
    paths = {r.path for r in routes() if isinstance(r, Route)}
    named = set(re.findall(r"`/ui(/[a-z/]*)`", DOC.read_text()))
    assert named
    assert named <= paths


def test_opening_it_runs_as_written(tmp_path: Path) -> None:
    """The two commands of "Opening it", pasted into bash (on a free port): the relay
    starts and is waited for, the owner token is where the doc says, and the relay's
    root leads to the sign-in page."""
    if shutil.which("curl") is None:
        pytest.skip("the doc waits for the relay with curl")
    blocks = sh_blocks("dashboard.md", "Opening it")
    assert len(blocks) == 2
    port = str(free_port())
    ask = "\ncurl -s -o /dev/null -w '%{http_code} %{redirect_url}\\n' http://127.0.0.1:" + port
    script = "\n".join(blocks).replace("8787", port) + ask + "/" + ask + "/ui/"
    script += "\nkill $!"  # the relay, the script's one background job
    done = run_bash(
        script,
        bindir=script_bin("mellan"),
        drop=["MELLAN_"],
        env={"XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "c")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    token = (tmp_path / "data" / "mellan" / "owner.token").read_text().strip()
    lines = done.stdout.strip().splitlines()
    assert token in lines  # `cat` printed the owner token
    lines = [line for line in lines if re.match(r"\d{3} ", line)]  # curl's answers
    # the root leads to /ui/ (here straight to its sign-in, which returns there)
    root = r"30[237] http://127\.0\.0\.1:\d+/ui/(signin\?next=%2Fui%2F.*)?"
    assert re.fullmatch(root, lines[-2]), lines[-2]
    assert re.fullmatch(r"303 http://127\.0\.0\.1:\d+/ui/signin\?next=.*", lines[-1]), lines[-1]
