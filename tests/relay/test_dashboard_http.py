"""The dashboard over real HTTP, without a browser: who may see it, CSRF and origin checks,
sessions ending, the shared rules behind its forms, payloads as stored, live streams."""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.routing import Mount, Route

from a2a_kit import CALLER, RECEIVER, WS, Server, World, seed
from dashboard_kit import browser, csrf_of, frames, post_form, send_task, sign_in
from melchior.mellan.relay.auth import hash_token
from melchior.mellan.relay.store.base import AuditFilter, FollowUp, NewTask, Record
from melchior.mellan.relay.surfaces.dashboard import routes
from melchior.mellan.relay.surfaces.dashboard.headers import CSP


@pytest.fixture(name="site")
def site_fixture(tmp_path: Path) -> Iterator[tuple[Server, World]]:
    server = Server(f"sqlite://{tmp_path / 'relay.db'}")
    world = seed(server.store)
    try:
        yield server, world
    finally:
        server.stop()


def _paths() -> list[tuple[str, str]]:
    """Every protected route of the dashboard, with its path parameters filled in."""
    out = []
    for r in routes():
        if isinstance(r, Mount) or not isinstance(r, Route) or r.path.startswith("/signin"):
            continue
        path = r.path
        for name in r.param_convertors:
            path = path.replace("{" + name + "}", "x1")
        for method in sorted(r.methods or ()):
            if method != "HEAD":
                out.append((method, "/ui" + path))
    return out


def test_every_route_refuses_without_the_owners_session(site: tuple[Server, World]) -> None:
    server, world = site
    paths = _paths()
    assert len(paths) >= 15
    c = browser(server.url)
    for method, path in paths:
        if method == "GET" and not path.endswith("/live"):
            r = c.get(path)
            assert r.status_code == 303, (path, r.status_code)
            assert r.headers["location"].startswith("/ui/signin?next=")
            assert "why=unauthenticated" in r.headers["location"]
        elif method == "GET":
            r = c.get(path, headers={"accept": "text/event-stream"})
            assert r.status_code == 401, (path, r.status_code)
        else:
            r = post_form(c, path, {"csrf": "x"})
            assert r.status_code == 401, (path, r.status_code, r.text)
            assert "unauthenticated" in r.text
    # an agent credential is no key to the dashboard, as a cookie or as a bearer
    agent = httpx.get(
        f"{server.url}/ui/agents",
        headers={"authorization": f"Bearer {world.tokens['caller']}"},
        cookies={"mellan_session": world.tokens["owner"]},
    )
    assert agent.status_code == 303
    assert "why=no-session" in agent.headers["location"]


def test_sign_in_gives_a_strict_http_only_cookie(site: tuple[Server, World]) -> None:
    server, world = site
    c = browser(server.url)
    page = c.get("/ui/signin?next=/ui/tasks")
    pre = page.headers["set-cookie"]
    assert "HttpOnly" in pre
    assert "SameSite=strict" in pre
    origin = {"origin": server.url, "sec-fetch-site": "same-origin"}
    token = csrf_of(page.text)
    bad = c.post("/ui/signin", data={"csrf": token, "token": "mln_nope"}, headers=origin)
    assert bad.status_code == 401
    assert "bad-credential" in bad.text
    agent = c.post(
        "/ui/signin", data={"csrf": token, "token": world.tokens["caller"]}, headers=origin
    )
    assert agent.status_code == 403
    assert "owner-only" in agent.text
    good = c.post(
        "/ui/signin",
        data={"csrf": token, "token": world.tokens["owner"], "next": "/ui/tasks"},
        headers=origin,
    )
    assert good.status_code == 303
    assert good.headers["location"] == "/ui/tasks"
    cookie = next(h for h in good.headers.get_list("set-cookie") if h.startswith("mellan_session="))
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert "Path=/ui" in cookie
    assert "Secure" not in cookie  # plain HTTP on loopback: a Secure cookie would not come back
    session_id = cookie.split(";")[0].split("=", 1)[1]
    stored = server.store.session_for(hash_token(session_id))
    assert stored is not None  # stored by its hash only
    assert server.store.session_for(session_id) is None
    assert c.get("/ui/tasks").status_code == 200
    records = server.store.audit_matching(WS, AuditFilter(action="session.start"))
    assert [(r.actor, r.allowed) for r in records] == [
        ("owner:alice", True),
        (f"agent:{CALLER}", False),
    ]


def test_sign_in_refuses_a_foreign_form(site: tuple[Server, World]) -> None:
    server, world = site
    c = browser(server.url)
    token = csrf_of(c.get("/ui/signin").text)
    data = {"csrf": token, "token": world.tokens["owner"]}
    foreign = c.post("/ui/signin", data=data, headers={"origin": "https://evil.example"})
    assert foreign.status_code == 403
    assert "cross-origin" in foreign.text
    cross = c.post("/ui/signin", data=data, headers={"sec-fetch-site": "cross-site"})
    assert cross.status_code == 403
    fresh = browser(server.url)  # no sign-in cookie: the form's token proves nothing
    r = fresh.post("/ui/signin", data=data, headers={"origin": server.url})
    assert r.status_code == 403
    assert "csrf-missing" in r.text
    assert server.store.audit_matching(WS, AuditFilter(action="session.start")) == []


def test_every_change_needs_the_sessions_csrf_token_and_our_origin(
    site: tuple[Server, World],
) -> None:
    server, world = site
    c, csrf = sign_in(server.url, world.tokens["owner"])
    add = {"id": "new/agent", "capabilities": "x.y"}
    cases = [
        ({}, {}, "csrf-missing"),
        ({"csrf": "0" * 64}, {}, "csrf-mismatch"),
        ({"csrf": csrf}, {"origin": "https://evil.example"}, "cross-origin"),
        ({"csrf": csrf}, {"origin": "null"}, "cross-origin"),
        ({"csrf": csrf}, {"sec-fetch-site": "cross-site"}, "cross-site"),
        ({"csrf": csrf}, {"sec-fetch-site": "same-site"}, "cross-site"),
    ]
    for extra, headers, rule in cases:
        r = post_form(c, "/ui/agents", add | extra, **headers)
        assert r.status_code == 403, (rule, r.status_code)
        assert rule in r.text
    assert server.store.get_agent(WS, "new/agent") is None  # nothing changed
    # our script sends the token as a header; a form sends it as a field
    r = post_form(c, "/ui/agents", add, **{"x-csrf-token": csrf, "accept": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["ok"] is True
    assert server.store.get_agent(WS, "new/agent") is not None
    # another session's token is not this one's
    _other, other_csrf = sign_in(server.url, world.tokens["owner"])
    assert other_csrf != csrf
    r = post_form(c, "/ui/agents", {"id": "second/agent", "csrf": other_csrf})
    assert r.status_code == 403
    assert "csrf-mismatch" in r.text


def test_a_session_ends_on_sign_out_idle_and_revocation(site: tuple[Server, World]) -> None:
    server, world = site
    # sign-out deletes it: the same cookie is refused afterwards
    c, csrf = sign_in(server.url, world.tokens["owner"])
    cookie = dict(c.cookies)
    r = post_form(c, "/ui/signout", {"csrf": csrf})
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/signin?why=signed-out"
    replay = browser(server.url)
    replay.cookies.update(cookie)
    r = replay.get("/ui/agents")
    assert r.status_code == 303
    assert "why=no-session" in r.headers["location"]
    # idle past its window: refused, and the sign-in page says why
    c, _ = sign_in(server.url, world.tokens["owner"])
    assert server.store.expire_sessions() >= 1
    r = c.get("/ui/agents")
    assert r.status_code == 303
    assert "why=session-idle" in r.headers["location"]
    page = c.get(r.headers["location"])
    assert "idle too long" in page.text
    # a revoked owner credential ends the sessions it signed in
    c, _ = sign_in(server.url, world.tokens["owner"])
    assert c.get("/ui/").status_code == 200
    api = httpx.post(
        f"{server.url}/api/credentials/{world.credential_ids['owner']}/revoke",
        headers={"authorization": f"Bearer {world.tokens['owner']}"},
    )
    assert api.status_code == 200
    r = c.get("/ui/")
    assert r.status_code == 303
    assert "why=credential-revoked" in r.headers["location"]


def test_forms_follow_the_control_apis_rules_and_records(site: tuple[Server, World]) -> None:
    server, world = site
    c, csrf = sign_in(server.url, world.tokens["owner"])
    owner = {"authorization": f"Bearer {world.tokens['owner']}"}
    refused = post_form(
        c,
        "/ui/grants",
        {"csrf": csrf, "caller": CALLER, "receiver": RECEIVER, "capabilities": "reboot"},
    )
    api = httpx.post(
        f"{server.url}/api/grants",
        json={"caller": CALLER, "receiver": RECEIVER, "capabilities": ["reboot"]},
        headers=owner,
    )
    assert refused.status_code == api.status_code == 400
    reason = api.json()["error"]["reason"]
    assert reason in html.unescape(refused.text)
    assert 'value="reboot"' in refused.text  # the form comes back as typed
    records = server.store.audit_matching(WS, AuditFilter(action="grant.add", allowed=False))
    assert [r.rule for r in records] == ["unknown-capability", "unknown-capability"]
    bad_id = post_form(c, "/ui/agents", {"csrf": csrf, "id": "no spaces/allowed"})
    assert bad_id.status_code == 400
    assert "is not valid" in bad_id.text
    # allowed: the same records the API writes
    ok = post_form(
        c,
        "/ui/agents",
        {"csrf": csrf, "id": "team/hermes", "capabilities": "summarize = Sum it up\nx.y"},
    )
    assert ok.status_code == 303
    agent = server.store.get_agent(WS, "team/hermes")
    assert agent is not None
    assert [(x.id, x.description) for x in agent.capabilities] == [
        ("summarize", "Sum it up"),
        ("x.y", ""),
    ]
    grant = post_form(
        c,
        "/ui/grants",
        {"csrf": csrf, "caller": RECEIVER, "receiver": "team/hermes", "capability": "summarize"},
    )
    assert grant.status_code == 303
    assert server.store.granted_capabilities(WS, RECEIVER, "team/hermes") == {"summarize"}
    assert server.store.granted_capabilities(WS, "team/hermes", RECEIVER) == set()
    code = post_form(c, "/ui/enrollments", {"csrf": csrf, "agent": "team/hermes"})
    assert code.status_code == 200
    assert "Shown once" in code.text
    (pending,) = server.store.list_enrollments(WS)
    revoke = post_form(c, f"/ui/enrollments/{pending.id}/revoke", {"csrf": csrf})
    assert revoke.status_code == 303
    assert server.store.list_enrollments(WS) == []
    actions = [r.action for r in server.store.audit_matching(WS, AuditFilter(actor="owner:alice"))]
    for action in ("agent.add", "grant.add", "enrollment.add", "enrollment.revoke"):
        assert action in actions


def test_a_task_page_shows_payloads_exactly_as_stored(site: tuple[Server, World]) -> None:
    server, world = site
    payload = '{"parts":[{"text":"<script>alert(1)</script> & co"}],"n":12345678901234567890}'
    task, _ = server.store.enqueue(
        NewTask(WS, CALLER, RECEIVER, "incident.inspect", payload, metadata='{"m": 1.10}')
    )
    c, csrf = sign_in(server.url, world.tokens["owner"])
    page = c.get(f"/ui/tasks/{task.id}")
    assert page.status_code == 200
    shown = [html.unescape(p) for p in re.findall(r'<pre class="payload">(.*?)</pre>', page.text)]
    assert shown == [payload]  # the stored text, character for character
    assert "<script>alert(1)" not in page.text
    listing = c.get(f"/ui/tasks?agent={CALLER}&state=queued")
    assert task.id in listing.text
    assert task.id not in c.get("/ui/tasks?state=failed").text
    # cancel from the page: the store's own cancel, audited as the owner's
    r = post_form(c, f"/ui/tasks/{task.id}/cancel", {"csrf": csrf, "back": "/ui/tasks"})
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/tasks?done=task-canceled"
    again = post_form(c, f"/ui/tasks/{task.id}/cancel", {"csrf": csrf})
    assert again.status_code == 303
    assert "task-cancel-duplicate" in again.headers["location"]
    after = server.store.get_task(WS, task.id)
    assert after is not None
    assert after.state.value == "cancelled"
    missing = c.get("/ui/tasks/no-such-task")
    assert missing.status_code == 404


def test_live_streams_follow_tasks_and_the_audit_log(site: tuple[Server, World]) -> None:
    server, world = site
    c, _ = sign_in(server.url, world.tokens["owner"])
    latest = server.store.audit_matching(WS, AuditFilter(), limit=1)[0].seq
    with c.stream("GET", f"/ui/audit/live?after={latest}", timeout=30) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        owner = {"authorization": f"Bearer {world.tokens['owner']}"}
        made = httpx.post(
            f"{server.url}/api/agents", json={"id": "live/one", "capabilities": []}, headers=owner
        )
        assert made.status_code == 201
        ((ident, name, data),) = frames(stream.iter_lines(), 1)
    assert name == "html"
    assert data["target"] == "audit-rows"
    assert data["mode"] == "prepend"
    assert "live/one" in data["html"]
    assert int(ident) > latest
    # a reconnecting browser sends the last id it saw: nothing is repeated
    httpx.post(f"{server.url}/api/agents", json={"id": "live/two"}, headers=owner)
    headers = {"last-event-id": ident}
    with c.stream("GET", "/ui/audit/live?after=0", headers=headers, timeout=30) as stream:
        ((_, _, data),) = frames(stream.iter_lines(), 1)
    assert "live/two" in data["html"]
    assert "live/one" not in data["html"]
    # one task: its summary and timeline, again when the receiver moves it
    task_id = send_task(server.url, WS, RECEIVER, world.tokens["caller"], "hello")
    with c.stream("GET", f"/ui/tasks/{task_id}/live", timeout=30) as stream:
        lines = stream.iter_lines()
        first = frames(lines, 2)
        assert {d["target"] for _, _, d in first} == {"task-summary", "timeline"}
        assert "queued" in first[0][2]["html"]
        (lease,) = server.store.claim(WS, RECEIVER, "test", actor=f"agent:{RECEIVER}")
        ((_, _, moved),) = frames(lines, 1)
    assert moved["target"] == "task-summary"
    assert "working" in moved["html"]
    assert lease.task.id == task_id


def _gauge(server: Server, world: World, name: str) -> float:
    owner = {"authorization": f"Bearer {world.tokens['owner']}"}
    text = httpx.get(f"{server.url}/metrics", headers=owner).text
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + "{"))


def test_live_views_of_one_task_share_one_reader(site: tuple[Server, World]) -> None:
    """Two owners' tabs on one task follow the task's one shared reader on the replica
    (``mellan_stream_readers{kind="ui"}``): both see its move; the reader goes with them."""
    server, world = site
    a, _ = sign_in(server.url, world.tokens["owner"])
    b, _ = sign_in(server.url, world.tokens["owner"])
    task_id = send_task(server.url, WS, RECEIVER, world.tokens["caller"], "shared")
    url = f"/ui/tasks/{task_id}/live"
    with a.stream("GET", url, timeout=30) as one, b.stream("GET", url, timeout=30) as two:
        lines = [one.iter_lines(), two.iter_lines()]
        for it in lines:
            assert "queued" in frames(it, 2)[0][2]["html"]
        assert _gauge(server, world, "mellan_stream_readers") == 1
        assert _gauge(server, world, "mellan_stream_followers") == 2
        server.store.claim(WS, RECEIVER, "test", actor=f"agent:{RECEIVER}")
        for it in lines:
            ((_, _, moved),) = frames(it, 1)
            assert "working" in moved["html"]
    deadline = time.monotonic() + 30  # a hang guard: the server sees the clients go
    while _gauge(server, world, "mellan_stream_readers") != 0:
        assert time.monotonic() < deadline, "the reader outlived its views"
        time.sleep(0.05)


def test_pages_carry_security_headers(site: tuple[Server, World]) -> None:
    server, world = site
    c, _ = sign_in(server.url, world.tokens["owner"])
    for path in ("/ui/signin", "/ui/", "/ui/static/dashboard.js"):
        r = c.get(path)
        assert r.status_code == 200, path
        assert r.headers["content-security-policy"] == CSP
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "same-origin"
        assert r.headers["x-content-type-options"] == "nosniff"
    assert "'unsafe-inline'" not in CSP
    assert c.get("/ui/").headers["cache-control"] == "no-store"
    page = c.get("/ui/").text
    assert "<script>" not in page  # scripts come from static files only
    assert "onclick" not in page
    assert httpx.get(f"{server.url}/", follow_redirects=False).headers["location"] == "/ui/"


def test_the_api_lists_and_revokes_codes_through_the_same_action(
    site: tuple[Server, World],
) -> None:
    server, world = site
    owner = {"authorization": f"Bearer {world.tokens['owner']}"}
    agent = {"authorization": f"Bearer {world.tokens['caller']}"}
    made = httpx.post(f"{server.url}/api/enrollments", json={"agent": RECEIVER}, headers=owner)
    assert made.status_code == 201
    listed = httpx.get(f"{server.url}/api/enrollments", headers=owner).json()["enrollments"]
    assert [e["agent"] for e in listed] == [RECEIVER]
    assert made.json()["code"] not in json.dumps(listed)  # the code itself is never listed
    assert httpx.get(f"{server.url}/api/enrollments", headers=agent).status_code == 403
    code_id = listed[0]["id"]
    refused = httpx.post(f"{server.url}/api/enrollments/{code_id}/revoke", headers=agent)
    assert refused.status_code == 403
    done = httpx.post(f"{server.url}/api/enrollments/{code_id}/revoke", headers=owner)
    assert done.status_code == 200
    again = httpx.post(f"{server.url}/api/enrollments/{code_id}/revoke", headers=owner)
    assert again.status_code == 404
    join = httpx.post(f"{server.url}/api/join", json={"code": made.json()["code"]})
    assert join.status_code == 401


def test_a_task_that_went_on_shows_each_turn(site: tuple[Server, World]) -> None:
    server, world = site
    store = server.store
    first = '{"parts":[{"text":"which host?"}]}'
    task, _ = store.enqueue(NewTask(WS, CALLER, RECEIVER, "incident.inspect", first))
    (lease,) = store.claim(WS, RECEIVER, "rx", actor=f"agent:{RECEIVER}")
    asked = '{"message":{"parts":[{"text":"which one?"}]}}'
    assert store.complete(task.id, lease.epoch, asked, input_required=True).ok
    answer = '{"parts":[{"text":"db-1"}],"n":12345678901234567890}'
    said = Record(f"agent:{CALLER}", "task.continue", "grant", "the caller answered")
    follow = FollowUp(WS, task.id, CALLER, "m-2", answer, "", 1, (), record=said)
    went, ok_ = store.continue_task(follow)
    assert ok_
    assert went is not None
    (lease,) = store.claim(WS, RECEIVER, "rx", actor=f"agent:{RECEIVER}")
    done_ = '{"message":{"parts":[{"text":"db-1 is fine"}]}}'
    assert store.complete(task.id, lease.epoch, done_, actor=f"agent:{RECEIVER}").ok
    c, _ = sign_in(server.url, world.tokens["owner"])
    page = c.get(f"/ui/tasks/{task.id}").text
    shown = [html.unescape(p) for p in re.findall(r'<pre class="payload">(.*?)</pre>', page)]
    # turn 1's message and result (from the finished turn), turn 2's answer and result
    assert shown[0] == first
    assert answer in shown
    assert done_ in shown
    assert "(turn 2)" in page
    assert "answered" in page
    assert shown.index(answer) < shown.index(done_)


def test_the_routes_page_approves_and_revokes_through_the_same_actions(
    site: tuple[Server, World],
) -> None:
    server, world = site
    c, csrf = sign_in(server.url, world.tokens["owner"])
    empty = c.get("/ui/routes")
    assert empty.status_code == 200
    assert "Nothing waits" in empty.text
    agent = {"authorization": f"Bearer {world.tokens['receiver']}"}

    def propose(**body: object) -> str:
        r = httpx.post(
            f"{server.url}/api/routes",
            json={"capability": "incident.inspect", "adapter": "codex", **body},
            headers=agent,
        )
        assert r.status_code == 201, r.text
        route_id: str = r.json()["id"]
        return route_id

    first = propose(session="sess-1", cwd="/srv/<b>repo")
    page = c.get("/ui/routes")
    assert first in page.text
    assert "/srv/&lt;b&gt;repo" in page.text  # what the agent typed is text, never markup
    assert "<b>" not in page.text.split("<main", 1)[1]
    assert f'action="/ui/routes/{first}/approve"' in page.text
    ok = post_form(c, f"/ui/routes/{first}/approve", {"csrf": csrf})
    assert ok.status_code == 303
    assert ok.headers["location"] == "/ui/routes?done=route-approved"
    approved = server.store.approved_route(WS, RECEIVER, "incident.inspect")
    assert approved is not None
    assert approved.id == first
    assert "Route approved" in c.get(ok.headers["location"]).text
    second = propose(adapter="command", options={"argv": ["/bin/true"]})
    assert post_form(c, f"/ui/routes/{second}/approve", {"csrf": csrf}).status_code == 303
    old = server.store.get_route(WS, first)
    assert old is not None
    assert old.state.value == "revoked"
    # a refusal re-renders the page with the reason, as the API words it
    again = post_form(c, f"/ui/routes/{first}/approve", {"csrf": csrf})
    assert again.status_code == 409
    assert "never approved again" in html.unescape(again.text)
    missing = post_form(c, "/ui/routes/rt_nope/revoke", {"csrf": csrf})
    assert missing.status_code == 404
    assert post_form(c, f"/ui/routes/{second}/revoke", {"csrf": csrf}).status_code == 303
    assert server.store.approved_route(WS, RECEIVER, "incident.inspect") is None
    # without the session's token nothing changes
    third = propose()
    assert post_form(c, f"/ui/routes/{third}/approve", {"x": "1"}).status_code == 403
    pending = server.store.get_route(WS, third)
    assert pending is not None
    assert pending.state.value == "pending"
    records = server.store.audit_matching(WS, AuditFilter(action="route."), newest_first=False)
    assert [(r.action, r.actor, r.allowed) for r in records] == [
        ("route.propose", f"agent:{RECEIVER}", True),
        ("route.approve", "owner:alice", True),
        ("route.propose", f"agent:{RECEIVER}", True),
        ("route.approve", "owner:alice", True),
        ("route.revoke", "owner:alice", True),
        ("route.revoke", "owner:alice", False),
        ("route.revoke", "owner:alice", True),
        ("route.propose", f"agent:{RECEIVER}", True),
    ]


def test_the_agents_page_shows_receivers_online(site: tuple[Server, World]) -> None:
    server, world = site
    c, _ = sign_in(server.url, world.tokens["owner"])
    assert "never seen: no receiver has claimed work as private/ops" in c.get("/ui/agents").text
    r = httpx.post(
        f"{server.url}/api/receiver/claim",
        json={"wait": 0, "receiver": {"name": "ops-box", "running": 1, "concurrency": 4}},
        headers={"authorization": f"Bearer {world.tokens['receiver']}"},
    )
    assert r.status_code == 200
    page = c.get("/ui/agents").text
    assert '<span class="receiver online">online</span>' in page
    assert "ops-box" in page
    assert "running 1 of 4" in page


def _link(server: Server, token: str) -> httpx.Response:
    return httpx.post(
        f"{server.url}/api/dashboard/links", json={},
        headers={"authorization": f"Bearer {token}"},
    )  # fmt: skip


def test_a_one_time_link_signs_one_browser_in_once(site: tuple[Server, World]) -> None:
    server, world = site
    minted = _link(server, world.tokens["owner"])
    assert minted.status_code == 200, minted.text
    url = minted.json()["url"]
    assert minted.json()["expires_in"] == 600
    assert url.startswith(f"{server.url}/ui/signin/link?code=")
    code = url.split("code=", 1)[1]
    # following the link shows a button; the GET alone signs nobody in (a link previewer)
    c = browser(server.url)
    page = c.get(url.removeprefix(server.url))
    assert page.status_code == 200
    assert "Continue to the dashboard" in page.text
    assert c.get("/ui/").status_code == 303
    # the code is no cookie: a browser that sets it as its session gets nothing
    sneaky = browser(server.url)
    sneaky.cookies.set("mellan_session", code)
    assert sneaky.get("/ui/agents").status_code == 303
    # a foreign page cannot post it for the browser (no sign-in cookie, wrong origin)
    r = browser(server.url).post(
        "/ui/signin/link", data={"csrf": "x", "code": code},
        headers={"origin": "https://evil.example", "sec-fetch-site": "cross-site"},
    )  # fmt: skip
    assert r.status_code == 403
    # the button: signed in, at the overview
    r = post_form(c, "/ui/signin/link", {"csrf": csrf_of(page.text), "code": code})
    assert r.status_code == 303, r.text
    assert r.headers["location"] == "/ui/"
    assert c.get("/ui/agents").status_code == 200
    # once: a second browser with the same link is refused, saying why
    other = browser(server.url)
    again = other.get(url.removeprefix(server.url))
    r = post_form(other, "/ui/signin/link", {"csrf": csrf_of(again.text), "code": code})
    assert r.status_code == 401
    assert "used already, has expired" in html.unescape(r.text)
    links = server.store.audit_matching(WS, AuditFilter(action="session.link"))
    assert len(links) == 2  # minted, used
    # only the owner mints one
    assert _link(server, world.tokens["caller"]).status_code == 403


def test_an_expired_or_revoked_link_signs_nobody_in(site: tuple[Server, World]) -> None:
    server, world = site
    for spoil in ("expire", "revoke"):
        url = _link(server, world.tokens["owner"]).json()["url"]
        if spoil == "expire":
            assert server.store.expire_sessions() >= 1
        c = browser(server.url)
        page = c.get(url.removeprefix(server.url))
        if spoil == "revoke":
            api = httpx.post(
                f"{server.url}/api/credentials/{world.credential_ids['owner']}/revoke",
                headers={"authorization": f"Bearer {world.tokens['owner']}"},
            )
            assert api.status_code == 200
        code = url.split("code=", 1)[1]
        r = post_form(c, "/ui/signin/link", {"csrf": csrf_of(page.text), "code": code})
        assert r.status_code == 401, (spoil, r.text)
        assert c.get("/ui/").status_code == 303
