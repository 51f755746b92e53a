"""The tool's short path for ``status`` answers exactly as the general path, or not at all.

:func:`melchior.quick_status.status` may only answer when :func:`melchior.tool.perform`
would give the same answer; everywhere else it must return None before any call is
made, so that the general path decides with its own refusals and side effects.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior import names, names_core
from melchior.commands.tool import FLAGS
from melchior.quick_status import status
from melchior.tool import Request, perform
from melchior.wire.calls import Refused
from session_harness import Harness


@pytest.fixture
def harness(runtime_dir: Path, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(runtime_dir, tmp_path / "config")
    yield h
    h.close()


def flags(**given: Any) -> SimpleNamespace:
    ns = SimpleNamespace(schema=False, **dict.fromkeys(FLAGS))
    ns.verb = "status"
    for k, v in given.items():
        setattr(ns, k, v)
    return ns


def general(env: dict[str, str], **given: Any) -> tuple[str, Any]:
    try:
        return "ok", perform(Request(verb="status", **given), env)
    except Refused as exc:
        return "refused", (exc.reason, exc.code, exc.detail)


def quick(env: dict[str, str], **given: Any) -> tuple[str, Any] | None:
    try:
        got = status(flags(**given), env)
    except Refused as exc:
        return "refused", (exc.reason, exc.code, exc.detail)
    return None if got is None else ("ok", got)


def test_a_session_asking_about_itself_gets_the_general_answer(harness: Harness) -> None:
    root = harness.start()
    root.doing(busy=True, working_for="alpha-beta", waiting=2)
    env = root.tool_env()
    assert harness.tool("--verb=status", env=env).one["busy"] is True  # the doing line landed
    assert quick(env) == general(env)
    assert quick(env) is not None


def test_child_sessions_too(harness: Harness) -> None:
    child = harness.start().spawn()
    env = child.tool_env()
    assert quick(env) == general(env)
    assert quick(env) is not None


def test_everything_else_is_left_to_the_general_path(harness: Harness, tmp_path: Path) -> None:
    root = harness.start()
    env = root.tool_env()
    # another session, or any other flag: the walls and the other verbs' rules decide
    assert quick(env, who=root.id) is None
    assert quick(env, message="x") is None
    assert quick(env, page=1) is None
    # no session id, a project from the working tree, a bad id or project
    assert quick({k: v for k, v in env.items() if k != names.ENV_ID}) is None
    assert quick({k: v for k, v in env.items() if k != names.ENV_PROJECT}) is None
    assert quick({**env, names.ENV_ID: "not-an-id"}) is None
    assert quick({**env, names.ENV_PROJECT: "../x"}) is None
    # a session that is minted but not serving
    minted = root.fork()
    assert quick(harness.env(**minted["environment"])) is None
    assert general(harness.env(**minted["environment"]))[1][1] == "not-serving"


def test_a_config_file_the_general_path_refuses_is_left_to_it(harness: Harness) -> None:
    root = harness.start()
    env = root.tool_env()
    harness.set_talk("run")
    assert quick(env) == general(env)
    assert quick(env) is not None
    (harness.config_home / "melchior" / "config.toml").write_text("talk = [")
    assert quick(env) is None
    assert general(env)[1][1] == "setup"
    (harness.config_home / "melchior" / "config.toml").write_text('[melchior]\ntalk = "all"\n')
    assert quick(env) is None
    assert general(env)[1][1] == "setup"
    no_home = {k: v for k, v in env.items() if k not in ("XDG_CONFIG_HOME", "HOME")}
    assert quick(no_home) is None


def test_a_stale_socket_is_left_for_the_general_path_to_find(harness: Harness) -> None:
    root = harness.start()
    env = root.tool_env()
    root.proc.kill()
    root.proc.wait()
    assert root.at.exists()
    assert quick(env) is None
    assert root.at.exists(), "the short path must not act on a refused connect"
    assert general(env)[1][1] in ("not-serving", "stale")


def test_a_dropped_call_is_refused_as_the_general_path_refuses_it(harness: Harness) -> None:
    """Once the call is made its outcome is the answer: here a peer that hangs up."""
    reg = harness.registry
    root = harness.start()
    env = root.tool_env()
    root.close()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(os.fspath(reg / root.id))
    srv.listen(4)

    def hang_up() -> None:
        for _ in range(2):
            conn, _ = srv.accept()
            conn.recv(65536)
            conn.close()

    t = threading.Thread(target=hang_up, daemon=True)
    t.start()
    try:
        got = quick(env)
        assert got is not None
        assert got == general(env)
        assert got[1][1] == "dropped"
        assert got[1][2] == {"rule": "dropped", "receipt": "refused"}
    finally:
        t.join(timeout=10)
        srv.close()


_WORD = "(?:" + "|".join(names_core.GREEK) + ")"
_OLD_ID_RE = re.compile(rf"^{_WORD}(?:-{_WORD}){{1,3}}$")

ids_and_near_misses = st.one_of(
    st.text(max_size=30),
    st.lists(st.sampled_from(names_core.GREEK), min_size=0, max_size=6).map("-".join),
    st.builds(
        lambda ws, tail: "-".join(ws) + tail,
        st.lists(st.sampled_from([*names_core.GREEK, "", "Alpha", "pi "]), min_size=1, max_size=5),
        st.sampled_from(["", "\n", "\n\n", "-", " ", "\r"]),
    ),
)


@given(ids_and_near_misses)
def test_is_id_answers_as_the_regular_expression_did(text: str) -> None:
    expected = len(text) <= names_core.MAX_ID_LEN and _OLD_ID_RE.match(text) is not None
    assert names_core.is_id(text) is expected


@given(st.lists(st.sampled_from(["", "a", "b", ".", "..", "x y"]), max_size=5), st.integers(0, 3))
def test_naming_paths_are_spelled_as_pathlib_spells_them(parts: list[str], slashes: int) -> None:
    text = "/" * max(slashes, 1) + "/".join(parts)
    assert names_core.norm(text) == str(Path(text))
    assert names_core.join(names_core.norm(text), "melchior") == str(Path(text) / "melchior")


_OLD_PROJECT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@given(
    st.one_of(
        st.text(max_size=12),
        st.text(alphabet="aZ09._-\n/ é", max_size=12),
    )
)
def test_project_names_are_judged_as_the_regular_expression_did(name: str) -> None:
    try:
        names_core.check_project(name)
        ok = True
    except names_core.NamingError:
        ok = False
    expected = (
        bool(name)
        and len(name.encode()) <= names_core.MAX_PROJECT_LEN
        and "/" not in name
        and name not in (".", "..")
        and ".." not in name
        and _OLD_PROJECT_RE.match(name) is not None
    )
    assert ok is expected
