"""One database-URL parser for every command: the forms docs/operations.md shows parse,
``sqlite:////ABS`` is the same file as ``sqlite:///ABS`` for the relay and for backup,
every other text is refused with a reason (never another exception), and a failed backup
leaves no partial file behind."""

from __future__ import annotations

import re
import subprocess
from contextlib import ExitStack
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.mellan.relay.server.backup import BackupError, backup, sqlite_path
from melchior.mellan.relay.server.settings import SETTINGS
from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.dburl import DatabaseURLError, parse, problem
from melchior.mellan.relay.store.transfer import _Source
from paths_kit import REPO
from relay_proc import MELLAN, relay_env


def mellan(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MELLAN, "relay", *args], capture_output=True, text=True, timeout=120, env=relay_env(home)
    )


DOCS = REPO / "docs" / "operations.md"
URL_IN_DOCS = re.compile(r"""(?:sqlite|postgres(?:ql)?)://[^\s"'`)<>]+""")


def test_every_url_form_in_the_operations_guide_parses() -> None:
    """Every URL the guide shows parses as it says — except those in the sentence saying
    which forms are refused, which are refused."""
    text = DOCS.read_text()
    refusing = next(s for s in re.split(r"(?<=\.)\s", text) if "are refused with the reason" in s)
    refused = URL_IN_DOCS.findall(refusing)
    assert refused, refusing
    for url in refused:
        with pytest.raises(DatabaseURLError):
            parse(url)
    found = URL_IN_DOCS.findall(text.replace(refusing, ""))
    assert len(found) >= 5, found
    for text in found:
        url = text.replace("$PWD", "/srv/mellan").rstrip(".,;:")
        if url.endswith("…"):
            continue  # an elided URL ("postgresql://…") in prose
        db = parse(url)
        if url.startswith("sqlite"):
            assert db.path is not None
            assert db.path.is_absolute(), url
        else:
            assert db.postgres
            assert db.url == url


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///srv/relay.db", "/srv/relay.db"),
        ("sqlite:////srv/relay.db", "/srv/relay.db"),
        ("sqlite://///srv/relay.db", "/srv/relay.db"),
        ("relay.db", "relay.db"),
        ("./data/relay.db", "data/relay.db"),
        ("/srv/relay.db", "/srv/relay.db"),
    ],
)
def test_sqlite_forms(url: str, path: str) -> None:
    assert parse(url).path == Path(path)
    assert not parse(url).postgres


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("sqlite://relay.db", "absolute path"),
        ("sqlite:relay.db", "unsupported database URL"),
        ("sqlite:///", "names no file"),
        ("sqlite:///srv/relay.db?mode=ro", "no query"),
        ("sqlite:///srv/relay.db#x", "no query"),
        ("mysql://db/mellan", "unsupported database URL"),
        ("", "empty"),
        ("relay\x00.db", "NUL"),
    ],
)
def test_refused_forms_say_why(url: str, why: str) -> None:
    with pytest.raises(DatabaseURLError, match=why):
        parse(url)
    assert why in (problem(url) or "")
    database = next(s for s in SETTINGS if s.key == "database")
    assert database.check is not None
    assert database.check(url) == problem(url)


@given(st.text(max_size=80))
def test_any_text_parses_or_is_refused_by_name(text: str) -> None:
    why = problem(text)  # only DatabaseURLError is caught there: anything else fails here
    if why is None:
        db = parse(text)
        assert db.postgres or db.path is not None
    else:
        assert why.strip()


@given(st.lists(st.from_regex(r"[A-Za-z0-9._ -]{1,12}", fullmatch=True), min_size=1, max_size=4),
       st.integers(min_value=1, max_value=4))  # fmt: skip
def test_slashes_after_the_scheme_name_one_absolute_file(parts: list[str], extra: int) -> None:
    path = "/" + "/".join(parts)
    assert parse("sqlite://" + "/" * extra + path.lstrip("/")).path == Path(path)


def test_relay_and_backup_read_four_slashes_as_the_same_file(tmp_path: Path) -> None:
    db = tmp_path / "relay.db"
    url = f"sqlite:///{db}"  # four slashes: sqlite: // / + /tmp/…
    assert url.startswith("sqlite:////")
    open_store(url).close()
    assert db.exists()
    assert sqlite_path(url) == db
    out = mellan(tmp_path, "backup", str(tmp_path / "copy.db"), "--database", url)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert (tmp_path / "copy.db").exists()
    assert not (tmp_path / ".copy.db.partial").exists()


def test_a_failed_backup_leaves_no_partial_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not an SQLite database" * 200)
    with pytest.raises(BackupError, match=r"backup of .* failed"):
        backup(junk, tmp_path / "copy.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.db"]
    out = mellan(tmp_path, "backup", str(tmp_path / "copy.db"), "--database", f"sqlite://{junk}")
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "xdg") == ["junk.db"]


def test_migrate_reads_the_url_the_same_way(tmp_path: Path) -> None:
    db = tmp_path / "relay.db"
    open_store(str(db)).close()
    with ExitStack() as stack:
        source = _Source(f"sqlite:///{db}", stack)  # four slashes, as the relay takes it
        assert source.lite is not None
        assert source.lite.execute("PRAGMA quick_check").fetchone()[0] == "ok"
