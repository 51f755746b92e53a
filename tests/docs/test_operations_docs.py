"""docs/operations.md: the example config and the settings table are the ones the code
generates, every variable it names exists, and its HTTPS walk-through runs as written."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from doc_kit import Ran, free_port, run_bash, script_bin, sh_blocks
from melchior.mellan import transport
from melchior.mellan.relay.server import settings
from melchior.mellan.relay.store import migrations
from paths_kit import REPO

ROOT = REPO
DOC = ROOT / "docs" / "operations.md"


def generated(name: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(
        rf"<!-- BEGIN generated: settings\.{name}\(\) -->\n(.*?)<!-- END generated -->", text, re.S
    )
    assert match, f"docs/operations.md has no generated block for {name}"
    return match.group(1)


def test_the_example_config_is_the_generated_one_and_loads(tmp_path: Path) -> None:
    block = generated("example_toml")
    assert block == f"```toml\n{settings.example_toml()}```\n", (
        "regenerate: python -c 'from melchior.mellan.relay.server import settings; "
        "print(settings.example_toml())'"
    )
    path = tmp_path / "relay.toml"
    path.write_text(block.removeprefix("```toml\n").removesuffix("```\n"))
    assert set(settings.load_file(path)) == {s.key for s in settings.SETTINGS}


def test_the_settings_table_is_the_generated_one() -> None:
    assert generated("markdown_table") == settings.markdown_table()


def test_every_variable_named_exists_and_the_schema_version_is_current() -> None:
    text = DOC.read_text(encoding="utf-8")
    known = {s.env for s in settings.SETTINGS} | {
        settings.CONFIG_ENV, transport.CA_FILE_ENV, transport.CLIENT_CERT_ENV,
        transport.CLIENT_KEY_ENV, "MELLAN_RELAY", "MELLAN_TOKEN",
    }  # fmt: skip
    named = set(re.findall(r"MELLAN_[A-Z_]+[A-Z]", text))
    assert named <= known, named - known
    current = re.search(r"knows a schema version \(currently (\d+)\)", text)
    assert current
    assert int(current.group(1)) == migrations.LATEST_POSTGRES


def test_the_readme_links_it() -> None:
    assert "(docs/operations.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


def walk(heading: str, port: int, tmp_path: Path) -> Ran:
    """Run one of docs/operations.md's walk-throughs as written (``mellan`` on PATH, no
    inherited ``MELLAN_*``, the relay on ``port``); it must succeed."""
    (script,) = sh_blocks("operations.md", heading)
    done = run_bash(
        script, bindir=script_bin("mellan"), drop=("MELLAN_",),
        env={"PORT": str(port), "TMPDIR": str(tmp_path)}, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done


@pytest.mark.skipif(
    not all(shutil.which(t) for t in ("openssl", "curl", "jq")),
    reason="the walk-through needs openssl, curl and jq",
)
def test_the_walk_through_runs(tmp_path: Path) -> None:
    port = free_port()
    done = walk("Walk-through: HTTPS with a test CA", port, tmp_path)
    out = done.stdout
    assert f"port = {port}  # file relay.toml" in out
    assert "logged in to https://127.0.0.1" in out
    assert "refused: the public roots do not know this CA" in out
    assert "refused: a token in clear to another machine" in out
    assert "certificate does not verify" in done.stderr
    assert "refusing to send a credential over plain HTTP to 192.0.2.1" in done.stderr
    assert "100%" in done.stderr
    assert "consistent" in done.stderr
    assert "relay-backup.db" in out


@pytest.mark.skipif(
    not all(shutil.which(t) for t in ("curl", "jq")),
    reason="the walk-through needs curl and jq",
)
def test_the_metrics_walk_through_runs(tmp_path: Path) -> None:
    done = walk("Walk-through: metrics, request ids and a send limit", free_port(), tmp_path)
    out = done.stdout
    assert '{"ready":true,"schema":' in out
    assert "refused: send 3 is over the limit" in out
    assert "HTTP/1.1 429" in out
    assert "retry-after: 5" in out.lower()
    assert "x-request-id: walk-1" in out.lower()
    assert "max-unfinished-per-receiver" in out
    assert '{"action":"quota.refused","rule":"max-unfinished-per-receiver"}' in out
    assert '{"logger":"melchior.mellan.access","route":"/a2a rest SendMessage","status":429}' in out
    assert "mellan_tasks_accepted_total 2" in out
    assert 'mellan_quota_refusals_total{limit="max-unfinished-per-receiver"} 2' in out
    assert 'mellan_queue_depth{agent="private/ops",workspace="default"} 2' in out
