"""What a receiver will ever run: its local allow-list, checked against every route.

A task route is approved by the workspace owner on the relay and handed to the receiver
with each lease. The receiver does not take the relay's word for it: a compromised relay
(or a stolen owner credential) could otherwise make a machine run any program, in any
directory, with the coding agents' sandboxes turned off, or send a local API key to a
URL of its choosing. So the machine's own configuration says which adapters, which
working directories, which programs and which URLs it will ever use, and whether a
route may switch off the unattended profile's guard rails. A route outside that list is
refused with the rule that refused it, and the receiver reports the task failed (not
retryable) with the same sentence.

Pure: paths arrive already resolved (``os.path.realpath`` by the caller), so a ``..``
or a symlink cannot walk out of an allowed directory, and programs arrive as the
absolute paths they resolve to.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from melchior.policy.decision import Decision, allow, refuse

PROGRAM_OPTION = {"command": "argv", "claude-code": "binary", "codex": "binary"}
"""Where each program adapter names the program a route would run."""

URL_OPTIONS = ("card_url", "base_url")
"""Options that choose where an adapter connects (with a local token or key)."""

BYPASS: Mapping[str, Mapping[str, Any]] = {
    "claude-code": {"permission_mode": "bypassPermissions"},
    "codex": {"bypass_sandbox": True, "sandbox": "danger-full-access"},
}
"""Option values that switch a coding agent's unattended guard rails off."""

BYPASS_FLAGS = ("--dangerously-skip-permissions", "--dangerously-bypass-approvals-and-sandbox")


class AllowList(NamedTuple):
    """The receiver's local allow-list (from its configuration file).

    ``dirs`` and ``programs`` are absolute, resolved paths; ``urls`` are prefixes;
    ``bypass`` lets a route turn off a coding agent's permission checks or sandbox;
    ``route_env`` lets a route add environment variables to the agent's process.
    """

    adapters: frozenset[str]
    dirs: tuple[str, ...]
    programs: frozenset[str] = frozenset()
    urls: tuple[str, ...] = ()
    bypass: bool = False
    route_env: bool = False


class RouteFacts(NamedTuple):
    """A route as the allow-list judges it: its fields, with paths resolved.

    ``cwd`` is the resolved working directory (None: the route names none);
    ``program`` the resolved program the route would run (None: the adapter's default,
    e.g. ``claude``), ``program_given`` what the route wrote; ``add_dirs`` resolved.
    """

    capability: str
    adapter: str
    cwd: str | None
    options: Mapping[str, Any]
    program: str | None = None
    program_given: str | None = None
    add_dirs: tuple[str, ...] = ()


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


def may_run(route: RouteFacts, rules: AllowList) -> Decision:
    """May this receiver run ``route``? Refusals name the rule and the allow-list key."""
    if route.adapter not in rules.adapters:
        listed = ", ".join(sorted(rules.adapters)) or "none"
        return refuse(
            "adapter-not-allowed",
            f"the route for {route.capability!r} uses the {route.adapter!r} adapter, which "
            f"this receiver's allow-list does not include (allow.adapters: {listed})",
        )
    for where, path in (("cwd", route.cwd), *(("add_dirs", d) for d in route.add_dirs)):
        if path is not None and not inside(path, rules.dirs):
            listed = ", ".join(rules.dirs) or "none"
            return refuse(
                "cwd-not-allowed",
                f"the route for {route.capability!r} would run in {path} ({where}), which is "
                f"not inside a directory of this receiver's allow-list (allow.cwd: {listed})",
            )
    if route.program_given is not None and (
        route.program is None or route.program not in rules.programs
    ):
        where = f" (resolved to {route.program})" if route.program else " (not found)"
        return refuse(
            "program-not-allowed",
            f"the route for {route.capability!r} would run {route.program_given!r}{where}, "
            "which is not in this receiver's allow-list (allow.programs)",
        )
    for key in URL_OPTIONS:
        url = route.options.get(key)
        if isinstance(url, str) and not any(url.startswith(p) for p in rules.urls):
            return refuse(
                "url-not-allowed",
                f"the route for {route.capability!r} would connect to {url} ({key}), which "
                "no prefix in this receiver's allow-list covers (allow.urls)",
            )
    if not rules.bypass:
        for key, value in BYPASS.get(route.adapter, {}).items():
            if route.options.get(key) == value:
                return refuse(
                    "bypass-not-allowed",
                    f"the route for {route.capability!r} sets {key} = {value!r}, which turns "
                    "off the agent's unattended guard rails; this receiver's allow-list does "
                    "not permit that (allow.bypass = false)",
                )
        extra = route.options.get("extra_args")
        if isinstance(extra, list | tuple):
            for flag in BYPASS_FLAGS:
                if any(isinstance(a, str) and a.split("=", 1)[0] == flag for a in extra):
                    return refuse(
                        "bypass-not-allowed",
                        f"the route for {route.capability!r} passes {flag}, which this "
                        "receiver's allow-list does not permit (allow.bypass = false)",
                    )
    if not rules.route_env and route.options.get("env"):
        return refuse(
            "env-not-allowed",
            f"the route for {route.capability!r} sets environment variables (env), which "
            "this receiver's allow-list does not permit (allow.route_env = false)",
        )
    return allow("allowed", f"the route for {route.capability!r} is inside the allow-list")
