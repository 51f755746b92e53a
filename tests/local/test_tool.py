"""``melchior tool`` as a script sees it: one JSON object on stdout, honest exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.tool import VOCABULARY, schema
from paths_kit import REPO
from session_harness import WAIT, Harness, melchior


@pytest.fixture
def harness(runtime_dir: Path, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(runtime_dir, tmp_path / "config")
    yield h
    h.close()


def test_schema_is_data_covering_every_verb(harness: Harness) -> None:
    printed = subprocess.run(
        melchior("tool", "--schema"), capture_output=True, check=True, timeout=WAIT
    )
    doc = json.loads(printed.stdout)
    assert doc == schema()
    assert doc["$schema"].startswith("https://json-schema.org/")
    verbs = {alt["properties"]["verb"]["const"]: alt for alt in doc["oneOf"]}
    assert set(verbs) == {"who", "status", "tell", "ask", "answer", "task", "report", "end"}
    assert verbs["tell"]["required"] == ["verb", "who", "message"]
    assert verbs["tell"]["properties"]["sort"]["enum"] == ["attention", "note"]
    for alt in doc["oneOf"]:
        assert alt["type"] == "object"
        assert alt["additionalProperties"] is False
        assert set(alt["required"]) <= set(alt["properties"])


def _valid(instance: dict[str, Any]) -> bool:
    """A tiny validator for the schema's own subset (const, enum, type, required)."""
    for alt in schema()["oneOf"]:
        props = alt["properties"]
        if set(instance) - set(props) or not set(alt["required"]) <= set(instance):
            continue
        good = True
        for key, value in instance.items():
            p = props[key]
            if "const" in p and value != p["const"]:
                good = False
            if "enum" in p and value not in p["enum"]:
                good = False
            if p.get("type") == "string" and not isinstance(value, str):
                good = False
            if p.get("type") == "integer" and not isinstance(value, int):
                good = False
        if good:
            return True
    return False


@given(st.sampled_from([v.name for v in VOCABULARY]), st.sampled_from(["attention", "loud"]))
def test_schema_accepts_what_the_tool_accepts(verb: str, sort: str) -> None:
    v = next(x for x in VOCABULARY if x.name == verb)
    instance: dict[str, Any] = {"verb": verb, **{p.name: "alpha-beta" for p in v.required}}
    assert _valid(instance)
    assert not _valid({**instance, "unheard_of": "x"})
    if verb == "tell":
        assert _valid({**instance, "sort": sort}) == (sort == "attention")


def test_unknown_verb_and_missing_args_are_json_refusals(harness: Harness) -> None:
    r = harness.tool("--verb=dance")
    assert r.rc == 2
    assert "unknown verb 'dance'" in r.error["reason"]
    assert "tell" in r.error["reason"]
    r = harness.tool("--verb=tell", "--message=hi")
    assert r.rc == 2
    assert "--who" in r.error["reason"]
    r = harness.tool("--verb=tell", "--who=not an id", "--message=hi")
    assert r.rc == 2
    assert "not a session id" in r.error["reason"]
    r = harness.tool()
    assert r.rc == 2
    assert "--verb" in r.error["reason"]
    r = harness.tool("--verb=tell", "--who=alpha-beta", "--message=hi", "--chain=[1]")
    assert r.rc == 2
    assert "not a chain" in r.error["reason"]
    r = harness.tool("--verb=tell", "--who=alpha-beta", "--message=hi", "--sort=loud")
    assert r.rc == 2
    assert r.error["code"] == "bad-args"
    assert "attention, note" in r.error["reason"]


def test_unknown_recipient_is_an_error_never_a_success(harness: Harness) -> None:
    root = harness.start()
    r = root.tool("--verb=tell", "--who=omega-psi", "--message=hello?")
    assert r.rc == 1
    assert r.error["code"] == "unknown"
    assert r.error["receipt"] == "refused"


def test_the_operator_may_look_and_tell_but_not_ask(harness: Harness) -> None:
    root = harness.start()
    assert harness.tool("--verb=status", f"--who={root.id}").rc == 0
    r = harness.tool("--verb=ask", f"--who={root.id}", "--message=?")
    assert r.rc == 1
    assert r.error["code"] == "anonymous"
    assert "MAGI_MELCHIOR_ID" in r.error["reason"]


def test_a_session_whose_serve_is_not_running_is_told_so(harness: Harness) -> None:
    root = harness.start()
    minted = root.fork()
    r = harness.tool("--verb=status", env=harness.env(**minted["environment"]))
    assert r.rc == 1
    assert r.error["code"] == "not-serving"


def test_stdout_holds_exactly_one_object_even_on_setup_errors(harness: Harness) -> None:
    r = harness.tool("--verb=who", env=harness.env(MAGI_MELCHIOR_PROJECT="../x"))
    assert r.rc == 1
    assert "may not contain" in r.error["reason"]


@pytest.mark.parametrize("command", ["serve", "tool", "fork", "verbs"])
def test_every_command_has_help(command: str) -> None:
    out = subprocess.run(melchior(command, "--help"), capture_output=True, timeout=WAIT)
    assert out.returncode == 0
    assert b"usage: melchior " + command.encode() in out.stdout


def test_the_tool_path_does_not_import_an_event_loop_for_who(harness: Harness) -> None:
    code = (
        "import sys; from melchior.cli import main; main(['tool', '--verb=who']); "
        "sys.stderr.write(str('asyncio' in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, env=harness.env(), timeout=WAIT
    )
    assert out.stderr == b"False"


def test_invalid_utf8_in_argv_is_refused_not_a_crash(harness: Harness) -> None:
    root = harness.start()
    args = [a.encode() for a in melchior("tool", "--verb=tell", f"--who={root.id}")]
    proc = subprocess.run(
        [*args, b"--message=caf\xe9"], capture_output=True, env=harness.env(), timeout=WAIT
    )
    reply = json.loads(proc.stdout)
    assert proc.returncode == 2
    assert "not valid UTF-8" in reply["error"]["reason"]


@pytest.mark.parametrize("args", [("--verb=who", "--bogus"), ("--page=0",), ("--page=x",)])
def test_flags_argparse_rejects_are_json_refusals_too(harness: Harness, args: tuple[str]) -> None:
    r = harness.tool(*args)
    assert r.rc == 2
    assert r.error["code"] == "bad-args"
    assert "melchior tool --help" in r.error["reason"]


HEAVY = {"argparse", "dataclasses", "inspect", "tomllib", "hashlib", "secrets", "asyncio"}
"""Modules 'status' and 'who' must not import: start-up is a feature (issue 3), and a
structural check stays true on a loaded machine where a timing threshold would not."""

QUICK_NEVER = {"melchior.tool", "melchior.names", "pathlib", "typing", "socket", "selectors"}
"""Modules ``status`` about oneself must not import (each costs 2-4 ms of the exec)."""

_IMPORTS = (
    "import json, sys\n"
    "from melchior.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "sys.stderr.write(json.dumps(sorted(sys.modules)))\n"
    "sys.exit(code)\n"
)


@pytest.mark.parametrize("verb", [["--verb=status"], ["--verb=who"], ["--verb=status", "WHO"]])
def test_status_and_who_import_nothing_heavy(harness: Harness, verb: list[str]) -> None:
    root = harness.start()
    args = [a.replace("WHO", f"--who={root.id}") for a in verb]
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS, "tool", *args],
        env=root.tool_env(),
        capture_output=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stdout
    assert json.loads(done.stdout)["ok"] is True
    loaded = set(json.loads(done.stderr))
    assert loaded & HEAVY == set()
    if verb == ["--verb=status"]:
        # A session asking about itself takes the short path (melchior.quick_status): none of
        # the vocabulary, walls, pathlib, typing or socket's enums (issue 10).
        assert "melchior.quick_status" in loaded
        assert loaded & QUICK_NEVER == set()
    else:
        assert "melchior.tool" in loaded


SCRIPT = REPO / "scripts" / "melchior"
"""The installed ``melchior`` command (pyproject's script-files), not pip's launcher."""

NEVER_ON_STATUS = {"re", "enum", "json", "typing", "pathlib", "socket", "selectors", "asyncio"}
"""What ``status`` about oneself must not import through the installed command: each is
2-5 ms of an exec that a bare interpreter does in ~12 ms (issue 10)."""


def test_the_melchior_command_answers_status_without_re_json_or_typing(harness: Harness) -> None:
    root = harness.start()
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(SCRIPT), "tool", "--verb=status"],
        env=root.tool_env(),
        capture_output=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"][0]["id"] == root.id
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.decode().splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "melchior.quick_status" in imported
    assert imported & NEVER_ON_STATUS == set()


def test_the_planes_verbs_are_handed_to_perform_not_imported_by_it(tmp_path: Path) -> None:
    """tool is below the plane: ``send_to``/``team`` run only through the plane's verbs a
    caller hands in (``melchior tool`` and the MCP bridge hand in melchior.plane.verbs)."""
    from melchior.plane import roster, verbs
    from melchior.tool import Request, Usage, perform

    data = roster.build(
        "planner",
        [("planner", "plans"), ("ledger", "keeps the books")],
        talks_to={"ledger"},
        opened=set(),
        mentioned=set(),
        turn=1,
    )
    env = {
        verbs.ENV_AGENT: "planner",
        verbs.ENV_ROSTER: str(roster.write(tmp_path, data)),
        verbs.ENV_OUTBOX: str(tmp_path / "out.ndjson"),
    }
    with pytest.raises(Usage, match="unknown verb 'team'"):
        perform(Request(verb="team"), env)
    team = perform(Request(verb="team"), env, plane=verbs)
    assert [(o["id"], o["may_write"]) for o in team] == [("ledger", True)]
