"""docs/dashboard.md and the README: every picture they show exists, every dashboard page
they name is a route, and every page has its screenshot."""

from __future__ import annotations

import re
from pathlib import Path

from starlette.routing import Route

from melchior.mellan.relay.dashboard import routes

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "dashboard.md"


def test_every_picture_shown_exists_and_every_page_has_one() -> None:
    pictures = set()
    for doc in (DOC, ROOT / "README.md"):
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", doc.read_text()):
            path = (doc.parent / target).resolve()
            assert path.is_file(), f"{doc.name} shows {target}, which does not exist"
            pictures.add(path.stem)
    assert {"overview", "agents", "grants", "tasks", "task", "audit", "tasks-phone"} <= pictures


def test_pages_the_doc_names_are_routes() -> None:
    paths = {r.path for r in routes() if isinstance(r, Route)}
    named = set(re.findall(r"`/ui(/[a-z/]*)`", DOC.read_text()))
    assert named
    assert named <= paths
