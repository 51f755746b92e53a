"""Each coding-agent adapter reads its CLI's release once and refuses one it cannot drive.

What ``--version`` prints is parsed (property tests: every release in each CLI's own
shape, noise around it, and arbitrary text, which is refused in one line and never
crashes the parser); a release below the range or an option whose flag is newer is
refused with the one line that says what is needed, at start-up (the receiver and
the plane, before anything else) and on a turn (without running the agent); a reading
is cached by binary, and read again when the binary changes. The CLIs here are small
programs that print what a release prints; the real releases are run by
tests/runtimes/test_runtimes_real_clis.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.runtimes import Turn, claude_code, codex, pi, preflight, runtime_for, versions
from melchior.runtimes.versions import Support, Version, VersionRefused
from runtimes_kit import Sink, run

SUPPORTS = {"claude-code": claude_code.SUPPORT, "codex": codex.SUPPORT, "pi": pi.SUPPORT}
PRINTS = {
    "claude-code": "{v} (Claude Code)\n",
    "codex": "WARNING: proceeding, even though we could not create PATH aliases\ncodex-cli {v}\n",
    "pi": "{v}",  # pi 0.73 prints no newline (and on stderr when stdout is not a terminal)
}
BINARY = {"claude-code": "claude", "codex": "codex", "pi": "pi"}

releases = st.tuples(st.integers(0, 400), st.integers(0, 400), st.integers(0, 10_000)).map(
    lambda t: ".".join(map(str, t))
)


def fake_cli(where: Path, name: str, prints: str, *, code: int = 0, stderr: bool = False) -> Path:
    """A program that answers ``--version`` as a release would, and records each call."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / name
    stream = "sys.stderr" if stderr else "sys.stdout"
    path.write_text(
        f"#!{sys.executable}\nimport sys\n"
        f"with open({str(path) + '.calls'!r}, 'a') as f:\n"
        "    f.write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"{stream}.write({prints!r})\nsys.exit({code})\n"
    )
    path.chmod(0o755)
    return path


def calls(path: Path) -> list[str]:
    record = Path(str(path) + ".calls")
    return record.read_text().splitlines() if record.exists() else []


# -- reading what --version prints ------------------------------------------------------------


@pytest.mark.parametrize("adapter", sorted(SUPPORTS))
@given(release=releases, before=st.sampled_from(["", "note: hello\n", "\n\n"]))
def test_every_release_is_read_in_its_cli_s_own_shape(
    adapter: str, release: str, before: str
) -> None:
    support = SUPPORTS[adapter]
    assert support.parse(before + PRINTS[adapter].format(v=release)) == Version(release)


@pytest.mark.parametrize("adapter", sorted(SUPPORTS))
@given(text=st.text(max_size=300))
def test_any_output_is_a_release_or_one_line_that_says_it_is_not(adapter: str, text: str) -> None:
    support = SUPPORTS[adapter]
    try:
        found = support.parse(text, "/opt/x")
    except VersionRefused as exc:
        message = str(exc)
        assert "\n" not in message
        assert message.startswith(f"{adapter}: /opt/x --version printed ")
        assert message.endswith(f"is /opt/x {support.product}?")
    else:
        assert isinstance(found, Version)
        assert str(found.release[0]) in text


@pytest.mark.parametrize(
    "output",
    [
        "",
        "Usage: claude [options]\n",
        "2.1 (Claude Code)\n",  # not three numbers
        "claude 2.1.332\n",  # no product name where Claude Code puts it
        "x" * 5000,
        "\x00\x01\x02 binary garbage \xff",
    ],
)
def test_garbage_is_refused_as_someone_else_s_program(output: str) -> None:
    with pytest.raises(VersionRefused, match=r"names no Claude Code release; is /b Claude Code\?"):
        claude_code.SUPPORT.parse(output, "/b")


@given(
    found=st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 500)),
    oldest=st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 500)),
)
def test_a_release_is_refused_exactly_when_it_is_older_than_the_oldest(
    found: tuple[int, int, int], oldest: tuple[int, int, int]
) -> None:
    support = Support("x", "X", Version(".".join(map(str, oldest))), "r", versions.shape("{v}"))
    why = support.refusal(Version(".".join(map(str, found))), "/bin/x")
    assert (why is not None) == (found < oldest)


def test_the_refusal_is_the_one_line_the_issue_asks_for() -> None:
    why = claude_code.SUPPORT.refusal(Version("2.1.197"), "/usr/local/bin/claude")
    assert (
        why == "claude-code needs Claude Code >= 2.1.259 (found 2.1.197 at /usr/local/bin/claude)"
    )


def test_an_option_whose_flag_is_newer_is_refused_naming_it() -> None:
    found = Version("0.50.0")
    assert codex.SUPPORT.refusal(found, "/c") is None  # in range
    assert codex.SUPPORT.refusal(found, "/c", ["add_dirs"]) == (
        "codex option add_dirs needs Codex >= 0.59.0 for --add-dir (found 0.50.0 at /c)"
    )
    assert codex.SUPPORT.refusal(Version("0.59.0"), "/c", ["add_dirs"]) is None
    assert pi.SUPPORT.refusal(Version("0.60.0"), "/p", ["builtin_tools"]) == (
        "pi option builtin_tools needs pi >= 0.70.0 for --no-builtin-tools (found 0.60.0 at /p)"
    )


# -- running --version ------------------------------------------------------------------------


def test_a_reading_is_cached_by_binary_and_read_again_when_it_changes(tmp_path: Path) -> None:
    cli = fake_cli(tmp_path, "claude", "2.1.300 (Claude Code)\n")
    support = claude_code.SUPPORT
    assert versions.installed(str(cli), support) == Version("2.1.300")
    assert versions.installed(str(cli), support) == Version("2.1.300")
    assert calls(cli) == ["--version"]  # asked once
    fake_cli(tmp_path, "claude", "2.1.301 (Claude Code)\n")  # upgraded in place
    stamp = cli.stat().st_mtime_ns + 1_000_000_000
    os.utime(cli, ns=(stamp, stamp))
    assert versions.installed(str(cli), support) == Version("2.1.301")
    assert calls(cli) == ["--version", "--version"]


def test_a_version_on_stderr_is_read_too(tmp_path: Path) -> None:
    cli = fake_cli(tmp_path, "pi", "0.73.1", stderr=True)
    assert versions.installed(str(cli), pi.SUPPORT) == Version("0.73.1")


def test_a_failing_or_hanging_version_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = fake_cli(tmp_path / "a", "codex", "error: cannot open ~/.codex\n", code=3)
    with pytest.raises(VersionRefused) as failed:
        versions.installed(str(broken), codex.SUPPORT)
    assert str(failed.value) == (
        f"codex: {broken} --version exited with status 3: error: cannot open ~/.codex"
    )
    hung = tmp_path / "b" / "pi"
    hung.parent.mkdir()
    hung.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")
    hung.chmod(0o755)
    monkeypatch.setattr(versions, "VERSION_TIMEOUT", 0.5)
    with pytest.raises(VersionRefused, match=r"^pi: .* --version did not answer within 0.5 s$"):
        versions.installed(str(hung), pi.SUPPORT)


# -- at start-up and on a turn ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("adapter", "release", "oldest"),
    [
        ("claude-code", "2.1.197", "2.1.259"),
        ("codex", "0.42.0", "0.44.0"),
        ("pi", "0.53.1", "0.55.1"),
    ],
)
def test_an_old_release_is_refused_at_start_up_and_on_a_turn_without_running_it(
    tmp_path: Path, adapter: str, release: str, oldest: str
) -> None:
    cli = fake_cli(tmp_path / "bin", BINARY[adapter], PRINTS[adapter].format(v=release))
    product = SUPPORTS[adapter].product
    line = f"{adapter} needs {product} >= {oldest} (found {release} at {cli})"
    with pytest.raises(VersionRefused) as refused:
        preflight([adapter, "command"], {adapter: {"binary": str(cli)}, "command": {}})
    assert str(refused.value) == line
    result = run(runtime_for(adapter, {"binary": str(cli)}).run(Turn("hi", tmp_path), Sink()))
    assert result.state == "failed"
    assert result.error == line
    assert calls(cli) == ["--version"]  # the agent itself never ran


def test_preflight_says_which_release_it_found_and_skips_adapters_without_a_cli(
    tmp_path: Path,
) -> None:
    cli = fake_cli(tmp_path, "codex", "codex-cli 0.171.0\n")
    assert preflight(["command", "codex", "provider"], {"codex": {"binary": str(cli)}}) == [
        f"Codex 0.171.0 at {cli}"
    ]
    old = fake_cli(tmp_path / "old", "codex", "codex-cli 0.50.0\n")
    with pytest.raises(VersionRefused, match=r"option add_dirs needs Codex >= 0\.59\.0"):
        preflight(["codex"], {"codex": {"binary": str(old), "add_dirs": ["/tmp"]}})
    with pytest.raises(Exception, match=r"pi: no-such-pi was not found \(PATH="):
        preflight(["pi"], {"pi": {"binary": "no-such-pi"}})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_receiver_refuses_to_start_before_it_claims_anything(tmp_path: Path) -> None:
    cli = fake_cli(tmp_path / "bin", "claude", "2.1.197 (Claude Code)\n")
    config = tmp_path / "receiver.toml"
    config.write_text(
        f'relay = "http://127.0.0.1:{_free_port()}"\ntoken_env = "T"\n'
        f'state_dir = "{tmp_path / "state"}"\n'
        f'[allow]\nadapters = ["claude-code"]\ncwd = ["{tmp_path}"]\n'
        f'[adapters.claude-code]\nbinary = "{cli}"\n'
    )
    mellan = Path(sys.executable).with_name("mellan")
    done = subprocess.run(
        [str(mellan), "receiver", "run", "--config", str(config)],
        env={**os.environ, "T": "tok"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 78, done.stdout + done.stderr
    assert (
        f"cannot start: claude-code needs Claude Code >= 2.1.259 (found 2.1.197 at {cli})"
        in done.stdout
    )
    assert "receiver for" not in done.stdout  # it never reached the relay


def test_the_plane_refuses_to_start_naming_the_agent(tmp_path: Path) -> None:
    cli = fake_cli(tmp_path / "bin", "pi", "0.50.0")
    plane = tmp_path / "PLANE.toml"
    plane.write_text(
        '[[agents]]\nid = "planner"\nruntime = "pi"\n'
        f"options = {{ binary = {json.dumps(str(cli))} }}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "melchior.cli", "plane", "run", str(plane), "--headless"],
        input="",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == (
        f"melchior plane: planner: pi needs pi >= 0.55.1 (found 0.50.0 at {cli})"
    )
