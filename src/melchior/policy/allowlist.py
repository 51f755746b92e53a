"""What a receiver will ever run: its local allow-list, checked against every route.

A task route is approved by the workspace owner on the relay and handed to the receiver
with each lease. The receiver does not take the relay's word for it: a compromised relay
(or a stolen owner credential) could otherwise make a machine run any program, in any
directory, with the coding agents' sandboxes turned off, or send a local API key to a
URL of its choosing. So the machine's own configuration says which adapters, which
working directories, which programs and which URLs it will ever use, and what a route may
do with each adapter option (:mod:`melchior.policy.route_options`: the adapter declares a
rule per option; what no rule allows is refused). A route outside that is refused with the
rule that refused it, and the receiver reports the task failed (not retryable) with the
same sentence.

Pure: paths arrive already resolved (``os.path.realpath`` by the caller), so a ``..``
or a symlink cannot walk out of an allowed directory, and programs arrive as the
absolute paths they resolve to (or with the reason they resolve to none).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from melchior.policy.decision import Decision, allow, refuse
from melchior.policy.route_options import (
    DIRS,
    PROGRAM,
    UNSET,
    URL,
    RouteOption,
    Wanted,
    judge,
)
from melchior.policy.urls import within_any


class AllowList(NamedTuple):
    """The receiver's local allow-list (from its configuration file).

    ``dirs`` and ``programs`` are absolute, resolved paths; ``urls`` are URL prefixes
    (:mod:`melchior.policy.urls`); ``bypass`` lets a route turn off a coding agent's
    permission checks or sandbox; ``route_env`` lets a route add environment variables to
    the agent's process; ``options`` holds, per adapter and option, the values
    ``[allow.options.ADAPTER]`` lists (in :func:`~melchior.policy.route_options.listed_keys`
    form).
    """

    adapters: frozenset[str]
    dirs: tuple[str, ...]
    programs: frozenset[str] = frozenset()
    urls: tuple[str, ...] = ()
    bypass: bool = False
    route_env: bool = False
    options: Mapping[str, Mapping[str, frozenset[str]]] = {}


class RouteFacts(NamedTuple):
    """A route as the allow-list judges it: its fields, with paths resolved.

    ``cwd`` is the resolved working directory (None: the route names none); ``options``
    the route's own options and ``local`` this machine's for the adapter (its
    ``[adapters.NAME]`` with the route's profile over it); ``program`` the resolved
    program the route names (None: it names none, or ``program_problem`` says why it
    resolves to nothing), ``program_given`` what the route wrote; ``add_dirs`` the
    resolved directories of the adapter's ``dirs`` options.
    """

    capability: str
    adapter: str
    cwd: str | None
    options: Mapping[str, Any]
    program: str | None = None
    program_given: str | None = None
    add_dirs: tuple[str, ...] = ()
    local: Mapping[str, Any] = {}
    program_problem: str | None = None


def inside(path: str, roots: Sequence[str]) -> bool:
    """Is the absolute ``path`` one of ``roots`` or below one of them?"""
    if not posixpath.isabs(path):
        return False
    norm = posixpath.normpath(path)
    for root in roots:
        r = posixpath.normpath(root)
        if norm == r or norm.startswith(r.rstrip("/") + "/"):
            return True
    return False


def no_route(capability: str, agent: str) -> Decision:
    """The decision when the relay handed a task without an approved route."""
    return refuse(
        "no-route",
        f"no task route is approved for {capability!r} on {agent}: propose one on this "
        f"machine ('mellan connect … --capability {capability}') and have the workspace "
        "owner approve it ('mellan route approve ID')",
    )


def may_run(route: RouteFacts, rules: AllowList, table: Mapping[str, RouteOption]) -> Decision:
    """May this receiver run ``route``, whose adapter's options are under ``table``?
    Refusals name the rule, the option and the allow-list key."""
    cap = route.capability
    if route.adapter not in rules.adapters:
        listed = ", ".join(sorted(rules.adapters)) or "none"
        return refuse(
            "adapter-not-allowed",
            f"the route for {cap!r} uses the {route.adapter!r} adapter, which "
            f"this receiver's allow-list does not include (allow.adapters: {listed})",
        )
    for where, path in (("cwd", route.cwd), *(("add_dirs", d) for d in route.add_dirs)):
        if path is not None and not inside(path, rules.dirs):
            listed = ", ".join(rules.dirs) or "none"
            return refuse(
                "cwd-not-allowed",
                f"the route for {cap!r} would run in {path} ({where}), which is "
                f"not inside a directory of this receiver's allow-list (allow.cwd: {listed})",
            )
    if route.program_given is not None and (
        route.program is None or route.program not in rules.programs
    ):
        where = (
            f" (resolved to {route.program})"
            if route.program
            else f" ({route.program_problem or 'not found'})"
        )
        return refuse(
            "program-not-allowed",
            f"the route for {cap!r} would run {route.program_given!r}{where}, "
            "which is not in this receiver's allow-list (allow.programs)",
        )
    listed_here = rules.options.get(route.adapter, {})
    for key, value in route.options.items():
        option = table.get(key)
        if option is not None and option.kind == URL:
            if isinstance(value, str) and not within_any(value, rules.urls):
                return refuse(
                    "url-not-allowed",
                    f"the route for {cap!r} would connect to {value} ({key}), which "
                    "no prefix in this receiver's allow-list covers (allow.urls)",
                )
            continue
        if option is not None and option.kind in (PROGRAM, DIRS):
            continue  # judged above, from what they resolve to
        wanted = Wanted(
            route.adapter, cap, str(key), value,
            local=route.local.get(key, UNSET),
            listed=listed_here.get(str(key), frozenset()),
            bypass=rules.bypass, route_env=rules.route_env,
        )  # fmt: skip
        refused = judge(option, wanted)
        if refused is not None:
            return refused
    return allow("allowed", f"the route for {cap!r} is inside the allow-list")
