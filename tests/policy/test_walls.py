"""The walls as pure policy, checked against an independent oracle over random trees."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from melchior.policy.walls import TALK_VALUES, Session, Talk, between, instance_of, root_of
from melchior.session.config import ConfigError, parse_talk, read_talk


@st.composite
def trees(draw: st.DrawFn) -> dict[str, Session]:
    """A project's forest: roots are mains, anyone else is a main or a sub under someone."""
    n = draw(st.integers(min_value=1, max_value=14))
    out: dict[str, Session] = {}
    for i in range(n):
        sid = f"s{i}"
        parent = draw(st.one_of(st.none(), st.integers(0, i - 1))) if i else None
        if parent is None:
            out[sid] = Session(sid, "demo", "main", None)
        else:
            role = draw(st.sampled_from(("main", "sub")))
            out[sid] = Session(sid, "demo", role, f"s{parent}")
    return out


def _children(tree: dict[str, Session], sid: str) -> list[str]:
    return [s.id for s in tree.values() if s.parent == sid]


def _instances(tree: dict[str, Session]) -> dict[str, str]:
    """Top-down: every main owns itself and the subs below it up to the next main."""
    owner: dict[str, str] = {}
    for m in (s for s in tree.values() if s.role == "main"):
        stack = [m.id]
        while stack:
            cur = stack.pop()
            owner[cur] = m.id
            stack.extend(c for c in _children(tree, cur) if tree[c].role == "sub")
    return owner


def _roots(tree: dict[str, Session]) -> dict[str, str]:
    out: dict[str, str] = {}
    for s in tree.values():
        node = s
        while node.parent is not None:
            node = tree[node.parent]
        out[s.id] = node.id
    return out


def _oracle(a: Session, b: Session, tree: dict[str, Session], talk: Talk) -> bool:
    inst, roots = _instances(tree), _roots(tree)
    return (
        a.id == b.id
        or b.parent == a.id
        or a.parent == b.id
        or inst[a.id] == inst[b.id]
        or b.role == "main"
        or (talk == "run" and roots[a.id] == roots[b.id])
        or talk == "project"
    )


@settings(max_examples=300)
@given(trees(), st.data())
def test_between_matches_the_oracle(tree: dict[str, Session], data: st.DataObject) -> None:
    a = tree[data.draw(st.sampled_from(sorted(tree)))]
    b = tree[data.draw(st.sampled_from(sorted(tree)))]
    for talk in TALK_VALUES:
        d = between(a, b, tree, talk)
        assert d.allowed == _oracle(a, b, tree, talk), (a, b, talk, d)
        assert d.reason
        if not d.allowed:
            assert d.rule == "instance-wall"
            assert b.role == "sub"


@given(trees(), st.data())
def test_talk_only_widens(tree: dict[str, Session], data: st.DataObject) -> None:
    a = tree[data.draw(st.sampled_from(sorted(tree)))]
    b = tree[data.draw(st.sampled_from(sorted(tree)))]
    verdicts = [between(a, b, tree, t).allowed for t in TALK_VALUES]
    assert verdicts == sorted(verdicts)  # False… then True…: instance ⊆ run ⊆ project
    assert verdicts[-1]  # within one project, 'project' reaches everyone


@given(trees(), st.data(), st.sampled_from(TALK_VALUES))
def test_the_project_wall_holds_at_every_setting(
    tree: dict[str, Session], data: st.DataObject, talk: Talk
) -> None:
    a = tree[data.draw(st.sampled_from(sorted(tree)))]
    stranger = Session("x0", "elsewhere", "main", None)
    d = between(a, stranger, {**tree, "x0": stranger}, talk)
    assert not d.allowed
    assert d.rule == "project-wall"
    assert not between(stranger, a, {**tree, "x0": stranger}, talk).allowed


@given(trees())
def test_instances_and_runs_agree_with_the_oracle(tree: dict[str, Session]) -> None:
    inst, roots = _instances(tree), _roots(tree)
    for s in tree.values():
        assert instance_of(s, tree) == inst[s.id]
        assert root_of(s, tree) == roots[s.id]


def test_the_seed_shape() -> None:
    # alpha-rho (main) ─ iota-mu (sub) ; beta-nu (main) ─ kappa-pi (sub)
    t = {
        "alpha-rho": Session("alpha-rho", "demo", "main"),
        "iota-mu": Session("iota-mu", "demo", "sub", "alpha-rho"),
        "beta-nu": Session("beta-nu", "demo", "main"),
        "kappa-pi": Session("kappa-pi", "demo", "sub", "beta-nu"),
    }
    d = between(t["iota-mu"], t["kappa-pi"], t, "instance")
    assert not d.allowed
    assert "beta-nu" in d.reason
    assert "melchior.talk" in d.reason
    assert between(t["iota-mu"], t["beta-nu"], t, "instance").rule == "front-door"
    assert between(t["iota-mu"], t["alpha-rho"], t, "instance").rule == "family"
    assert between(t["iota-mu"], t["kappa-pi"], t, "run").allowed is False  # two runs
    assert between(t["iota-mu"], t["kappa-pi"], t, "project").rule == "project"


def test_a_dead_parent_does_not_merge_instances() -> None:
    # The orphan's parent is gone from the tree: it is its own instance, not the world's.
    t = {
        "beta-nu": Session("beta-nu", "demo", "main"),
        "kappa-pi": Session("kappa-pi", "demo", "sub", "gone-gone"),
        "iota-mu": Session("iota-mu", "demo", "sub", "beta-nu"),
    }
    assert not between(t["iota-mu"], t["kappa-pi"], t, "instance").allowed


# -- reading melchior.talk ------------------------------------------------------------------


def test_talk_defaults_to_instance(tmp_path: Path) -> None:
    assert read_talk("demo", {"XDG_CONFIG_HOME": str(tmp_path)}) == "instance"


def test_talk_project_override_wins(tmp_path: Path) -> None:
    cfg = tmp_path / "melchior" / "config.toml"
    cfg.parent.mkdir()
    cfg.write_text('[melchior]\ntalk = "run"\n\n[melchior.project.demo]\ntalk = "project"\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    assert read_talk("demo", env) == "project"
    assert read_talk("other", env) == "run"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('[melchior]\ntalk = "world"\n', "nothing widens past the project"),
        ('[melchior.project.demo]\ntalk = "everyone"\n', "melchior.project.demo.talk"),
        ("[melchior\n", "not valid TOML"),
        ('melchior = "run"\n', "must be a table"),
    ],
)
def test_bad_talk_is_an_error_not_a_default(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_talk(text, "demo", Path("config.toml"))
