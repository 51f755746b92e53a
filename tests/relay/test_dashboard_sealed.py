"""The dashboard's sealed view: a sealed task shows that it is sealed, its ciphertext's
size and its keys' fingerprints, and never its content.

Properties over the pure decision (:mod:`...dashboard.sealed`) and the very fragments a
task's page is made of (``pages.task_fragments``): for any plaintext, the page of a task
sealed with real keys contains neither the plaintext nor any piece of the ciphertext or
signature, and does not depend on the content at all (two plaintexts of the same
characters in another order give the same page); for any hostile envelope, nothing the
sender wrote in it reaches the page but a well-formed fingerprint and a size. Then over
real HTTP, on both backends: a real relay process, a real sealed task run by a real
``mellan receiver``, and the dashboard's pages for it.
"""

from __future__ import annotations

import base64
import html
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard_kit import frames, sign_in
from melchior.mellan.relay.store.base import (
    AuditRecord,
    CredentialKind,
    Principal,
    Store,
    Task,
    TaskEvent,
    TaskState,
)
from melchior.mellan.relay.surfaces.dashboard import pages, sealed
from melchior.mellan.relay.surfaces.dashboard.sessions import Owner
from melchior.mellan.sealed_tasks import result_binding, seal_result
from melchior.mellan.sealing import (
    MEDIA_TYPE,
    SEALED_URI,
    Binding,
    KeyPair,
    envelope_of,
    seal,
    sealed_message,
)
from receiver_kit import CALLER, RECEIVER
from relay_proc import RelayProc, db_url_fixture, owner_fixture, relay_fixture, store_fixture
from sealed_kit import WORKSPACE, Sealed, sealed_fixture

__all__ = ["db_url_fixture", "owner_fixture", "relay_fixture", "sealed_fixture", "store_fixture"]

CALLER_KEYS = KeyPair.generate()
RECEIVER_KEYS = KeyPair.generate()
T0 = datetime(2030, 1, 1, tzinfo=UTC)
MARK = "plaintext-Qv7Wm-"
"""Starts every plaintext: a page containing it contains the plaintext."""
HOSTILE = "hostile-Jx9Pk-"
"""Starts every string a hostile envelope carries: none may reach the page."""
OWNER = Owner(Principal("w", CredentialKind.OWNER, "alice", "cred-1"), "hash", "csrf-token")


def iso(ms: int) -> str:
    moment = T0 + timedelta(milliseconds=ms)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _task(payload: str, result: str | None, **kw: Any) -> Task:
    base: dict[str, Any] = dict(
        id="t1", workspace="w", caller=CALLER, receiver=RECEIVER, capability="incident.inspect",
        context_id="c1", state=TaskState.SUCCEEDED, payload=payload, metadata="{}",
        message_id="m1", session_key=None, chain="", hop=1, path=(), attempt=1,
        max_attempts=3, lease_epoch=1, lease_owner=None, lease_expires_at=None, result=result,
        error=None, created_at=iso(0), updated_at=iso(30),
    )  # fmt: skip
    base.update(kw)
    return Task(**base)


def _records() -> list[AuditRecord]:
    def rec(seq: int, action: str, ms: int, **detail: Any) -> AuditRecord:
        return AuditRecord(seq, "w", iso(ms), f"agent:{RECEIVER}", action, "t1", True, "r",
                           action, detail)  # fmt: skip

    done = rec(3, "task.complete", 30, epoch=1)
    return [rec(1, "task.accept", 0), rec(2, "task.claim", 10), done]


def _page(task: Task, events: list[TaskEvent] | None = None) -> str:
    """The task page's two live parts, as the dashboard renders them."""
    parts = pages.task_fragments((task, _records(), events or [], [], []), "/ui", OWNER)
    return parts["task-summary"] + parts["timeline"]


def _decoded_size(envelope: dict[str, Any]) -> int:
    text = envelope["sealed"]
    return len(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def _sealed_task(text: str) -> tuple[Task, list[dict[str, Any]]]:
    """A completed task whose request and result are sealed, with real keys, around
    ``text``; and the two envelopes."""
    request = Binding("request", "w", CALLER, RECEIVER, "incident.inspect", None, None, "m1")
    envelope = seal([{"text": text}], binding=request, to=RECEIVER_KEYS.public,
                    sender=CALLER_KEYS)  # fmt: skip
    payload = json.dumps(sealed_message(envelope, message_id="m1"))
    answer = seal_result(
        text.upper(), [{"artifactId": "a", "parts": [{"text": text}]}],
        binding=result_binding(request, task="t1", context="c1"),
        to=CALLER_KEYS.public, sender=RECEIVER_KEYS, message_id="t1-t1-result",
    )  # fmt: skip
    result = json.dumps({"message": answer, "artifacts": []})
    result_envelope = envelope_of(answer)
    assert result_envelope is not None
    return _task(payload, result), [envelope, result_envelope]


plaintexts = st.text(max_size=300)


@settings(max_examples=60, deadline=None)
@given(plaintexts, st.data())
def test_a_sealed_tasks_page_never_shows_its_content(text: str, data: st.DataObject) -> None:
    plain = MARK + text
    task, envelopes = _sealed_task(plain)
    page = _page(task)
    assert MARK not in page
    assert html.escape(plain) not in page
    assert plain.upper() not in page
    for envelope in envelopes:
        for blob in (envelope["sealed"], envelope["sig"]):
            pieces = {blob[i : i + 16] for i in range(0, max(1, len(blob) - 15), 8)}
            assert not any(piece in page for piece in pieces)
        # what it does say: sealed, to and from which keys, how many bytes of ciphertext
        assert f"{_decoded_size(envelope)} bytes of ciphertext" in page
    assert "sealed" in page
    assert CALLER_KEYS.public.fingerprint in page
    assert RECEIVER_KEYS.public.fingerprint in page
    # the page does not depend on the content: the same characters in another order (the
    # same size of ciphertext, other ciphertext) give the same page
    shuffled = "".join(data.draw(st.permutations(list(plain))))
    assert _page(_sealed_task(shuffled)[0]) == page


def _hostile_strings() -> st.SearchStrategy[str]:
    return st.text(max_size=40).map(lambda t: HOSTILE + t)


hostile_values: st.SearchStrategy[Any] = _hostile_strings() | st.recursive(
    st.none() | st.booleans() | st.integers() | _hostile_strings(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_hostile_strings(), inner,
                                                                max_size=3),
    max_leaves=8,
)  # fmt: skip
envelopes = st.builds(
    lambda named, extra: {**extra, **named},
    st.fixed_dictionaries(
        {}, optional={k: hostile_values for k in ("v", "suite", "to", "from", "bound", "sealed",
                                                   "sig")},
    ),
    st.dictionaries(_hostile_strings(), hostile_values, max_size=2),
)  # fmt: skip
"""Envelopes with any of the real fields (or none), each holding anything, and more."""


def _hostile_message(envelope: dict[str, Any], shape: str, hostile: str) -> dict[str, Any]:
    message = sealed_message(envelope, message_id="m1")
    if shape == "extra part":  # half sealed: a clear part beside the sealed one
        message["parts"].append({"text": hostile})
    elif shape == "undeclared":  # a sealed part, the extension not declared
        message["extensions"] = []
        message["parts"].append({"text": hostile})
    elif shape == "declared only":  # the extension declared, the part in clear
        message["parts"] = [{"text": hostile}]
    elif shape == "clear metadata":  # words in the message's clear metadata
        message["metadata"] = {"note": hostile}
    return message


@settings(max_examples=100, deadline=None)
@given(
    envelopes,
    st.sampled_from(["as is", "extra part", "undeclared", "declared only", "clear metadata"]),
    _hostile_strings(),
    st.sampled_from(["request", "result", "event"]),
)
def test_nothing_a_hostile_envelope_says_reaches_the_page(
    envelope: dict[str, Any], shape: str, hostile: str, where: str
) -> None:
    message = _hostile_message(envelope, shape, hostile)
    clear = json.dumps({"parts": [{"text": "a question in clear"}]})
    body = json.dumps({"message": message})
    events: list[TaskEvent] = []
    if where == "request":
        task = _task(json.dumps(message), None, state=TaskState.QUEUED)
    elif where == "result":
        task = _task(clear, body)
    else:
        task = _task(clear, None, state=TaskState.LEASED)
        status = json.dumps({"status": {"message": message}})
        events = [TaskEvent(1, "t1", iso(20), "status", status)]
    page = _page(task, events)
    assert HOSTILE not in page
    assert html.escape(HOSTILE) not in page
    assert "sealed" in page


@given(st.binary(max_size=300))
def test_the_size_said_is_the_ciphertexts_decoded_length(raw: bytes) -> None:
    text = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    assert sealed.ciphertext_size(text) == len(raw)
    assert sealed.ciphertext_size(text + "=" * (-len(text) % 4)) == len(raw)
    assert sealed.ciphertext_size(text + "!") is None
    assert sealed.ciphertext_size(len(raw)) is None


def test_clear_bodies_are_shown_as_stored_and_withheld_on_a_sealed_task() -> None:
    body = '{"parts":[{"text":"<b>hi</b>"}],"n":12345678901234567890}'
    assert sealed.shown(body) == sealed.Shown(body, (), len(body))
    withheld = sealed.shown(body, task_sealed=True)
    assert withheld.text is None
    assert not withheld.sealed
    assert "in clear" in withheld.why
    # the media type named in clear text is not a seal
    talk = json.dumps({"parts": [{"text": f"about {MEDIA_TYPE} and {SEALED_URI}"}]})
    assert sealed.shown(talk).text == talk
    assert sealed.request_seal(talk) is None
    assert sealed.shown("not json").text == "not json"
    assert sealed.shown(f"not json {MEDIA_TYPE}").text is None
    assert sealed.fingerprint(CALLER_KEYS.public.fingerprint) == CALLER_KEYS.public.fingerprint
    assert sealed.fingerprint(CALLER_KEYS.public.fingerprint + " ") is None


def _visible(page: str) -> str:
    """The page's text and attributes, unescaped (what a person or a scraper reads)."""
    return html.unescape(page)


def test_the_dashboard_shows_a_real_sealed_task_sealed(
    sealed: Sealed, relay: RelayProc, store: Store
) -> None:
    secret = "payroll " + "Zt4q" * 4
    task_id, _ = sealed.send(secret)
    done = sealed.net.settled(task_id)
    assert done["state"] == "succeeded", done
    row = store.get_task(WORKSPACE, task_id)
    assert row is not None
    assert row.result is not None
    request = envelope_of(json.loads(row.payload))
    result = envelope_of(json.loads(row.result)["message"])
    assert request is not None
    assert result is not None
    codex, ops = sealed.codex_keys.public.fingerprint, sealed.ops_key.fingerprint

    c, _ = sign_in(relay.url, relay.owner_token)
    page = c.get(f"/ui/tasks/{task_id}")
    assert page.status_code == 200, page.text
    text = _visible(page.text)
    assert "sealed" in text
    assert 'class="payload"' not in page.text  # no payload box at all
    steps = re.findall(r'<li class="step step-(\w+)[^"]*">(.*?)</li>', page.text, re.S)
    boxed = {kind for kind, body in steps if 'class="sealed-body"' in body}
    assert {"accepted", "completed"} <= boxed, steps
    assert f"{_decoded_size(request)} bytes of ciphertext, sealed to key {ops}" in re.sub(
        r"<[^>]+>", "", text
    )
    assert f"{_decoded_size(result)} bytes of ciphertext, sealed to key {codex}" in re.sub(
        r"<[^>]+>", "", text
    )
    for word in (secret, secret.upper(), request["sealed"], result["sealed"], request["sig"]):
        assert word not in text
        assert word[:24] not in text
    # the live parts of the same page say the same, and no more
    with c.stream("GET", f"/ui/tasks/{task_id}/live", timeout=30) as stream:
        live = " ".join(d["html"] for _, _, d in frames(stream.iter_lines(), 2))
    assert codex in live
    assert ops in live
    for word in (secret, secret.upper(), request["sealed"][:24], result["sealed"][:24]):
        assert word not in _visible(live)

    # the list marks it sealed; the agents page shows both registered keys' fingerprints
    listing = c.get("/ui/tasks")
    (row_html,) = re.findall(rf'<tr data-task="{task_id}".*?</tr>', listing.text, re.S)
    assert 'class="sealed-mark"' in row_html
    assert ops in _visible(row_html)
    agents = c.get("/ui/agents").text
    for agent, fp in ((CALLER, codex), (RECEIVER, ops)):
        (agent_row,) = re.findall(rf'<tr id="agent-\d+" data-agent="{agent}">.*?</tr>', agents,
                                  re.S)  # fmt: skip
        assert fp in agent_row
    grants = c.get("/ui/grants").text  # the grant was made --sealed
    assert "sealed sends only" in grants
    overview = c.get("/ui/").text
    assert 'class="sealed-mark"' in overview
    assert secret not in _visible(listing.text + agents + overview)


def test_lists_mark_sealed_tasks_and_remember_each_turns_answer() -> None:
    sealed_task, (envelope, _) = _sealed_task(MARK + "list")
    clear = _task(json.dumps({"parts": [{"text": f"{MEDIA_TYPE} in clear"}]}), None, id="t2")
    for _ in range(2):  # the second time from what the list remembers: the same answer
        marks = pages.seals_of([sealed_task, clear])
        assert marks == {
            "t1": sealed.Seal(
                RECEIVER_KEYS.public.fingerprint, CALLER_KEYS.public.fingerprint,
                _decoded_size(envelope),
            ),
            "t2": None,
        }  # fmt: skip
    # the next turn's message is the next turn's: answered anew
    answered = _task(clear.payload, None, id="t1", turn=2)
    assert pages.seals_of([answered]) == {"t1": None}
