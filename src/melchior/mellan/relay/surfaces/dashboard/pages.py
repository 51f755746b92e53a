"""The dashboard's pages and forms: overview, agents, grants, tasks, one task, audit.

Pages read the store directly, scoped to the owner's workspace (an owner sees the whole
workspace: :mod:`melchior.policy.visibility`). Forms change things only through
:mod:`melchior.mellan.relay.surfaces.actions`, the functions the control API calls too, so a
refusal here is the refusal ``mellan`` would get, with the same rule and the same audit
record. A refused form re-renders its page with the reason and the fields as typed; a
done one redirects (303) to a page saying what was done. Script requests (our own
``dashboard.js``, marked by ``Accept: application/json``) get the same answers as JSON.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from melchior.mellan.relay.caches import presence
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.refusals import ApiError
from melchior.mellan.relay.store.base import (
    Activity,
    Agent,
    AgentKey,
    AuditFilter,
    CredentialKind,
    Grant,
    Store,
    Task,
    TaskState,
)
from melchior.mellan.relay.surfaces import actions
from melchior.mellan.relay.surfaces.dashboard import pictures, render, sealed, sessions, timeline
from melchior.mellan.relay.surfaces.dashboard.forms import Form
from melchior.mellan.relay.surfaces.dashboard.guard import relay_of
from melchior.mellan.relay.surfaces.dashboard.sessions import Owner

DONE = {
    "agent-added": "Agent added. Next: create an enrollment code for its machine.",
    "code-revoked": "Enrollment code revoked; it can no longer be used.",
    "credential-revoked": "Credential revoked; it is refused from now on.",
    "grant-added": "Grant added.",
    "grant-revoked": "Grant revoked; new tasks on this route are refused from now on.",
    "route-approved": "Route approved; its capability runs this way from the next claim on.",
    "route-revoked": "Route revoked; its capability has no route until another is approved.",
    "task-canceled": "Task canceled.",
    "task-cancel-duplicate": "The task was already canceled.",
}
"""What a page says after a change (fixed sentences: a link cannot put words here)."""

WINDOWS = {"1h": (60, 60), "24h": (30 * 60, 48), "7d": (3 * 3600, 56)}
"""Activity windows: bucket width in seconds and number of buckets."""

TASK_PAGE = 50
AUDIT_PAGE = 100
TTLS = (("900", "15 minutes"), ("3600", "1 hour"), ("86400", "1 day"), ("604800", "7 days"))


def _notice(request: Request) -> str:
    return DONE.get(request.query_params.get("done", ""), "")


def _wants_json(request: Request) -> bool:
    return "application/json" in request.headers.get("accept", "")


def done(request: Request, key: str, where: str) -> Response:
    """A change went through: 303 to ``where`` saying so (or JSON for our script)."""
    if _wants_json(request):
        return JSONResponse({"ok": True, "notice": DONE[key]})
    sep = "&" if "?" in where else "?"
    fragment = ""
    if "#" in where:
        where, fragment = where.split("#", 1)
        fragment = "#" + fragment
    return RedirectResponse(f"{where}{sep}done={key}{fragment}", status_code=303)


async def refused(
    request: Request, exc: ApiError, again: Callable[[], Awaitable[Response]]
) -> Response:
    """A change was refused: its page again, saying why (or the error as JSON)."""
    if _wants_json(request):
        return JSONResponse(
            {"error": {"code": exc.code, "reason": exc.reason, "rule": exc.rule}}, exc.status
        )
    return await again()


def _error(exc: ApiError) -> dict[str, str]:
    return {"rule": exc.rule, "reason": exc.reason, "code": exc.code}


def _page(
    request: Request, owner: Owner, name: str, current: str, status: int = 200, **ctx: Any
) -> Response:
    ctx.setdefault("notice", _notice(request))
    return render.page(request, name, {"owner": owner, "current": current, **ctx}, status=status)


async def _read(request: Request, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    relay = relay_of(request)
    return await relay.call(fn, *args, **kw)


def _store(request: Request) -> Store:
    return relay_of(request).store


# -- overview ------------------------------------------------------------------------------------


def _window(request: Request) -> str:
    w = request.query_params.get("window", "24h")
    return w if w in WINDOWS else "24h"


async def _activity(request: Request, owner: Owner, window: str) -> Activity:
    width, count = WINDOWS[window]
    result: Activity = await _read(
        request, _store(request).task_activity, owner.workspace, width, count
    )
    return result


async def overview(request: Request, owner: Owner) -> Response:
    store = _store(request)
    agents: list[Agent] = await _read(request, store.list_agents, owner.workspace)
    grants: list[Grant] = await _read(request, store.list_grants, owner.workspace)
    window = _window(request)
    activity = await _activity(request, owner, window)
    recent: list[Task] = await _read(request, store.list_tasks, owner.workspace, limit=5)
    return _page(
        request, owner, "overview.html", "overview",
        agents=agents, grants=grants, activity=activity, window=window, windows=WINDOWS,
        network=pictures.network(agents, grants),
        throughput=pictures.throughput(activity), depth=pictures.depth(activity),
        recent=recent, seals=seals_of(recent), relay_url=relay_of(request).public_url,
    )  # fmt: skip


# -- agents, enrollment codes, credentials --------------------------------------------------------


def _agent_keys(store: Store, workspace: str, agents: list[str]) -> dict[str, AgentKey | None]:
    """Each agent's registered public key (one small read per agent: a workspace has tens
    of agents, and the store answers for one agent at a time, as callers ask it)."""
    return {a: store.agent_key(workspace, a) for a in agents}


async def _agents_page(
    request: Request,
    owner: Owner,
    *,
    status: int = 200,
    error: dict[str, str] | None = None,
    typed: dict[str, str] | None = None,
    code: actions.Code | None = None,
) -> Response:
    store = _store(request)
    agents: list[Agent] = await _read(request, store.list_agents, owner.workspace)
    creds = await _read(request, store.list_credentials, owner.workspace)
    codes = await _read(request, store.list_enrollments, owner.workspace)
    now: str = await _read(request, store.now)
    keys: dict[str, AgentKey | None] = await _read(
        request, _agent_keys, store, owner.workspace, [a.id for a in agents]
    )
    live = [c for c in creds if c.revoked_at is None]
    return _page(
        request, owner, "agents.html", "agents", status=status,
        agents=agents, keys=keys,
        receivers={a.id: presence.view(a, now) for a in agents},
        agent_credentials={a.id: [c for c in live if c.kind is CredentialKind.AGENT
                                  and c.subject == a.id] for a in agents},
        owner_credentials=[c for c in live if c.kind is CredentialKind.OWNER],
        codes={a.id: [e for e in codes if e.agent == a.id] for a in agents},
        error=error, typed=typed or {}, code=code, ttls=TTLS,
        relay_url=relay_of(request).public_url,
        **({"notice": ""} if error or code else {}),
    )  # fmt: skip


async def agents_page(request: Request, owner: Owner) -> Response:
    return await _agents_page(request, owner)


CAPABILITY_LINE = re.compile(r"^\s*([^=\s]+)\s*(?:=\s*(.*?))?\s*$")


def capability_lines(text: str) -> list[Any]:
    """Capabilities as typed in the form: one per line, ``id`` or ``id = description``
    (the CLI's ``--capability id=description``). Checked by the shared action."""
    out: list[Any] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = CAPABILITY_LINE.match(line)
        if m is None:
            out.append(line.strip())  # refused by the action, naming it
            continue
        cap_id, desc = m.group(1), m.group(2)
        out.append({"id": cap_id, "description": desc} if desc else cap_id)
    return out


async def add_agent(request: Request, owner: Owner, form: Form) -> Response:
    typed = {k: form.get(k) for k in ("id", "description", "capabilities")}
    agent_id = typed["id"].strip()
    try:
        await actions.add_agent(
            relay_of(request), owner.principal, agent_id, typed["description"].strip(),
            capability_lines(typed["capabilities"]),
        )  # fmt: skip
    except ApiError as exc:
        return await refused(
            request,
            exc,
            partial(
                _agents_page, request, owner, status=exc.status, error=_error(exc), typed=typed
            ),
        )
    return done(request, "agent-added", f"{render.base_path(request)}/agents#agents")


async def enroll(request: Request, owner: Owner, form: Form) -> Response:
    ttl_text = form.get("ttl", "900")
    ttl = int(ttl_text) if ttl_text in {t for t, _ in TTLS} else 900
    try:
        code = await actions.enroll(relay_of(request), owner.principal, form.get("agent"), ttl)
    except ApiError as exc:
        return await refused(
            request,
            exc,
            partial(_agents_page, request, owner, status=exc.status, error=_error(exc)),
        )
    if _wants_json(request):
        return JSONResponse(code._asdict(), 201)
    return await _agents_page(request, owner, code=code)


async def revoke_code(request: Request, owner: Owner, form: Form) -> Response:
    try:
        await actions.revoke_enrollment(
            relay_of(request), owner.principal, request.path_params["code_id"]
        )
    except ApiError as exc:
        return await refused(
            request,
            exc,
            partial(_agents_page, request, owner, status=exc.status, error=_error(exc)),
        )
    return done(request, "code-revoked", f"{render.base_path(request)}/agents")


async def revoke_credential(request: Request, owner: Owner, form: Form) -> Response:
    credential_id = request.path_params["credential_id"]
    try:
        await actions.revoke_credential(relay_of(request), owner.principal, credential_id)
    except ApiError as exc:
        return await refused(
            request,
            exc,
            partial(_agents_page, request, owner, status=exc.status, error=_error(exc)),
        )
    if credential_id == owner.principal.credential_id:  # this very session has just ended
        response = RedirectResponse(
            f"{render.base_path(request)}/signin?why=credential-revoked", status_code=303
        )
        sessions.forget(response, request, relay_of(request))
        return response
    return done(request, "credential-revoked", f"{render.base_path(request)}/agents")


# -- grants --------------------------------------------------------------------------------------


async def _grants_page(
    request: Request,
    owner: Owner,
    *,
    status: int = 200,
    error: dict[str, str] | None = None,
    typed: dict[str, str] | None = None,
) -> Response:
    store = _store(request)
    show_revoked = request.query_params.get("revoked") == "1"
    agents: list[Agent] = await _read(request, store.list_agents, owner.workspace)
    grants: list[Grant] = await _read(
        request, store.list_grants, owner.workspace, include_revoked=show_revoked
    )
    active = [g for g in grants if g.revoked_at is None]
    return _page(
        request, owner, "grants.html", "grants", status=status,
        agents=agents, grants=grants, show_revoked=show_revoked,
        network=pictures.network(agents, active),
        declared=sorted({c.id for a in agents for c in a.capabilities}),
        error=error, typed=typed or {},
        **({"notice": ""} if error else {}),
    )  # fmt: skip


async def grants_page(request: Request, owner: Owner) -> Response:
    return await _grants_page(request, owner)


def capability_words(form: Form) -> list[str]:
    """Capabilities named in the grant form: ticked boxes and/or typed ids (split on commas
    and white space), first mention kept."""
    words = form.all("capability") + re.split(r"[\s,]+", form.get("capabilities"))
    return list(dict.fromkeys(w.strip() for w in words if w.strip()))


async def add_grant(request: Request, owner: Owner, form: Form) -> Response:
    typed = {k: form.get(k) for k in ("caller", "receiver", "capabilities")}
    try:
        await actions.add_grant(
            relay_of(request), owner.principal, typed["caller"].strip(),
            typed["receiver"].strip(), capability_words(form),
        )  # fmt: skip
    except ApiError as exc:
        return await refused(
            request,
            exc,
            partial(
                _grants_page, request, owner, status=exc.status, error=_error(exc), typed=typed
            ),
        )
    return done(request, "grant-added", f"{render.base_path(request)}/grants")


async def revoke_grant(request: Request, owner: Owner, form: Form) -> Response:
    try:
        await actions.revoke_grant(
            relay_of(request), owner.principal, request.path_params["grant_id"]
        )
    except ApiError as exc:
        return await refused(
            request,
            exc,
            partial(_grants_page, request, owner, status=exc.status, error=_error(exc)),
        )
    return done(request, "grant-revoked", f"{render.base_path(request)}/grants")


# -- tasks ---------------------------------------------------------------------------------------


class TaskFilter:
    """The task list's filters, read from the query: agent (either party), state,
    capability, and the paging cursor; unknown values are dropped, not guessed."""

    def __init__(self, request: Request) -> None:
        q = request.query_params
        self.agent = (q.get("agent") or "").strip()[:256] or None
        self.capability = (q.get("capability") or "").strip()[:128] or None
        state = q.get("state") or ""
        self.state = TaskState(state) if state in {s.value for s in TaskState} else None
        self.after = (q.get("after") or "").strip()[:64] or None

    def query(self, *, paged: bool = True) -> str:
        from urllib.parse import urlencode

        pairs = {
            "agent": self.agent,
            "state": self.state.value if self.state else None,
            "capability": self.capability,
            "after": self.after if paged else None,
        }
        return urlencode({k: v for k, v in pairs.items() if v})

    def list(self, store: Store, workspace: str) -> list[Task]:
        return store.list_tasks(
            workspace,
            agent=self.agent,
            capability=self.capability,
            states=[self.state] if self.state else None,
            after=self.after,
            limit=TASK_PAGE,
        )


SEAL_CACHE = 4096
"""Task turns whose request seal the lists remember (a few hundred bytes each)."""
_seals: OrderedDict[tuple[str, str, int, int], sealed.Seal | None] = OrderedDict()
_seals_lock = threading.Lock()


def seals_of(tasks: list[Task]) -> dict[str, sealed.Seal | None]:
    """Each task's request seal (``None``: sent in clear), for the "sealed" mark in lists.

    A list is rendered again at every live refresh, and a sealed payload may be up to the
    relay's body limit (16 MiB) of JSON to parse, so each turn's answer is remembered: a
    turn's message is written once (a follow-up is the next turn), so the task, turn and
    payload length name it."""
    out: dict[str, sealed.Seal | None] = {}
    for t in tasks:
        key = (t.workspace, t.id, t.turn, len(t.payload))
        with _seals_lock:
            known = key in _seals
            if known:
                _seals.move_to_end(key)
                out[t.id] = _seals[key]
        if known:
            continue
        out[t.id] = seal = sealed.request_seal(t.payload)
        with _seals_lock:
            _seals[key] = seal
            while len(_seals) > SEAL_CACHE:
                _seals.popitem(last=False)
    return out


def task_rows(request: Request, owner: Owner, tasks: list[Task]) -> str:
    return render.fragment(
        "_task_rows.html", tasks=tasks, base=render.base_path(request), owner=owner,
        back=f"{render.base_path(request)}/tasks", seals=seals_of(tasks),
    )  # fmt: skip


async def tasks_page(request: Request, owner: Owner) -> Response:
    store = _store(request)
    filt = TaskFilter(request)
    tasks: list[Task] = await _read(request, filt.list, store, owner.workspace)
    agents: list[Agent] = await _read(request, store.list_agents, owner.workspace)
    window = _window(request)
    activity = await _activity(request, owner, window)
    return _page(
        request, owner, "tasks.html", "tasks",
        tasks=tasks, rows=task_rows(request, owner, tasks), filt=filt, agents=agents,
        capabilities=sorted({c.id for a in agents for c in a.capabilities}),
        states=list(TaskState), window=window, windows=WINDOWS, activity=activity,
        throughput=pictures.throughput(activity), depth=pictures.depth(activity),
        older=tasks[-1].id if len(tasks) == TASK_PAGE else None,
    )  # fmt: skip


TaskRead = tuple[Task | None, Any, Any, Any, Any]
"""What a task's page shows, as :func:`_task_read` reads it."""


def _task_read(store: Store, workspace: str, task_id: str) -> TaskRead:
    task = store.get_task(workspace, task_id)
    if task is None:
        return None, [], [], [], []
    records = store.audit_matching(
        workspace, AuditFilter(subject=task_id), limit=1000, newest_first=False
    )
    turns = store.turns(task_id) if task.turn > 1 else []
    return task, records, store.events_after(task_id, 0), turns, store.push_attempts(task_id)


async def read_task(relay: Relay, workspace: str, task_id: str) -> TaskRead:
    """One read of what a task's page shows (the live view's shared reader calls it)."""
    return await relay.call(_task_read, relay.store, workspace, task_id)


async def task_parts(request: Request, owner: Owner, task_id: str) -> dict[str, str] | None:
    """The live parts of a task's page (summary and timeline), rendered; None if unseen."""
    read = await read_task(relay_of(request), owner.workspace, task_id)
    return render_task_parts(request, owner, read)


def render_task_parts(request: Request, owner: Owner, read: TaskRead) -> dict[str, str] | None:
    """:func:`task_parts` from a read already made (rendering is per owner; the read is not)."""
    task = read[0]
    if not actions.may_see(owner.principal, task):
        return None
    assert task is not None
    return task_fragments(read, render.base_path(request), owner)


def task_fragments(read: TaskRead, base: str, owner: Owner | None) -> dict[str, str]:
    """A task's summary and timeline as HTML, from a read of a task that exists (pure: the
    property tests render exactly what a page shows). What of each stored body is shown is
    :func:`.sealed.shown`'s decision, made for every step by :func:`.timeline.steps`."""
    task, records, events, turns, pushes = read
    assert task is not None
    steps = timeline.steps(task, records, events, turns, pushes)
    seal = next(
        (s for s in map(sealed.request_seal, [t.payload for t in turns] + [task.payload]) if s),
        None,
    )  # the first sealed turn's: a task is sealed from its first message on
    return {
        "task-summary": render.fragment(
            "_task_summary.html", task=task, base=base, owner=owner, seal=seal
        ),
        "timeline": render.fragment("_timeline.html", steps=steps),
    }


async def task_page(request: Request, owner: Owner, *, status: int = 200,
                    error: dict[str, str] | None = None) -> Response:  # fmt: skip
    task_id = request.path_params["task_id"]
    parts = await task_parts(request, owner, task_id)
    if parts is None:
        return _page(
            request, owner, "missing.html", "tasks", status=404,
            what=f"task {task_id}", back=f"{render.base_path(request)}/tasks",
        )  # fmt: skip
    task = await _read(request, _store(request).get_task, owner.workspace, task_id)
    return _page(
        request, owner, "task.html", "tasks", status=status, task=task, parts=parts,
        error=error, **({"notice": ""} if error else {}),
    )  # fmt: skip


async def task_view(request: Request, owner: Owner) -> Response:
    return await task_page(request, owner)


async def cancel_task(request: Request, owner: Owner, form: Form) -> Response:
    task_id = request.path_params["task_id"]
    base = render.base_path(request)
    back = sessions.safe_next(form.get("back"), base)
    if back == base + "/":
        back = f"{base}/tasks/{task_id}"
    try:
        _, outcome = await actions.cancel_task(relay_of(request), owner.principal, task_id)
    except ApiError as exc:
        return await refused(
            request, exc, partial(task_page, request, owner, status=exc.status, error=_error(exc))
        )
    key = "task-canceled" if outcome.value == "ok" else "task-cancel-duplicate"
    return done(request, key, back)


# -- audit ---------------------------------------------------------------------------------------

KNOWN_ACTIONS = (
    "agent.", "agent.add", "credential.", "credential.add", "credential.revoke",
    "enrollment.", "enrollment.add", "enrollment.redeem", "enrollment.revoke",
    "grant.", "grant.add", "grant.revoke", "session.", "session.start", "session.end",
    "task.", "task.accept", "task.continue", "task.refuse", "task.claim", "task.progress",
    "task.complete", "task.input_required", "task.fail", "task.cancel", "task.cancel_ack", "lease.",
    "lease.lost", "lease.expired",
)  # fmt: skip
"""Offered as suggestions in the audit filter (any action may be typed)."""


class AuditQuery:
    """The audit page's filters from the query string, and its paging cursor."""

    def __init__(self, request: Request) -> None:
        q = request.query_params

        def text(name: str) -> str | None:
            return (q.get(name) or "").strip()[:256] or None

        outcome = q.get("outcome", "")
        self.outcome = outcome if outcome in ("allowed", "refused") else ""
        self.match = AuditFilter(
            actor=text("actor"),
            action=text("action"),
            subject=text("subject"),
            allowed={"allowed": True, "refused": False}.get(self.outcome),
        )
        before = q.get("before", "")
        self.before = int(before) if before.isdigit() and len(before) < 19 else None

    def query(self) -> str:
        from urllib.parse import urlencode

        m = self.match
        pairs = {"actor": m.actor, "action": m.action, "subject": m.subject,
                 "outcome": self.outcome or None}  # fmt: skip
        return urlencode({k: v for k, v in pairs.items() if v})


def audit_rows(request: Request, records: list[Any]) -> str:
    return render.fragment("_audit_rows.html", records=records, base=render.base_path(request))


async def audit_page(request: Request, owner: Owner) -> Response:
    aq = AuditQuery(request)
    records = await _read(
        request, _store(request).audit_matching, owner.workspace, aq.match,
        before=aq.before, limit=AUDIT_PAGE,
    )  # fmt: skip
    latest = await _read(
        request, _store(request).audit_matching, owner.workspace, AuditFilter(), limit=1
    )  # the live stream follows from the log's end, whatever the filter matched so far
    return _page(
        request, owner, "audit.html", "audit",
        records=records, rows=audit_rows(request, records), aq=aq, actions=KNOWN_ACTIONS,
        newest=latest[0].seq if latest else 0, following=aq.before is None,
        older=records[-1].seq if len(records) == AUDIT_PAGE else None,
    )  # fmt: skip
