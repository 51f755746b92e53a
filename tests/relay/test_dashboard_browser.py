"""The dashboard in a real headless browser (Debian's chromium, driven by Playwright), against
a real ``mellan relay`` process and a real receiver loop on the receiver API.

Flows: sign in; add an agent, mint and copy an enrollment code, add a grant (and see its
arrow); watch a task move through its states live while the receiver works it, and
cancel one; filter the audit log and watch it follow; sign out. Refusals: a foreign
page's post, an idle session, no session at all.

Screenshots of every page (desktop width, and the tasks page at phone width) are taken
into a temporary directory; ``MELLAN_SCREENSHOTS=docs/dashboard`` (``make screenshots``)
writes them where the docs show them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from a2a_kit import Receiver
from dashboard_kit import send_task
from relay_proc import RelayProc, add_agent, enroll_and_join, ok, owner_fixture, start_relay
from sealed_kit import Sealed, sealed_fixture

__all__ = ["owner_fixture", "sealed_fixture"]

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT = 20_000  # ms: a hang guard for live updates, not a measured threshold
WS = "default"

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (test extra) missing")


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{CHROMIUM} is required on CI (apt-get install chromium)")
        pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(name="relay")
def relay_fixture(tmp_path: Path) -> Iterator[RelayProc]:
    r = start_relay(f"sqlite://{tmp_path / 'relay.db'}", tmp_path)
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture(name="shots")
def shots_fixture(tmp_path: Path) -> Path:
    target = os.environ.get("MELLAN_SCREENSHOTS")
    out = Path(target) if target else tmp_path / "shots"
    out.mkdir(parents=True, exist_ok=True)
    return out


def _page(browser: object, width: int = 1280, height: int = 860) -> sync_api.Page:
    context = browser.new_context(viewport={"width": width, "height": height})  # type: ignore[attr-defined]
    page: sync_api.Page = context.new_page()
    page.set_default_timeout(WAIT)
    return page


def _sign_in(page: sync_api.Page, relay: RelayProc, path: str = "/ui/") -> None:
    page.goto(relay.url + path)
    assert "/ui/signin" in page.url
    page.locator("#token").fill(relay.owner_token)
    with page.expect_navigation():
        page.get_by_role("button", name="Sign in").click()
    assert page.url.endswith(path)


def _shoot(page: sync_api.Page, shots: Path, name: str) -> None:
    page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
    assert (shots / f"{name}.png").stat().st_size > 1000


def test_owner_adds_an_agent_a_code_and_a_grant_then_signs_out(
    chromium: object, relay: RelayProc, shots: Path
) -> None:
    add_agent(relay, "local/codex", "code.review")
    page = _page(chromium)
    # by keyboard alone: the token field has focus, Enter signs in; Tab reaches the skip link
    page.goto(relay.url + "/ui/agents")
    page.keyboard.type(relay.owner_token)
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert page.url.endswith("/ui/agents")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.locator("#agent-id").fill("private/ops")
    page.locator("#agent-desc").fill("the ops box")
    page.locator("#agent-caps").fill("incident.inspect = Read the incident log\ndeploy")
    with page.expect_navigation():
        page.get_by_role("button", name="Add agent").click()
    assert "Agent added" in page.locator(".notice").inner_text()
    row = page.locator('tr[data-agent="private/ops"]')
    assert "incident.inspect" in row.inner_text()
    # an enrollment code: shown once, copyable, and it works with mellan join's API
    with page.expect_navigation():
        row.get_by_role("button", name="New code").click()
    code = page.locator("#new-code").input_value()
    assert code.startswith("mlj_")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.locator('button[data-copy="new-code"]').click()
    assert page.evaluate("navigator.clipboard.readText()") == code
    _shoot(page, shots, "agents")
    with relay.client() as c:
        joined = ok(c.post("/api/join", json={"code": code}), 201)
    assert joined["agent"] == "private/ops"
    # a grant, drawn as an arrow from the caller to the receiver
    page.goto(relay.url + "/ui/grants")
    page.locator("#caller").select_option("local/codex")
    page.locator("#receiver").select_option("private/ops")
    page.locator("#caps").fill("incident.inspect")
    with page.expect_navigation():
        page.get_by_role("button", name="Add grant").click()
    assert "Grant added" in page.locator(".notice").inner_text()
    arrow = page.locator('g.grant[data-caller="local/codex"][data-receiver="private/ops"]')
    assert arrow.count() == 1
    assert page.locator('g.grant[data-caller="private/ops"]').count() == 0
    assert "incident.inspect" in (arrow.text_content() or "")
    # sign out: the session is gone
    with page.expect_navigation():
        page.get_by_role("button", name="Sign out").click()
    assert "You are signed out" in page.content()
    page.goto(relay.url + "/ui/agents")
    assert "/ui/signin" in page.url
    page.context.close()


def _world(relay: RelayProc) -> tuple[str, str]:
    """Agents and a grant through the control API; tokens (caller, receiver)."""
    add_agent(relay, "private/ops", "incident.inspect", "deploy")
    add_agent(relay, "local/codex", "code.review")
    with relay.owner() as c:
        grant = {"caller": "local/codex", "receiver": "private/ops",
                 "capabilities": ["incident.inspect"]}  # fmt: skip
        ok(c.post("/api/grants", json=grant), 201)
    return enroll_and_join(relay, "local/codex"), enroll_and_join(relay, "private/ops")


def test_a_task_moves_through_its_states_live_and_is_canceled(
    chromium: object, relay: RelayProc, shots: Path
) -> None:
    caller, receiver = _world(relay)
    rx = Receiver(relay.url, receiver, renew_every=0.2)
    try:
        page = _page(chromium)
        _sign_in(page, relay, "/ui/tasks")
        page.evaluate("window.stillHere = true")  # a reload would forget this
        held = send_task(relay.url, WS, "private/ops", caller, "hold on")
        row = f'tr[data-task="{held}"]'
        page.wait_for_selector(f'{row}[data-state="leased"]')
        assert "working" in page.locator(row).inner_text()
        assert page.evaluate("window.stillHere") is True
        # its own page: the timeline grows while the receiver works
        page.locator(f"{row} a").click()
        page.wait_for_selector(".step-renewed")
        titles = page.locator(".step-title").all_inner_texts()
        assert titles[:3] == ["accepted", "claimed", "progress: status"]
        assert '"hold on"' in page.locator(".step-accepted pre.payload").inner_text()
        page.evaluate("window.stillHere = true")
        rx.release(held)
        page.wait_for_selector(".step-completed")
        assert "completed" in page.locator("#task-summary .state").inner_text()
        assert '"released"' in page.locator(".step-completed pre.payload").inner_text()
        assert page.evaluate("window.stillHere") is True
        _shoot(page, shots, "task")
        # cancel a running task from the list: the receiver learns at its next renew
        page.goto(relay.url + "/ui/tasks")
        doomed = send_task(relay.url, WS, "private/ops", caller, "hold again")
        row = f'tr[data-task="{doomed}"]'
        page.wait_for_selector(f'{row}[data-state="leased"]')
        page.once("dialog", lambda dialog: dialog.accept())
        page.locator(row).get_by_role("button", name="Cancel").click()
        page.wait_for_selector(f'{row}[data-state="cancelled"]')
        for text in ("echo fine", "fail now", "ask me"):
            send_task(relay.url, WS, "private/ops", caller, text)
        page.wait_for_selector('tr[data-state="failed"]')
        page.wait_for_selector('tr[data-state="input_required"]')
        page.wait_for_function(
            "document.querySelectorAll('tr[data-state=\"succeeded\"]').length >= 2"
        )
        assert doomed in rx.cancelled or _eventually_cancelled(rx, doomed)
        page.goto(relay.url + "/ui/tasks?state=failed")
        assert page.locator("tr[data-task]").count() == 1
        page.goto(relay.url + "/ui/tasks?window=1h")
        _shoot(page, shots, "tasks")
        phone = _page(chromium, 390, 844)
        phone.context.add_cookies(page.context.cookies())
        phone.goto(relay.url + "/ui/tasks")
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
        _shoot(phone, shots, "tasks-phone")
        phone.context.close()
        page.goto(relay.url + "/ui/?window=1h")
        _shoot(page, shots, "overview")
        page.goto(relay.url + "/ui/grants")
        _shoot(page, shots, "grants")
        page.context.close()
    finally:
        rx.stop()
    assert not rx.errors


def test_the_owner_approves_a_proposed_route(
    chromium: object, relay: RelayProc, shots: Path
) -> None:
    """A route the receiving agent proposes waits on the Routes page; one click (and the
    confirmation) puts it in force, and the agent's own API says so."""
    _caller, receiver = _world(relay)
    proposal = {"capability": "incident.inspect", "adapter": "command", "cwd": "/srv/ops",
                "options": {"argv": ["/usr/local/bin/inspect-incident"]}}  # fmt: skip
    with httpx.Client(base_url=relay.url, headers={"authorization": f"Bearer {receiver}"}) as c:
        route = ok(c.post("/api/routes", json=proposal), 201)
    page = _page(chromium)
    _sign_in(page, relay, "/ui/routes")
    row = f'#pending tr[data-route="{route["id"]}"]'
    page.wait_for_selector(row)
    assert "/srv/ops" in page.locator(row).inner_text()
    page.once("dialog", lambda dialog: dialog.accept())
    with page.expect_navigation():
        page.locator(row).get_by_role("button", name="Approve").click()
    page.wait_for_selector(f'#approved tr[data-route="{route["id"]}"]')
    _shoot(page, shots, "routes")
    page.context.close()
    with httpx.Client(base_url=relay.url, headers={"authorization": f"Bearer {receiver}"}) as c:
        assert ok(c.get(f"/api/routes/{route['id']}"))["state"] == "approved"


def _eventually_cancelled(rx: Receiver, task_id: str) -> bool:
    deadline = time.monotonic() + 10  # a hang guard
    while time.monotonic() < deadline and task_id not in rx.cancelled:
        time.sleep(0.05)
    return task_id in rx.cancelled


def test_the_audit_log_filters_and_follows(chromium: object, relay: RelayProc, shots: Path) -> None:
    add_agent(relay, "private/ops", "incident.inspect")
    add_agent(relay, "local/codex")
    page = _page(chromium)
    _sign_in(page, relay, "/ui/audit")
    page.locator("#a-action").fill("grant.")
    with page.expect_navigation():
        page.get_by_role("button", name="Filter").click()
    assert "No records match" in page.locator("#audit-rows").inner_text()
    with relay.owner() as c:
        grant = {"caller": "local/codex", "receiver": "private/ops",
                 "capabilities": ["incident.inspect"]}  # fmt: skip
        ok(c.post("/api/grants", json=grant), 201)
        c.post("/api/grants", json=grant | {"capabilities": ["reboot"]})  # refused, recorded
        ok(c.post("/api/agents", json={"id": "not/shown"}), 201)
    page.wait_for_function("document.querySelectorAll('#audit-rows tr[data-seq]').length >= 2")
    rows = page.locator("#audit-rows tr[data-seq]").all_inner_texts()
    assert len(rows) == 2
    assert all("grant.add" in r for r in rows)
    assert "refused" in rows[0]  # newest first: the refusal came second
    assert "unknown-capability" in rows[0]
    assert "No records match" not in page.locator("#audit-rows").inner_text()
    page.goto(relay.url + "/ui/audit")
    assert page.locator("#audit-rows tr[data-seq]").count() >= 5
    _shoot(page, shots, "audit")
    page.context.close()


def test_refusals_foreign_posts_expired_sessions_and_no_session(
    chromium: object, relay: RelayProc, shots: Path
) -> None:
    from melchior.mellan.relay.store import open_store

    page = _page(chromium)
    _sign_in(page, relay, "/ui/agents")
    # a foreign page posts a form at the dashboard: refused, nothing added
    page.goto("about:blank")
    page.set_content(
        f'<form method="post" action="{relay.url}/ui/agents">'
        '<input name="id" value="evil/agent"><input name="csrf" value="guess">'
        '<button id="go">go</button></form>'
    )
    with page.expect_navigation():
        page.click("#go")
    assert "Refused" in page.content()
    with relay.owner() as c:
        ids = [a["id"] for a in ok(c.get("/api/agents"))["agents"]]
    assert "evil/agent" not in ids
    # an idle session: the next page asks to sign in again, saying why
    store = open_store(f"sqlite://{Path(relay.token_file).parent / 'relay.db'}", migrate=False)
    try:
        assert store.expire_sessions() >= 1
    finally:
        store.close()
    page.goto(relay.url + "/ui/agents")
    assert "/ui/signin" in page.url
    assert "idle too long" in page.content()
    # no session at all: every page sends a browser to sign in
    fresh = _page(chromium)
    for path in ("/ui/", "/ui/agents", "/ui/grants", "/ui/routes", "/ui/tasks", "/ui/audit"):
        fresh.goto(relay.url + path)
        assert "/ui/signin" in fresh.url, path
    _shoot(fresh, shots, "signin")
    fresh.context.close()
    page.context.close()


def test_a_sealed_task_is_shown_sealed_live_and_never_its_content(
    chromium: object, relay: RelayProc, sealed: Sealed, shots: Path
) -> None:
    """A sealed task run by a real receiver, watched live from the list to its own page:
    marked sealed, its sizes and fingerprints shown, no payload box, no plaintext."""
    secret = "pension ledger " + os.urandom(8).hex()
    page = _page(chromium)
    _sign_in(page, relay, "/ui/tasks")
    task_id, _ = sealed.send(secret)
    row = f'tr[data-task="{task_id}"]'
    page.wait_for_selector(f'{row}[data-state="succeeded"]')
    assert page.locator(f"{row} .sealed-mark").inner_text() == "sealed"
    page.locator(f"{row} a").click()
    page.wait_for_selector(".step-completed .sealed-body")
    assert page.locator("pre.payload").count() == 0
    text = page.locator("main").inner_text()
    assert sealed.ops_key.fingerprint in text
    assert sealed.codex_keys.public.fingerprint in text
    assert "bytes of ciphertext" in text
    assert secret not in text
    assert secret.upper() not in text
    assert secret not in page.content()
    _shoot(page, shots, "task-sealed")
