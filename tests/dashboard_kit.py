"""Helpers for the dashboard tests: a browser-like HTTP client that signs in the way the
sign-in page does (cookie, then the form with its token), a task sent through the
real A2A entry, and the events of a live page's stream."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

import httpx

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    m = CSRF.search(html)
    assert m is not None, "no CSRF field on the page"
    return m.group(1)


def origin_of(url: str) -> str:
    return url.rstrip("/")


def browser(url: str) -> httpx.Client:
    """A client that keeps cookies and says what a browser says on same-origin posts."""
    return httpx.Client(base_url=url, follow_redirects=False, timeout=30.0)


def sign_in(url: str, token: str) -> tuple[httpx.Client, str]:
    """A signed-in client and the session's CSRF token."""
    c = browser(url)
    page = c.get("/ui/signin")
    assert page.status_code == 200, page.text
    r = c.post(
        "/ui/signin",
        data={"csrf": csrf_of(page.text), "token": token, "next": "/ui/"},
        headers={"origin": origin_of(url), "sec-fetch-site": "same-origin"},
    )
    assert r.status_code == 303, r.text
    home = c.get("/ui/")
    assert home.status_code == 200, home.text
    return c, csrf_of(home.text)


def post_form(c: httpx.Client, path: str, data: dict[str, Any], **headers: str) -> httpx.Response:
    base = {"origin": origin_of(str(c.base_url)), "sec-fetch-site": "same-origin"}
    return c.post(path, data=data, headers=base | headers)


def send_task(url: str, ws: str, receiver: str, token: str, text: str) -> str:
    """A task from the caller holding ``token``, through the A2A entry; its id."""
    body = {
        "message": {
            "messageId": secrets.token_hex(8),
            "role": "ROLE_USER",
            "parts": [{"text": text}],
        },
        "configuration": {"returnImmediately": True},
    }
    r = httpx.post(
        f"{url}/a2a/{ws}/{receiver}/message:send",
        json=body,
        headers={"authorization": f"Bearer {token}", "A2A-Version": "1.0"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    task_id: str = r.json()["task"]["id"]
    return task_id


def frames(lines: Iterator[str], count: int) -> list[tuple[str, str, dict[str, str]]]:
    """The next ``count`` events of a stream's lines: (event id, event name, data)."""
    out: list[tuple[str, str, dict[str, str]]] = []
    ident, name, data = "", "", ""
    for line in lines:
        if line.startswith("id: "):
            ident = line[4:]
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line == "" and data:
            out.append((ident, name, json.loads(data)))
            ident, name, data = "", "", ""
            if len(out) == count:
                return out
    return out
