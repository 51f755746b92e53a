"""The runtime interface itself: frozen values that refuse nonsense, and the registry."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from melchior.runtimes import (
    ADAPTERS,
    Progress,
    Runtime,
    RuntimeConfigError,
    Turn,
    TurnResult,
    runtime_for,
    text_artifact,
)
from melchior.runtimes.options import OptionReader
from paths_kit import REPO


def test_a_turn_is_frozen_all_the_way_down(tmp_path: Path) -> None:
    env = {"A": "1"}
    t = Turn("hi", str(tmp_path), env=env, options={"timeout": 3})  # type: ignore[arg-type]
    assert t.cwd == tmp_path
    assert isinstance(t.cwd, Path)
    env["A"] = "changed"
    assert t.env["A"] == "1"
    with pytest.raises(TypeError):
        t.env["B"] = "2"  # type: ignore[index]
    with pytest.raises(TypeError):
        t.options["timeout"] = 9  # type: ignore[index]
    with pytest.raises(AttributeError):
        t.prompt = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"env": {"A=B": "x"}}, "not a valid variable name"),
        ({"env": {"A": "x\0y"}}, "without NUL"),
        ({"session": ""}, "non-empty"),
    ],
)
def test_a_turn_refuses_what_cannot_travel(
    tmp_path: Path, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        Turn("hi", tmp_path, **kwargs)


def test_progress_and_results_refuse_unknown_kinds_and_states() -> None:
    with pytest.raises(ValueError, match="progress kind"):
        Progress("chatter", "x")
    with pytest.raises(ValueError, match="turn state"):
        TurnResult("done")
    with pytest.raises(ValueError, match="says why"):
        TurnResult("failed")
    with pytest.raises(ValueError, match="says why"):
        TurnResult("completed", error="but also failed")
    assert TurnResult("input_required", text="which?").ok
    assert not TurnResult("canceled").ok
    assert text_artifact("out", "hello") == {
        "artifactId": "out",
        "name": "out",
        "parts": [{"text": "hello"}],
    }


def test_the_registry_names_exactly_the_adapters_built_here() -> None:
    assert set(ADAPTERS) == {"command", "claude-code", "codex", "pi", "a2a", "provider"}
    with pytest.raises(RuntimeConfigError, match="no runtime adapter is named 'hermes'"):
        runtime_for("hermes")
    with pytest.raises(RuntimeConfigError, match="options must be a mapping"):
        runtime_for("codex", ["sandbox"])  # type: ignore[arg-type]
    for name, config in (
        ("command", {"argv": ["true"]}),
        ("claude-code", {}),
        ("codex", {}),
        ("pi", {}),
        ("a2a", {"card_url": "http://127.0.0.1:8645/.well-known/agent-card.json"}),
        ("provider", {"provider": "claude", "model": "m"}),
    ):
        rt: Runtime = runtime_for(name, config)
        assert rt.name == name


def test_a2a_without_the_sdk_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "a2a.client", None)  # import now raises ImportError
    with pytest.raises(RuntimeConfigError, match=r"pip install 'melchior\[a2a\]'"):
        runtime_for("a2a", {"card_url": "http://127.0.0.1:1/c.json"})


def test_option_values_are_checked_by_type_and_range() -> None:
    r = OptionReader("x", {"n": True, "f": float("nan"), "t": "", "l": "a", "m": {"k": 1}}, "nftlm")
    with pytest.raises(RuntimeConfigError, match="option n must be a whole number"):
        r.integer("n", 1, low=0, high=5)
    with pytest.raises(RuntimeConfigError, match="option f must be a number"):
        r.number("f", 1.0, low=0, high=5)
    with pytest.raises(RuntimeConfigError, match="option t must be non-empty text"):
        r.opt_text("t")
    with pytest.raises(RuntimeConfigError, match="option l must be a list of text"):
        r.texts("l")
    with pytest.raises(RuntimeConfigError, match="option m must be a mapping of text"):
        r.text_map("m")
    with pytest.raises(RuntimeConfigError, match="options must be a mapping"):
        OptionReader("x", [], ())  # type: ignore[arg-type]


def test_the_documented_examples_build_and_name_every_option() -> None:
    import re
    import tomllib

    from melchior.runtimes import a2a, claude_code, codex, command, pi, provider
    from melchior.runtimes.process import PROCESS_OPTIONS

    doc = (REPO / "docs" / "runtimes.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", doc, re.S)
    options = {
        "command": command.OPTIONS,
        "claude-code": claude_code.OPTIONS,
        "codex": codex.OPTIONS,
        "pi": pi.OPTIONS,
        "a2a": a2a.OPTIONS,
        "provider": provider.OPTIONS,
    }
    seen = set()
    for block in blocks:
        for agent in tomllib.loads(block)["routes"].values():
            for route in agent.values():
                runtime_for(route["adapter"], route["options"])
                missing = (
                    set(options[route["adapter"]]) - set(PROCESS_OPTIONS) - set(route["options"])
                )
                assert not missing, f"{route['adapter']} example lacks {missing}"
                seen.add(route["adapter"])
    assert seen == set(ADAPTERS)
