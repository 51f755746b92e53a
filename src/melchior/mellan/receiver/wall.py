"""The receiver's wall: a route from the relay, judged here and resolved once into what runs.

The relay decides who may ask; this module decides what this machine runs for them. It
takes the route a lease carries and this machine's configuration, and returns either a
refusal naming its rule (:mod:`melchior.policy.allowlist`, with every option under its
adapter's rule, :mod:`melchior.policy.route_options`) or the exact options the adapter
will run with. Two things are decided here and nowhere else, so that what is judged is
what runs:

* **The program is resolved once.** ``argv[0]`` of a ``command`` route, the ``binary`` of
  a coding agent (or the adapter's default, ``claude`` / ``codex``): an absolute path, or a
  bare name looked up on the receiver's own ``PATH`` — never a relative path, which would
  mean one file here and another in the route's working directory — resolved to its real
  path. That real path is judged against ``allow.programs`` and is what the adapter
  executes (it replaces the name in the options the adapter gets).
* **Directories are resolved once** (symlinks and ``..``): the working directory and the
  ``add_dirs`` are judged and passed on as their real paths.

The options the adapter runs with are layered: ``[adapters.NAME]`` (this machine), the
route's ``[profiles.NAME]`` (this machine), the route's own options (judged) on top.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from melchior.mellan.client.leases import Route
from melchior.mellan.receiver.config import ReceiverConfig
from melchior.policy import route_options as ro
from melchior.policy.allowlist import RouteFacts, may_run
from melchior.policy.decision import Decision, refuse
from melchior.runtimes import route_rules
from melchior.runtimes.process import ProgramNotFound, resolve_program


class Judged(NamedTuple):
    """The wall's answer: the decision, and when it allows, where and with what to run."""

    decision: Decision
    cwd: Path | None = None
    options: Mapping[str, Any] = {}


def _program_key(rules: Mapping[str, ro.RouteOption]) -> tuple[str, ro.RouteOption] | None:
    for key, option in rules.items():
        if option.kind == ro.PROGRAM:
            return key, option
    return None


def _name_of(value: Any, option: ro.RouteOption) -> str | None:
    """The program a ``program`` option's value names (its first word for an argv)."""
    if option.program is None:
        if isinstance(value, list | tuple) and value and isinstance(value[0], str):
            return value[0]
        return None
    return value if isinstance(value, str) else None


def _with_program(value: Any, option: ro.RouteOption, real: str) -> Any:
    if option.program is None and isinstance(value, list | tuple):
        return [real, *value[1:]]
    return real


def judge(route: Route, capability: str, config: ReceiverConfig, path: str | None = None) -> Judged:
    """The wall's decision on ``route``; ``path`` is the ``PATH`` bare program names are
    looked up on (default: this process's)."""
    profile: Mapping[str, Any] = {}
    if route.profile:
        if route.profile not in config.profiles:
            return Judged(
                refuse(
                    "profile-not-found",
                    f"the route for {capability!r} names profile {route.profile!r}, which "
                    "this receiver's configuration does not define ([profiles])",
                )
            )
        profile = config.profiles[route.profile]
    local = {**config.adapters.get(route.adapter, {}), **profile}
    if route.cwd is None:
        if not config.allow.dirs:
            return Judged(
                refuse(
                    "cwd-not-allowed",
                    f"the route for {capability!r} names no working directory and this "
                    "receiver's allow-list has none (allow.cwd)",
                )
            )
        cwd = config.allow.dirs[0]
    elif not os.path.isabs(route.cwd):
        return Judged(
            refuse("cwd-not-allowed", f"the route's cwd {route.cwd!r} is not an absolute path")
        )
    else:
        cwd = os.path.realpath(route.cwd)
    rules = route_rules(route.adapter)
    options = dict(route.options)
    given: str | None = None
    program: str | None = None
    problem: str | None = None
    found = _program_key(rules)
    if found is not None and found[0] in options:
        key, option = found
        given = _name_of(options[key], option)
        if given is None:
            given, problem = repr(options[key])[:80], "not a program name"
        else:
            try:
                program = resolve_program(given, path)
            except ProgramNotFound as exc:
                problem = str(exc)
    dirs: list[str] = []
    for key, option in rules.items():
        value = options.get(key)
        if option.kind == ro.DIRS and isinstance(value, list | tuple):
            resolved = [os.path.realpath(d) if isinstance(d, str) and os.path.isabs(d)
                        else str(d) for d in value]  # fmt: skip
            dirs += resolved
            options[key] = resolved
    facts = RouteFacts(
        capability, route.adapter, cwd, route.options, program, given, tuple(dirs),
        local=local, program_problem=problem,
    )  # fmt: skip
    decision = may_run(facts, config.allow, rules)
    if not decision:
        return Judged(decision)
    run = {**local, **options}
    if found is not None:
        key, option = found
        if program is not None:
            run[key] = _with_program(options[key], option, program)
        else:  # this machine's own program (or the adapter's default), found the same way
            mine = run.get(key) if run.get(key) is not None else option.program
            name = _name_of(mine, option)
            # not found: the adapter says so itself, with the PATH it searched
            if name is not None:
                with contextlib.suppress(ProgramNotFound):
                    run[key] = _with_program(mine, option, resolve_program(name, path))
    return Judged(decision, Path(cwd), run)
