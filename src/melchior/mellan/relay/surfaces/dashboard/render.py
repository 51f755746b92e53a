"""Turning store values into pages: the template environment (autoescaped), the words
and classes a task state is shown with, and times in one readable form."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from melchior.mellan.relay.store.base import TaskState

HERE = Path(__file__).parent

STATE_WORDS = {
    TaskState.QUEUED: "queued",
    TaskState.LEASED: "working",
    TaskState.SUCCEEDED: "completed",
    TaskState.INPUT_REQUIRED: "input required",
    TaskState.FAILED: "failed",
    TaskState.CANCELLED: "canceled",
}
"""How a task state reads on the page (the A2A names, in words)."""

PAGES = (
    ("overview", "Overview", "/"),
    ("agents", "Agents", "/agents"),
    ("grants", "Grants", "/grants"),
    ("routes", "Routes", "/routes"),
    ("tasks", "Tasks", "/tasks"),
    ("audit", "Audit", "/audit"),
)


def when(iso: str | None) -> str:
    """``2025-03-01 14:02:07 UTC`` from a stored ISO time (empty for none)."""
    if not iso:
        return ""
    try:
        moment = datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return iso
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def state_word(state: TaskState | str) -> str:
    return STATE_WORDS.get(TaskState(state), str(state))


def short(ident: str, n: int = 8) -> str:
    return ident[:n]


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every value is text until proven markup
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = when
    env.filters["state_word"] = state_word
    env.filters["short"] = short
    return env


ENV = _environment()


def base_path(request: Request) -> str:
    """Where the dashboard is mounted (``/ui``), from the request itself."""
    return str(request.scope.get("root_path") or "")


def fragment(name: str, **context: Any) -> str:
    return ENV.get_template(name).render(**context)


def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
    base = base_path(request)
    full = {
        "base": base,
        "static": lambda f: f"{base}/static/{f}",
        "pages": PAGES,
        "current": "",
        "owner": None,
        "notice": "",
        "error": None,
        **context,
    }
    return HTMLResponse(ENV.get_template(name).render(**full), status_code=status)
