"""Every config file reader of melchior's own (the plane's, the session's ``melchior.talk``,
the providers', the MCP bridge's settings and the Codex ``config.toml`` it merges into)
reads through :func:`melchior.tomlfile.loads`: nesting 100,000 deep or a file past the
size bound is its own one-line error naming the file, never a ``RecursionError``
traceback; plain bad TOML keeps the wording each reader had."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.integrations import integrate, settings
from melchior.integrations.integrate import IntegrateError
from melchior.plane.config import PlaneConfigError
from melchior.plane.config import parse as parse_plane
from melchior.providers.config import parse_providers
from melchior.session.config import ConfigError, parse_talk
from melchior.tomlfile import MAX_BYTES, MAX_DEPTH

DEEP = "a = " + "[" * 100_000 + "]" * 100_000 + "\n"
NESTED = "a = " + "[" * (MAX_DEPTH + 8) + "]" * (MAX_DEPTH + 8) + "\n"
LARGE = "# " + "x" * (MAX_BYTES + 10) + "\n"
BAD = "[section\n"


def _readers(tmp_path: Path) -> dict[str, tuple[Callable[[str], object], type[Exception], str]]:
    """Each reader: a call on a file's text, the error it raises, the name it gives."""
    path = tmp_path / "config.toml"
    return {
        "plane": (lambda text: parse_plane(text, path), PlaneConfigError, str(path)),
        "talk": (lambda text: parse_talk(text, "proj", path), ConfigError, str(path)),
        "providers": (lambda text: parse_providers(text, path), ConfigError, str(path)),
        "bridge": (
            lambda text: settings.parse(text, "proj", where=str(path)),
            ConfigError,
            str(path),
        ),
        "codex": (
            lambda text: integrate.merge_codex_config(text, "melchior", ["melchior"], []),
            IntegrateError,
            "config.toml",
        ),
    }


READERS = ["plane", "talk", "providers", "bridge", "codex"]


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize(
    ("text", "why"),
    [
        (DEEP, "too deep"),
        (NESTED, f"deeper than {MAX_DEPTH}"),
        (LARGE, "larger than a config file may be"),
        (BAD, "not valid TOML"),
    ],
    ids=["deep", "nested", "large", "bad"],
)
def test_each_reader_refuses_in_one_line(tmp_path: Path, reader: str, text: str, why: str) -> None:
    call, error, name = _readers(tmp_path)[reader]
    with pytest.raises(error) as raised:
        call(text)
    message = str(raised.value)
    assert why in message
    assert name in message
    assert "\n" not in message


@given(st.text(max_size=200))
def test_any_text_parses_or_is_refused_by_the_readers_own_error(text: str) -> None:
    """No reader lets another exception type out of the TOML step, whatever the text."""
    path = Path("/nonexistent/config.toml")
    for call, error in (
        (lambda t: parse_talk(t, "proj", path), ConfigError),
        (lambda t: parse_providers(t, path), ConfigError),
        (lambda t: settings.parse(t, "proj", where=str(path)), ConfigError),
    ):
        with contextlib.suppress(error):  # any other exception fails the test
            call(text)


def test_a_deep_plane_file_is_one_line_from_the_command(tmp_path: Path) -> None:
    plane = tmp_path / "PLANE.toml"
    plane.write_text(DEEP, encoding="utf-8")
    melchior = Path(sys.executable).with_name("melchior")
    done = subprocess.run(
        [str(melchior), "plane", "status", str(plane)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr
    assert "too deep" in done.stderr, done.stderr
    assert done.returncode != 0
