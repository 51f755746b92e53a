"""The outbox file is hostile input: bounded, never followed, and a bad line costs only itself."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.plane import outbox


def test_append_then_read_round_trips(tmp_path: Path) -> None:
    box = tmp_path / "out.ndjson"
    outbox.append(box, "ledger", "line one\nline two ✓", "n1")
    outbox.append(box, "clerk", "", "n2")
    assert outbox.read(box) == outbox.Outbox(
        [outbox.Note(1, "ledger", "line one\nline two ✓", "n1"), outbox.Note(2, "clerk", "", "n2")],
        [],
    )
    assert outbox.recipients(box) == ["ledger", "clerk"]
    assert oct(box.stat().st_mode & 0o777) == "0o600"


def test_a_note_too_long_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    box = tmp_path / "out.ndjson"
    with pytest.raises(outbox.OutboxError, match="at most"):
        outbox.append(box, "ledger", "x" * (outbox.MAX_NOTE_BYTES + 1), "n1")
    assert not box.exists()


def test_a_symlink_or_a_fifo_is_not_followed_or_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(json.dumps({"to": "ledger", "text": "a file the agent may not name"}) + "\n")
    link = tmp_path / "link.ndjson"
    link.symlink_to(secret)
    read = outbox.read(link)
    assert read.notes == []
    assert "could not be read" in read.problems[0]
    with pytest.raises(outbox.OutboxError):
        outbox.append(link, "ledger", "x", "n1")
    fifo = tmp_path / "fifo.ndjson"
    os.mkfifo(fifo)
    read = outbox.read(fifo)  # must not block waiting for a writer
    assert read.notes == []
    assert "not a regular file" in read.problems[0]


def test_a_missing_outbox_is_an_empty_one(tmp_path: Path) -> None:
    assert outbox.read(tmp_path / "none") == outbox.Outbox([], [])


@given(st.lists(st.one_of(st.binary(max_size=60), st.just(b"GOOD")), max_size=12))
def test_any_bytes_keep_the_good_notes_and_name_the_bad_lines(lines: list[bytes]) -> None:
    import tempfile

    good = json.dumps({"to": "ledger", "text": "ok"}).encode()
    raw = [good if line == b"GOOD" else line.replace(b"\n", b" ") for line in lines]
    with tempfile.TemporaryDirectory() as d:
        box = Path(d) / "out.ndjson"
        box.write_bytes(b"".join(line + b"\n" for line in raw))
        read = outbox.read(box)
    expected_good = [i + 1 for i, line in enumerate(raw) if line == good]
    assert [n.line for n in read.notes if n.text == "ok" and n.to == "ledger"] == [
        i for i in expected_good if i <= outbox.MAX_LINES
    ]
    for problem in read.problems:
        assert problem.startswith(("line ", "the outbox has more than"))
