"""Every ``sh`` block in docs/ and the README is run by a test, as written.

A section's blocks are run by whichever test calls ``sh_blocks(doc, heading)`` for it (the
walk-throughs have tests of their own; the smaller sections are run here). Two kinds of
block cannot run on a test machine and say so on the line before their fence:

- ``template`` — the reader's own machine: their certificates, their systemd, their
  database host. Each ``mellan`` and ``melchior`` command in one is parsed by the real
  command-line parser, so a renamed or removed option fails here as it would there.
- ``suite`` — a command that runs part of this project's own tests (``make test``): each
  ``make`` target, pip extra and test file it names exists.

Anything else is a block no test runs, and fails :func:`test_every_sh_block_is_run_by_a_test`.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

import clis_kit
from doc_kit import DOCS, Block, every_sh_block, run_bash, script_bin, sh_blocks
from melchior import cli as melchior_cli
from melchior.dispatch import Program, parser_class
from melchior.mellan import cli as mellan_cli
from paths_kit import TESTS

ROOT = DOCS.parent
PROGRAMS: dict[str, Program] = {"mellan": mellan_cli.PROGRAM, "melchior": melchior_cli.PROGRAM}


def sections_run_by_tests() -> set[tuple[str, str]]:
    """(doc, heading) of every ``sh_blocks(doc, heading)`` call in the tests: literal
    arguments, and — where one is a parameter — the file's string constants that name a
    doc or a section with sh blocks."""
    headings = {(b.doc, b.heading) for b in every_sh_block()}
    found: set[tuple[str, str]] = set()
    for path in TESTS.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        strings = {
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "sh_blocks"
                and len(node.args) == 2
            ):
                continue
            doc, heading = (
                {a.value} if isinstance(a, ast.Constant) and isinstance(a.value, str) else strings
                for a in node.args
            )
            found.update(pair for pair in headings if pair[0] in doc and pair[1] in heading)
    return found


def test_every_sh_block_is_run_by_a_test() -> None:
    run = sections_run_by_tests()
    unrun = [
        f"docs/{b.doc} ## {b.heading}: {b.text.splitlines()[0]}"
        for b in every_sh_block()
        if b.kind == "run" and (b.doc, b.heading) not in run
    ]
    assert unrun == [], "sh blocks no test runs (run them, or mark a template):\n" + "\n".join(
        unrun
    )


def test_a_marked_block_is_not_also_left_to_a_walk_through() -> None:
    """A section a test runs has no template in it: the test would run it as written."""
    run = sections_run_by_tests()
    both = [b for b in every_sh_block() if b.kind == "template" and (b.doc, b.heading) in run]
    assert both == []


def test_no_block_leaves_a_placeholder_to_fill_in() -> None:
    """Values the reader must supply are shell variables (an unset one fails loudly),
    never an ellipsis pasted as it stands; comments may abbreviate what a command prints."""
    left = [
        f"docs/{b.doc} ## {b.heading}: {line.strip()}"
        for b in every_sh_block()
        for line in b.text.splitlines()
        if "…" in line.split("#", 1)[0]
    ]
    assert left == []


# --- templates: every command in them parses ----------------------------------------------


def command_lines(block: str) -> list[list[str]]:
    """A block's command lines as words: continuations joined, comments and leading
    ``VAR=value`` assignments dropped, each ``$(…)`` one word."""
    lines = []
    for line in block.replace("\\\n", " ").splitlines():
        line = re.sub(r"\$\([^()]*\)", "SUBST", line)
        words = shlex.split(line, comments=True)
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            words = words[1:]
        if words:
            lines.append(words)
    return lines


def commands_in(block: str) -> list[list[str]]:
    """The ``mellan``/``melchior`` command lines of a block."""
    return [words for words in command_lines(block) if words[0] in PROGRAMS]


class Refused(Exception):
    pass


def parse(words: list[str]) -> argparse.Namespace:
    """Parse a command line with the program's real parser (raise Refused on its error)."""
    program = PROGRAMS[words[0]]
    if len(words) < 2 or words[1] not in program.commands:
        raise Refused(f"no command {words[1:2]} in {words[0]}")
    module = importlib.import_module(program.commands[words[1]][0])
    try:
        fast = getattr(module, "parse_fast", None)  # as melchior.dispatch.run does
        quick = fast(words[2:]) if fast is not None else None
        if isinstance(quick, argparse.Namespace):
            return quick
        parser = parser_class()(prog=f"{words[0]} {words[1]}")
        module.add_arguments(parser)
        return parser.parse_args(words[2:])
    except SystemExit as exit_:
        raise Refused(" ".join(words)) from exit_


TEMPLATES = [b for b in every_sh_block() if b.kind == "template"]


@pytest.mark.parametrize(
    "block", TEMPLATES, ids=[f"{b.doc}:{b.heading}:{i}" for i, b in enumerate(TEMPLATES)]
)
def test_a_template_block_parses_with_the_real_commands(
    block: Block, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each line's program exists here (a project command: its real parser takes the line),
    and each ``MELLAN_``/``MELCHIOR_`` variable it sets is one the code reads."""
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "src").rglob("*.py"))
    for words in command_lines(block.text):
        if words[0] in PROGRAMS:
            try:
                parse(words)
            except Refused as why:
                pytest.fail(
                    f"docs/{block.doc} ## {block.heading}: {why}: {capsys.readouterr().err}"
                )
        elif words[0] == "export":
            for name in (w.split("=", 1)[0] for w in words[1:]):
                assert not name.startswith(("MELLAN_", "MELCHIOR_")) or f'"{name}"' in source, name
        else:
            assert words[0] in SHELL_WORDS or shutil.which(words[0]), f"no {words[0]} here"


SHELL_WORDS = {"cd", "export", "echo", "until", "sleep", "kill", "wait"}


@pytest.mark.parametrize(
    "line",
    [
        "mellan relay --tls-certificate relay.crt",  # the option is --tls-cert
        "mellan relay backup",  # the destination is required
        "mellan connect claude --capability x",  # no such adapter
        "melchior plane frobnicate PLANE.toml",
        "mellan agnet list",
    ],
)
def test_the_template_check_can_fail(line: str) -> None:
    (words,) = commands_in(line)
    with pytest.raises(Refused):
        parse(words)


def test_the_template_reader_keeps_substitutions_and_continuations_whole() -> None:
    block = (
        "# a comment\nX=1 mellan relay backup /b/relay-$(date +%F).db \\\n  --config c.toml\n"
        "echo mellan relay --nope\n"
    )
    assert commands_in(block) == [["mellan", "relay", "backup", "/b/relay-SUBST.db", "--config",
                                   "c.toml"]]  # fmt: skip


# --- suite blocks: what they name exists ---------------------------------------------------


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-z][a-z0-9-]*):", text, re.M))


def extras() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return set(project["project"]["optional-dependencies"])


SUITES = [b for b in every_sh_block() if b.kind == "suite"]


@pytest.mark.parametrize(
    "block", SUITES, ids=[f"{b.doc}:{b.heading}" for b in SUITES]
)  # fmt: skip
def test_a_suite_block_names_what_exists(block: Block) -> None:
    for line in block.text.splitlines():
        words = shlex.split(line, comments=True)
        while words and "=" in words[0]:
            words = words[1:]
        if not words:
            continue
        if words[0] == "make":
            assert set(words[1:]) <= make_targets(), line
        elif words[0].endswith("/pip") and words[1:3] == ["install", "-e"]:
            wanted = re.fullmatch(r"\.\[(.+)\]", words[3])
            assert wanted is not None, line
            assert set(wanted.group(1).split(",")) <= extras(), line
            assert "mcp" in extras()
            assert "test" in extras()
        elif words[0].endswith("/pytest"):
            assert all((ROOT / w).is_file() for w in words[1:] if not w.startswith("-")), line
        else:
            pytest.fail(f"docs/{block.doc}: a suite block's {line!r}: how is it checked?")


# --- the smaller sections, run as written --------------------------------------------------


def xdg(tmp_path: Path) -> dict[str, str]:
    """A reader's fresh home: state directories of its own, no login, no token."""
    env = {"HOME": str(tmp_path / "home")}
    for kind in ("DATA", "CONFIG", "STATE", "CACHE"):
        env[f"XDG_{kind}_HOME"] = str(tmp_path / "home" / kind.lower())
    (tmp_path / "home").mkdir()
    return env


def in_dir(tmp_path: Path, script: str) -> str:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return f"cd {shlex.quote(str(work))}\n{script}"


def test_a2a_examples_run_as_written(tmp_path: Path) -> None:
    setup, curl, send = sh_blocks("a2a.md", "Examples")
    done = run_bash(
        in_dir(tmp_path, setup + curl + send),
        bindir=script_bin("mellan"),
        drop=["MELLAN_", "XDG_"],
        env=xdg(tmp_path),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert '"supportedInterfaces"' in out  # the public card
    assert '"incident.inspect"' in out  # the extended card: the granted capability
    assert "12345678901234567890" in out  # the big number kept exact on the way back
    assert '"jsonrpc": "2.0"' in out or '"jsonrpc":"2.0"' in out
    assert "TASK_STATE_CANCELED" in out
    assert re.search(r"task \S+ submitted", out), out
    # --wait with no receiver says what it waits for, within its bound
    assert "no receiver has taken it yet" in done.stderr, done.stderr


def test_the_lua_client_is_fetched_as_written(tmp_path: Path) -> None:
    (script,) = sh_blocks("lua.md", "Getting the file")
    env = xdg(tmp_path)
    done = run_bash(script, bindir=script_bin("melchior"), env=env)
    assert done.returncode == 0, done.stderr
    written = Path(env["HOME"]) / ".config" / "myharness" / "melchior.lua"
    assert written.read_text(encoding="utf-8").splitlines()[:3] == done.stdout.splitlines()


def test_gate_wire_runs_as_written(tmp_path: Path) -> None:
    (script,) = sh_blocks("wire.md", "`melchior gate-wire`")
    done = run_bash(script, bindir=script_bin("melchior"))
    assert done.returncode == 0, done.stderr
    shown = [line[2:] for line in script.splitlines() if line.startswith("# capture")]
    assert shown
    assert all(line in done.stdout for line in shown)
    assert "exit status 1" in done.stdout
    assert json.loads(done.stdout.splitlines()[3])["ok"] is False
    assert done.stdout.rstrip().endswith("no offence")


@pytest.mark.parametrize(
    ("doc", "heading", "writes"),
    [
        ("integrations.md", "Claude Code", ".claude.json"),
        ("integrations.md", "Codex", ".codex/hooks.json"),
        ("integrations.md", "pi", ".pi/agent/extensions/melchior/index.ts"),
        ("plane.md", "A pi agent: `send_to` as a tool of its own", ".pi/agent/extensions"),
    ],
)
def test_integrating_an_agent_runs_as_written(
    doc: str, heading: str, writes: str, tmp_path: Path
) -> None:
    """Into a fresh home: the config lands where the doc says (Claude Code's own ``claude
    mcp add`` writes its part, so the real CLI is on PATH for it)."""
    env = xdg(tmp_path)
    if heading == "Claude Code":
        env["PATH"] = f"{Path(clis_kit.need('claude-code')).parent}{os.pathsep}{os.environ['PATH']}"
    done = run_bash(
        in_dir(tmp_path, "\n".join(sh_blocks(doc, heading))),
        bindir=script_bin("melchior"),
        drop=["CODEX_HOME", "PI_CODING_AGENT_DIR", "CLAUDE_CONFIG_DIR", "XDG_"],
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (Path(env["HOME"]) / writes).exists(), done.stdout + done.stderr


def test_make_run_starts_the_relay_as_the_readme_says(tmp_path: Path) -> None:
    (script, _test) = sh_blocks("../README.md", "Quick start (fresh machine)")
    assert script.strip() == "make run"
    if not (ROOT / ".venv" / ".installed").exists():
        pytest.skip("make run would create .venv here first (make setup has not run)")
    port = str(free_port_number())
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=ROOT,
        env={**os.environ, **xdg(tmp_path), "PORT": port},  # make takes PORT from the env
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = read_until(proc, "listening on")
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: the whole foreground group
    rest, _ = proc.communicate(timeout=60)
    text = "".join(lines) + rest
    assert f"listening on http://127.0.0.1:{port}" in text, text
    assert "Traceback" not in text


def test_make_demo_shows_the_system_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    (script,) = sh_blocks("../README.md", "Next")[:1]
    assert script.strip() == "make demo"
    if not (ROOT / ".venv" / ".installed").exists():
        pytest.skip("make demo would create .venv here first (make setup has not run)")
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=ROOT,
        env={**os.environ, **xdg(tmp_path), "TMPDIR": str(tmp_path / "tmp")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = read_until(proc, "Ctrl-C stops them")
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    text = "".join(lines) + rest
    assert "completed" in text, text
    assert "stopped; nothing of the demo is left behind" in text, text
    assert list((tmp_path / "tmp").iterdir()) == []


def free_port_number() -> int:
    from doc_kit import free_port

    return free_port()


def read_until(proc: subprocess.Popen[str], wanted: str, deadline: float = 120.0) -> list[str]:
    """Lines of ``proc``'s output up to the one holding ``wanted`` (a hang guard, not a
    threshold: kill and fail after ``deadline`` seconds)."""
    assert proc.stdout is not None
    lines: list[str] = []
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if wanted in line:
            return lines
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    pytest.fail(f"never printed {wanted!r}:\n{''.join(lines)}")


if __name__ == "__main__":  # pragma: no cover - the list, for a person editing the docs
    for b in every_sh_block():
        print(b.kind, f"docs/{b.doc}", b.heading, sep="\t")
    sys.exit(0)
