"""The bounded TOML reader behind the relay's and the receiver's config files: a byte that
is not UTF-8, nesting 100,000 deep, an oversized file and plain bad TOML are each one line
naming the file — ``mellan relay`` exits 2 and ``mellan receiver`` 78, with no traceback;
any bytes at all either parse or are refused that way, fast."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.tomlfile import MAX_BYTES, MAX_DEPTH, TomlFileError, parse, read
from relay_proc import MELLAN, relay_env

HOSTILE: list[tuple[bytes, str]] = [
    (b'agent = "\xff"\n', "not UTF-8: byte 0xff at line 1, column 10"),
    (b"a = " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "too deep"),
    (b"a = " + b"[" * 40 + b"]" * 40 + b"\n", f"deeper than {MAX_DEPTH}"),
    (b"a = " + b"{x = " * 40 + b"1" + b"}" * 40 + b"\n", "deep"),
    (b"# " + b"x" * (MAX_BYTES + 10) + b"\n", "larger than a config file may be"),
    (b"port = \n", "not valid TOML"),
    (b"port = 1\nport = 2\n", "not valid TOML"),
]


@pytest.mark.parametrize(("data", "why"), HOSTILE, ids=lambda v: str(v)[:30])
def test_each_unreadable_file_is_one_line_naming_why(tmp_path: Path, data: bytes, why: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(data)
    started = time.monotonic()
    with pytest.raises(TomlFileError) as err:
        read(path)
    assert time.monotonic() - started < 10  # hostile input is refused, not chewed on
    message = str(err.value)
    assert why in message
    assert str(path) in message
    assert "\n" not in message


def test_a_good_file_reads_as_tomllib_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text('agent = "ops ✓"\n[tls]\ncert = "c.pem"\nlist = [[1, 2], [3]]\n')
    assert read(path) == {"agent": "ops ✓", "tls": {"cert": "c.pem", "list": [[1, 2], [3]]}}
    deep = "a = " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n"
    assert parse(deep.encode())["a"]  # at the bound is still read


def test_a_missing_file_is_the_callers_to_word(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read(tmp_path / "none.toml")


@given(st.binary(max_size=400))
def test_any_bytes_parse_or_are_refused_in_one_line(data: bytes) -> None:
    why = ""
    try:
        doc = parse(data, "x.toml")
    except TomlFileError as exc:  # the only exception allowed out
        why = str(exc)
    if why:
        assert "\n" not in why
        assert why.startswith("x.toml ")
    else:
        assert isinstance(doc, dict)


@given(st.integers(min_value=1, max_value=3000), st.sampled_from(["[", "{a="]))
def test_any_nesting_depth_parses_or_is_refused(depth: int, opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    text = "v = " + opener * depth + ("1" if opener != "[" else "") + closer * depth + "\n"
    why = ""
    try:
        parse(text.encode(), "n.toml")
    except TomlFileError as exc:
        why = str(exc)
    if why:
        assert depth > MAX_DEPTH - 1
        assert "deep" in why
    else:
        assert depth <= MAX_DEPTH


def run(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MELLAN, *args], capture_output=True, text=True, timeout=60,
                          env=relay_env(home))  # fmt: skip


@pytest.mark.parametrize(("data", "why"), HOSTILE[:2] + HOSTILE[4:6], ids=lambda v: str(v)[:30])
def test_the_relay_exits_2_and_the_receiver_78_in_one_line(
    tmp_path: Path, data: bytes, why: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(data)
    relay = run(["relay", "--config", str(path), "--print-config"], tmp_path)
    assert relay.returncode == 2, relay.stderr
    assert relay.stderr.count("\n") == 1, relay.stderr
    assert why in relay.stderr
    receiver = run(["receiver", "run", "--config", str(path)], tmp_path)
    assert receiver.returncode == 78, receiver.stderr
    assert receiver.stderr.count("\n") == 1, receiver.stderr
    assert why in receiver.stderr
