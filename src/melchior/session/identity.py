"""Who a process speaks as, read from ``MAGI_MELCHIOR_*``.

A harness hands the same four variables to its serve and to every tool exec, so both
resolve the caller the same way. The token never travels in a call's ``from``: it is
the one secret that proves a session was minted by its parent.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from melchior import names
from melchior.policy.walls import Role, Session
from melchior.session.registry import Registry


class IdentityError(ValueError):
    """The environment names a session that cannot be this one, with why."""


class Identity(NamedTuple):
    project: str
    id: str
    role: Role
    parent: str | None
    token: str | None

    @property
    def address(self) -> str:
        return str(names.Address(self.project, self.role, self.id))

    def session(self) -> Session:
        return Session(self.id, self.project, self.role, self.parent)


def same_secret(a: str, b: str) -> bool:
    import hmac  # start-up: only 'end' and 'serve' compare tokens

    return hmac.compare_digest(a.encode(), b.encode())


def for_serve(env: Mapping[str, str], cwd: Path) -> tuple[Identity, Registry]:
    """The identity ``melchior serve`` takes: a fresh root, or the child a fork named."""
    project = names.project_from(env, cwd)
    reg = Registry.open(project, env)
    sid = env.get(names.ENV_ID) or None
    parent = env.get(names.ENV_PARENT) or None
    token = env.get(names.ENV_TOKEN) or None
    if sid is None:
        if parent is not None or token is not None:
            raise IdentityError(
                f"{names.ENV_PARENT}/{names.ENV_TOKEN} are set but {names.ENV_ID} is not; "
                "start a child with the whole environment 'melchior fork' printed"
            )
        return Identity(project, names.mint_id(reg.dir), "main", None, None), reg
    names.check_id(sid)
    if reg.probe(sid) == "live":
        raise IdentityError(
            f"session {sid} is already being served in project {project!r}; one serve per "
            "session (a fresh root needs no MAGI_MELCHIOR_ID)"
        )
    if parent is None:
        if sid not in names.used_ids(reg.dir):
            raise IdentityError(
                f"{names.ENV_ID}={sid} was never minted in project {project!r}; unset it to "
                "start a root session with a fresh id, or use the environment from 'melchior fork'"
            )
        return Identity(project, sid, "main", None, None), reg
    names.check_id(parent)
    minted = reg.minted(parent, sid)
    if minted is None:
        raise IdentityError(
            f"no fork of {sid} by {parent} is recorded in project {project!r}; run "
            f"'melchior fork' as {parent} and start the child with the environment it prints"
        )
    if token is None or not same_secret(token, minted.token):
        raise IdentityError(
            f"{names.ENV_TOKEN} does not match the secret 'melchior fork' minted for {sid}"
        )
    return Identity(project, sid, minted.role, parent, token), reg


def for_tool(env: Mapping[str, str], cwd: Path) -> tuple[Identity | None, Registry]:
    """The caller of a tool exec: a session, or None for an anonymous operator."""
    project = names.project_from(env, cwd)
    reg = Registry.open(project, env)
    sid = env.get(names.ENV_ID) or None
    if sid is None:
        return None, reg
    names.check_id(sid)
    node = reg.session(sid)
    return Identity(project, sid, node.role, node.parent, env.get(names.ENV_TOKEN) or None), reg
