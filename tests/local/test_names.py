"""Names, projects and the runtime directory: the rules that keep the registry safe."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior import names


def test_minted_ids_look_like_the_seed_and_are_recorded(runtime_dir: Path) -> None:
    d = names.registry_dir("demo", {"XDG_RUNTIME_DIR": str(runtime_dir)})
    minted = [names.mint_id(d) for _ in range(50)]
    assert len(set(minted)) == 50
    assert all(names.is_id(i) and len(i) <= names.MAX_ID_LEN for i in minted)
    assert set(minted) <= names.used_ids(d)


def test_ids_are_never_reused_even_after_their_socket_is_gone(runtime_dir: Path) -> None:
    d = names.registry_dir("demo", {"XDG_RUNTIME_DIR": str(runtime_dir)})
    first = names.mint_id(d)
    # Nothing of `first` is left in the directory but the record.
    assert not (d / first).exists()
    later = {names.mint_id(d) for _ in range(200)}
    assert first not in later


def test_when_two_words_run_out_ids_grow_a_third() -> None:
    every_pair = {f"{a}-{b}" for a in names.GREEK for b in names.GREEK}
    new = names.choose_id(every_pair)
    assert new.count("-") == 2
    assert names.is_id(new)


@given(st.text(max_size=120))
def test_project_names_are_one_safe_path_component(text: str) -> None:
    try:
        got = names.check_project(text)
    except names.NamingError as exc:
        why = str(exc)
    else:
        assert "/" not in got
        assert ".." not in got
        assert got not in (".", "")
        assert len(got.encode()) <= names.MAX_PROJECT_LEN
        return
    assert why  # says why


@pytest.mark.parametrize("bad", ["", "a/b", "..", "a..b", "../x", "x" * 65, ".hidden", "a b"])
def test_bad_project_names_are_refused(bad: str) -> None:
    with pytest.raises(names.NamingError):
        names.check_project(bad)


def test_explicit_project_wins_and_is_validated(tmp_path: Path) -> None:
    assert names.project_from({names.ENV_PROJECT: "demo"}, tmp_path) == "demo"
    with pytest.raises(names.NamingError, match=names.ENV_PROJECT):
        names.project_from({names.ENV_PROJECT: "../etc"}, tmp_path)


def test_project_is_derived_from_the_working_tree_top(tmp_path: Path) -> None:
    top = tmp_path / "My Repo!"
    (top / ".git").mkdir(parents=True)
    (top / "src" / "deep").mkdir(parents=True)
    assert names.project_from({}, top / "src" / "deep") == "My-Repo"


@given(st.text(min_size=1, max_size=80).filter(lambda s: "/" not in s and "\x00" not in s))
def test_any_directory_name_derives_a_valid_project(name: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / name
        try:
            d.mkdir()
        except OSError:
            return  # the file system refused the name (too long, not encodable)
        got = names.derive_project(d)
    assert names.check_project(got) == got


def test_address_round_trip() -> None:
    a = names.Address("demo", "main", "beta-nu")
    assert str(a) == "demo/main/beta-nu"
    assert names.Address.parse("demo/main/beta-nu") == a
    with pytest.raises(names.NamingError):
        names.Address.parse("demo/beta-nu")


def test_registry_dir_is_private_and_under_xdg(runtime_dir: Path) -> None:
    d = names.registry_dir("demo", {"XDG_RUNTIME_DIR": str(runtime_dir)})
    assert d == runtime_dir / "melchior" / "demo"
    for p in (d, d.parent):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o700


def test_unset_or_unsafe_xdg_falls_back_to_tmp(runtime_dir: Path) -> None:
    fallback = names.fallback_base()
    assert names.runtime_base({}) == fallback
    runtime_dir.chmod(0o755)
    try:
        assert names.runtime_base({"XDG_RUNTIME_DIR": str(runtime_dir)}) == fallback
    finally:
        runtime_dir.chmod(0o700)
    assert names.runtime_base({"XDG_RUNTIME_DIR": "relative/dir"}) == fallback
    assert names.runtime_base({"XDG_RUNTIME_DIR": str(runtime_dir / "missing")}) == fallback


def test_a_wrong_mode_registry_directory_is_refused_not_repaired(runtime_dir: Path) -> None:
    env = {"XDG_RUNTIME_DIR": str(runtime_dir)}
    d = names.registry_dir("demo", env)
    d.chmod(0o755)
    with pytest.raises(names.NamingError, match="chmod 700"):
        names.registry_dir("demo", env)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o755  # left for the user to look at


def test_long_runtime_paths_never_truncate_and_sockets_fit(runtime_dir: Path) -> None:
    deep = runtime_dir / ("x" * 60)
    deep.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(deep)}
    long_project = "p" * 64
    d = names.registry_dir(long_project, env)
    assert d.name == names.project_key(long_project)
    # The longest name we ever bind fits in sun_path, and binding really works.
    path = d / f".{'omicron-' * 3}omicron.tmp"
    assert len(os.fsencode(path)) <= names.SUN_PATH_MAX
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(os.fspath(path))
    finally:
        s.close()
        path.unlink()
    # A base too long even for a hashed key moves to the short fallback.
    deeper = runtime_dir / ("y" * 100)
    deeper.mkdir(mode=0o700)
    d2 = names.registry_dir("demo", {"XDG_RUNTIME_DIR": str(deeper)})
    assert str(d2).startswith(str(names.fallback_base()))
