"""The walls: who in a project may reach whom. Pure; the registry is read elsewhere.

Two walls and one setting. The **project wall**: sessions of different projects never
reach each other (in practice they are never even listed; this function refuses
them too so that no caller can forget). The **instance wall**: a ``main`` is its
instance's front door and the subagents behind it are private. ``melchior.talk``
widens the instance wall to the run (everything under the same root) or to the whole
project, and there is no value that widens past the project.

The tree, precisely: a session's *instance* is its nearest ``main`` ancestor-or-self
plus everything below it reached without passing another ``main``; its *run* is
everything under the same root. A parent note pointing at a session that is gone
ends the walk there: the orphan's instance is keyed by the highest ancestor still
known, so a dead parent never merges two instances.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NamedTuple

from melchior.policy.decision import Decision, allow, refuse

Talk = Literal["instance", "run", "project"]
TALK_VALUES: tuple[Talk, ...] = ("instance", "run", "project")
Role = Literal["main", "sub"]


class Session(NamedTuple):
    """One node of a project's session tree as the registry records it."""

    id: str
    project: str
    role: Role
    parent: str | None = None


Tree = Mapping[str, Session]


def _ancestry(session: Session, tree: Tree) -> list[Session]:
    """``session`` and its known ancestors, nearest first; stops at a cycle or a gap."""
    chain = [session]
    seen = {session.id}
    node = session
    while node.parent is not None and node.parent in tree and node.parent not in seen:
        node = tree[node.parent]
        if node.project != session.project:
            break
        seen.add(node.id)
        chain.append(node)
    return chain


def instance_of(session: Session, tree: Tree) -> str:
    """The id that names ``session``'s instance: its nearest main ancestor-or-self."""
    chain = _ancestry(session, tree)
    for node in chain:
        if node.role == "main":
            return node.id
    return chain[-1].id


def root_of(session: Session, tree: Tree) -> str:
    """The id of the top of ``session``'s run."""
    return _ancestry(session, tree)[-1].id


def between(a: Session, b: Session, tree: Tree, talk: Talk) -> Decision:
    """May ``a`` reach ``b``? Allowed with the rule that let it, or refused naming the wall."""
    if a.project != b.project:
        return refuse(
            "project-wall",
            f"{b.id} is in project {b.project!r}, not {a.project!r}; sessions only reach their "
            "own project",
        )
    if a.id == b.id:
        return allow("self", "a session may reach itself")
    if b.parent == a.id:
        return allow("family", f"{b.id} is a child of {a.id}")
    if a.parent == b.id:
        return allow("family", f"{b.id} is the parent of {a.id}")
    a_inst, b_inst = instance_of(a, tree), instance_of(b, tree)
    if a_inst == b_inst:
        return allow("instance", f"{a.id} and {b.id} are in the same instance ({a_inst})")
    if b.role == "main":
        return allow("front-door", f"{b.id} is a main, its instance's front door")
    if talk == "run" and root_of(a, tree) == root_of(b, tree):
        return allow("run", f"melchior.talk is 'run' and both are under {root_of(a, tree)}")
    if talk == "project":
        return allow("project", "melchior.talk is 'project'")
    wider = "'project'" if talk == "run" else "'run' or 'project'"
    return refuse(
        "instance-wall",
        f"{b.id} is a subagent of another instance (front door: {b_inst}); reach it through "
        f"{b_inst}, or set melchior.talk to {wider} in your melchior config",
    )
