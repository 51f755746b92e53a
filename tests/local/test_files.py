"""Where melchior's files live (XDG) and how they are written (atomically, privately)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from melchior.files import atomic_write, write_private, xdg


def test_atomic_write_replaces_whole(tmp_path: Path) -> None:
    p = tmp_path / "note"
    atomic_write(p, b"one")
    atomic_write(p, b"two")
    assert p.read_bytes() == b"two"
    assert [x.name for x in tmp_path.iterdir()] == ["note"]
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600


def test_write_private_makes_a_private_directory(tmp_path: Path) -> None:
    p = tmp_path / "deep" / "owner.token"
    write_private(p, "secret\n")
    assert p.read_text() == "secret\n"
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(p.parent).st_mode) == 0o700


def test_a_failed_write_leaves_the_old_content_and_no_temp(tmp_path: Path) -> None:
    p = tmp_path / "note"
    atomic_write(p, b"old")
    with pytest.raises(TypeError):
        atomic_write(p, "not bytes")  # type: ignore[arg-type]
    assert p.read_bytes() == b"old"
    assert [x.name for x in tmp_path.iterdir()] == ["note"]


@pytest.mark.parametrize(
    ("kind", "variable", "default"),
    [("data", "XDG_DATA_HOME", ".local/share"), ("config", "XDG_CONFIG_HOME", ".config"),
     ("cache", "XDG_CACHE_HOME", ".cache")],
)  # fmt: skip
def test_xdg_ignores_unset_empty_and_relative_values(
    kind: str, variable: str, default: str, tmp_path: Path
) -> None:
    home = str(tmp_path)
    assert xdg(kind, {"HOME": home}) == tmp_path / default
    assert xdg(kind, {"HOME": home, variable: ""}) == tmp_path / default
    assert xdg(kind, {"HOME": home, variable: "relative/dir"}) == tmp_path / default
    assert xdg(kind, {"HOME": home, variable: "/abs/dir"}) == Path("/abs/dir")
