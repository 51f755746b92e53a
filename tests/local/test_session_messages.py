"""tell, ask, answer, task, report and end between live sessions, with truthful receipts."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from melchior.policy.fence import unfence
from melchior.session.client import call_once
from melchior.wire.calls import Refused
from session_harness import Harness


@pytest.fixture
def harness(runtime_dir: Path, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(runtime_dir, tmp_path / "config")
    yield h
    h.close()


def test_tell_reaches_the_harness_fenced_with_ids_and_chain(harness: Harness) -> None:
    root = harness.start()
    child = root.spawn()
    r = child.tool("--verb=tell", f"--who={root.id}", "--message=the parser is done")
    receipt = r.one
    assert r.rc == 0
    assert receipt["receipt"] == "delivered"
    assert receipt["hop"] == 1
    got = root.next_event("message")
    assert got["who"] == f"demo/sub/{child.id}"
    assert got["sort"] == "attention"
    assert got["text"] == "the parser is done"
    assert got["message_id"] == receipt["message_id"]
    assert (got["chain"], got["hop"], got["path"]) == (receipt["chain"], 1, [child.id])
    assert unfence(got["fenced"]) == (f"demo/sub/{child.id}", "attention", "the parser is done")


def test_a_busy_recipient_queues_and_says_so(harness: Harness) -> None:
    root = harness.start()
    root.doing(busy=True, working_for=1, waiting=0)
    for _ in range(200):
        if harness.tool("--verb=status", f"--who={root.id}").one["busy"]:
            break
    r = harness.tool("--verb=tell", f"--who={root.id}", "--message=when you can", "--sort=note")
    assert r.one["receipt"] == "queued"
    assert root.next_event("message")["sort"] == "note"


def test_the_operator_tells_as_project_operator(harness: Harness) -> None:
    root = harness.start()
    assert harness.tool("--verb=tell", f"--who={root.id}", "--message=hi").rc == 0
    assert root.next_event("message")["who"] == "demo/operator/-"


def test_a_relay_of_real_sessions_is_refused_at_the_fifth_hop(harness: Harness) -> None:
    """Each harness passes on the chain of the message it got, as a model's tool call would.

    The operator's words are hop 1; four sessions relay them; the fifth hop is refused on
    the sender's side with the chain named, and the recipient never sees it.
    """
    harness.set_talk("project")  # five mains that may all reach each other
    a, b, c, d, e = (harness.start() for _ in range(5))
    assert harness.tool("--verb=tell", f"--who={a.id}", "--message=pass it on").rc == 0
    got = a.next_event("message")
    assert got["hop"] == 1
    for sender, recipient, hop in ((a, b, 2), (b, c, 3), (c, d, 4)):
        chain = json.dumps({k: got[k] for k in ("chain", "hop", "path")})
        r = sender.tool("--verb=tell", f"--who={recipient.id}", "--message=on", f"--chain={chain}")
        assert r.rc == 0
        assert r.one["receipt"] == "delivered"
        assert r.one["hop"] == hop
        got = recipient.next_event("message")
        assert (got["hop"], got["path"][-1]) == (hop, sender.id)
        assert got["chain"] == r.one["chain"]
    assert got["path"][1:] == [a.id, b.id, c.id]
    chain = json.dumps({k: got[k] for k in ("chain", "hop", "path")})
    r = d.tool("--verb=tell", f"--who={e.id}", "--message=on", f"--chain={chain}")
    assert r.rc == 1
    assert r.error["rule"] == "hop-limit"
    assert r.error["receipt"] == "refused"
    assert f"hop 5 of chain {got['chain']}" in r.error["reason"]
    # The same through the environment a harness sets for its model's tool calls.
    env = dict(d.tool_env(), MAGI_MELCHIOR_CHAIN=chain)
    r = harness.tool("--verb=ask", f"--who={e.id}", "--message=on?", env=env)
    assert r.rc == 1
    assert r.error["rule"] == "hop-limit"
    # e was never reached: a fresh tell from the operator is the first thing it sees.
    assert harness.tool("--verb=tell", f"--who={e.id}", "--message=new words").rc == 0
    fresh = e.next_event("message")
    assert (fresh["text"], fresh["hop"]) == ("new words", 1)


def test_the_hop_count_carries_and_the_fifth_hop_is_refused(harness: Harness) -> None:
    root = harness.start()
    child = root.spawn()
    hop3 = json.dumps({"chain": "c1", "hop": 3, "path": ["x", "y", "z"]})
    r = child.tool("--verb=tell", f"--who={root.id}", "--message=4th", f"--chain={hop3}")
    assert r.one["hop"] == 4
    assert r.one["path"] == ["x", "y", "z", child.id]
    assert root.next_event("message")["hop"] == 4
    hop4 = json.dumps({"chain": "c1", "hop": 4, "path": ["x", "y", "z", "w"]})
    r = child.tool("--verb=tell", f"--who={root.id}", "--message=5th", f"--chain={hop4}")
    assert r.rc == 1
    assert r.error["rule"] == "hop-limit"
    # The recipient refuses it too when a caller skips the tool.
    with pytest.raises(Refused) as exc:
        call_once(
            root.at,
            "tell",
            ["5th"],
            sender=child.id,
            who=root.id,
            chain={"chain": "c1", "hop": 5, "path": ["a", "b", "c", "d", "e"]},
        )
    assert exc.value.detail["rule"] == "hop-limit"


def test_the_harness_passes_the_chain_it_is_answering(harness: Harness) -> None:
    root = harness.start()
    child = root.spawn()
    env = child.tool_env()
    env["MAGI_MELCHIOR_CHAIN"] = json.dumps({"chain": "c9", "hop": 2, "path": ["a", "b"]})
    r = harness.tool("--verb=tell", f"--who={root.id}", "--message=re: that", env=env)
    assert (r.one["chain"], r.one["hop"]) == ("c9", 3)
    env["MAGI_MELCHIOR_CHAIN"] = json.dumps({"chain": "c9", "hop": 4, "path": ["a", "b"]})
    r = harness.tool("--verb=tell", f"--who={root.id}", "--message=re: re:", env=env)
    assert r.rc == 1
    assert r.error["rule"] == "hop-limit"


def test_ask_answer_task(harness: Harness) -> None:
    root = harness.start()
    child = root.spawn()
    asked = root.tool("--verb=ask", f"--who={child.id}", "--message=is the parser done?").one
    about = asked["about"]
    assert about.startswith(f"{child.id}@")
    assert asked["receipt"] == "delivered"
    q = child.next_event("message")
    assert (q["sort"], q["about"], q["text"]) == ("question", about, "is the parser done?")
    pending = root.tool("--verb=task", f"--about={about}").one
    assert pending["state"] == "pending"
    # Only the one asked may answer.
    other = root.spawn()
    wrong = other.tool("--verb=answer", f"--about={about}", "--message=yes")
    assert wrong.rc == 1
    assert child.id in wrong.error["reason"]
    ans = child.tool("--verb=answer", f"--about={about}", "--message=yes, merged")
    assert ans.one["receipt"] == "delivered"
    got = root.next_event("message")
    assert (got["sort"], got["about"], got["text"]) == ("answer", about, "yes, merged")
    # The answer is one hop further than the question, on the same chain.
    assert (got["chain"], got["hop"], got["path"]) == (q["chain"], 2, [root.id, child.id])
    done = root.tool("--verb=task", f"--about={about}").one
    assert (done["state"], done["answer"], done["receipt"]) == (
        "answered",
        "yes, merged",
        "answered",
    )
    again = child.tool("--verb=answer", f"--about={about}", "--message=twice")
    assert again.rc == 1
    assert "already answered" in again.error["reason"]


def test_task_with_a_childs_bare_id_gives_its_status(harness: Harness) -> None:
    root = harness.start()
    child = root.spawn()
    status = root.tool("--verb=task", f"--about={child.id}").one
    assert status["id"] == child.id
    assert status["parent"] == root.id
    assert "busy" in status
    assert root.tool("--verb=task", f"--about={child.id}", f"--who={child.id}").rc == 0
    # Not a child of the caller: a clear refusal, not a status.
    sibling = root.spawn()
    r = sibling.tool("--verb=task", f"--about={child.id}")
    assert r.rc == 2
    assert "not a task handle" in r.error["reason"]
    r = root.tool("--verb=task", f"--about={root.id}@m000000000000")
    assert r.rc == 1
    assert r.error["code"] == "unknown-task"


def test_reports_revisions_digests_pages_and_notification(harness: Harness) -> None:
    root = harness.start()
    child = root.spawn()
    first = child.tool("--verb=report", "--message=parser done").one
    assert first["revision"] == 1
    assert first["sha256"] == hashlib.sha256(b"parser done").hexdigest()
    assert first["notified"]["receipt"] == "delivered"
    note = root.next_event("message")
    assert (note["sort"], note["revision"], note["from"]) == ("report", 1, child.id)
    second = child.tool("--verb=report", "--message=parser done").one
    assert second["revision"] == 2
    assert second["sha256"] == first["sha256"]
    assert root.next_event("message")["revision"] == 2
    body = ("é" * 9000).encode()
    third = child.tool("--verb=report", "--about=-", stdin=body).one
    assert third["revision"] == 3
    whole = root.tool("--verb=report", f"--who={child.id}", "--about=json").one
    assert whole["text"] == body.decode()
    assert whole["revision"] == 3
    assert whole["sha256"] == hashlib.sha256(body).hexdigest()
    p1 = root.tool("--verb=report", f"--who={child.id}").one
    p2 = root.tool("--verb=report", f"--who={child.id}", "--page=2").one
    assert p1["pages"] == 2
    assert p1["text"] + p2["text"] == body.decode()
    assert root.tool("--verb=report", f"--who={child.id}", "--page=3").rc == 2


def test_old_plain_text_reports_stay_readable(harness: Harness) -> None:
    root = harness.start()
    (harness.registry / f"{root.id}.report").write_text("an old report\n")
    got = root.tool("--verb=report", "--about=json").one
    assert (got["text"], got["revision"], got["format"]) == ("an old report\n", 0, "plain")
    assert root.tool("--verb=report", "--message=new").one["revision"] == 1


def test_a_root_report_is_stored_without_a_parent_to_notify(harness: Harness) -> None:
    root = harness.start()
    r = root.tool("--verb=report", "--message=root notes").one
    assert r["notified"] is None
    assert r["stored"] is True


def test_only_the_minter_can_end_a_child(harness: Harness) -> None:
    root = harness.start()
    child = root.spawn()
    sibling = root.spawn()
    r = sibling.tool("--verb=end", f"--who={child.id}")
    assert r.rc == 1
    assert "only the session that minted" in r.error["reason"]
    assert (r.error["rule"], r.error["receipt"]) == ("minter-ends", "refused")
    with pytest.raises(Refused, match=r"not .* token") as exc:
        call_once(child.at, "end", ["guess"], sender=sibling.id, who=child.id)
    assert exc.value.detail == {"rule": "token", "receipt": "refused"}
    ok = root.tool("--verb=end", f"--who={child.id}").one
    assert ok == {"ending": True, "who": child.id}
    assert child.next_event("end")["who"] == f"demo/main/{root.id}"
    assert child.proc.wait() == 0
    assert not child.at.exists()
    r = root.tool("--verb=status", f"--who={child.id}")
    assert r.rc == 1
    assert r.error["code"] == "unknown"


def test_a_root_cannot_be_ended_over_the_socket(harness: Harness) -> None:
    root = harness.start()
    with pytest.raises(Refused, match="only its harness"):
        call_once(root.at, "end", ["x"], sender=None, who=root.id)


def test_the_token_itself_is_the_capability(harness: Harness) -> None:
    root = harness.start()
    minted = root.fork()
    child = harness.start(harness.env(**minted["environment"]))
    assert call_once(child.at, "end", [minted["token"]], sender=None, who=child.id) == [
        {"ending": True}
    ]
    assert child.next_event("end")["who"] == "demo/operator/-"
    assert child.proc.wait() == 0
