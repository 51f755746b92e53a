"""What a route from the relay may set: one rule for every option of every adapter.

A task route (adapter, working directory, options) is approved by the workspace owner on
the relay and handed to the receiver with each lease. The relay decides *who may ask*;
this machine decides *what it will ever run*. A compromised relay, or a stolen owner
credential, can write any route, so the receiver cannot judge a route by looking for
dangerous things in it: every option an adapter has turns into a flag, a config file, a
program or a URL somewhere, and a net of known-bad values is stepped around by the first
value nobody listed. The rule is the other way round. Each adapter declares, beside its
options, what a *route* may do with each of them (``ROUTE_RULES`` in its module, one
entry per option), and everything a rule does not allow is refused, naming the option:

=========  ===============================================================================
kind       a route may …
=========  ===============================================================================
free       set it, within the adapter's own type and range checks (and a pattern where the
           value lands on a command line): it changes nothing of what runs or what the
           agent may touch (a model name, an exit-code convention, a poll interval)
limit      lower it, never raise it above this machine's value or the adapter's default
           (time, turns, money, bytes)
ordered    choose a guard-rail setting no wider than this machine's (or the default): a
           permission mode, a sandbox; a wider one only where ``[allow.options]`` lists it,
           and the widest (the bypass values) only with ``allow.bypass``
adds       add items to a list that only narrows (tools to deny), never drop this
           machine's items
subset     choose items of a list that widens (tools to enable where none set means all):
           only items of this machine's list when it sets one, else any
listed     only repeat this machine's value, or use one ``[allow.options.ADAPTER]`` lists
           exactly (item by item for lists of tools or files, ``KEY=VALUE`` for maps):
           options that carry programs, flags, configuration, instructions to the model,
           or which of this machine's secrets is sent where
program    name a program that is resolved on this machine and judged against
           ``allow.programs`` (:mod:`melchior.policy.allowlist`)
dirs       name directories inside ``allow.cwd``
url        name a URL inside ``allow.urls``
env        add environment variables, only with ``allow.route_env``
=========  ===============================================================================

"This machine's value" is the one the receiver's configuration gives the option for that
adapter (``[adapters.NAME]``, with the route's local ``[profiles.NAME]`` over it): a route
that repeats it chooses nothing. A route may never set an option to ``null`` where this
machine sets it (that would drop the machine's value). Values are compared as JSON, so
``true`` is not ``1``.

Pure: no I/O; the program, the directories and the URLs are judged by
:func:`melchior.policy.allowlist.may_run` from facts the receiver resolved.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from melchior.policy.decision import Decision, refuse

FREE = "free"
LIMIT = "limit"
ORDERED = "ordered"
ADDS = "adds"
SUBSET = "subset"
LISTED = "listed"
PROGRAM = "program"
DIRS = "dirs"
URL = "url"
ENV = "env"

KINDS = (FREE, LIMIT, ORDERED, ADDS, SUBSET, LISTED, PROGRAM, DIRS, URL, ENV)
LISTABLE = (ORDERED, LISTED)
"""The kinds whose values ``[allow.options.ADAPTER]`` may list."""

RULE = "route-option-not-allowed"
BYPASS_RULE = "bypass-not-allowed"
ENV_RULE = "env-not-allowed"

UNSET: Any = object()
"""This machine's configuration does not set the option."""


class RouteOption(NamedTuple):
    """The rule one option of one adapter is under when a route sets it.

    ``ranks`` orders an ``ordered`` option's values from narrowest (0) up; ``bypass``
    names its values that switch a guard rail off; ``default`` is what the adapter uses
    when nobody sets the option (the bound of a ``limit``, the setting of an
    ``ordered``); ``pattern`` is what a ``free`` or ``adds`` text (or each list item) must
    match; ``items`` says a ``listed`` list or map is judged item by item; ``program``
    is the default program of a ``program`` option (None: the option holds an argv).
    """

    kind: str
    ranks: Mapping[Any, int] | None = None
    bypass: frozenset[Any] = frozenset()
    default: Any = None
    pattern: re.Pattern[str] | None = None
    items: bool = False
    program: str | None = None


def free(pattern: str | None = None) -> RouteOption:
    return RouteOption(FREE, pattern=re.compile(pattern) if pattern else None)


def limit(default: float | None = None) -> RouteOption:
    return RouteOption(LIMIT, default=default)


def ordered(
    order: Sequence[Any | tuple[Any, ...]], default: Any, *, bypass: Sequence[Any] = ()
) -> RouteOption:
    """``order`` lists the values narrowest first; a tuple holds values of equal width."""
    ranks: dict[Any, int] = {}
    for rank, step in enumerate(order):
        for value in step if isinstance(step, tuple) else (step,):
            ranks[_key(value)] = rank
    return RouteOption(ORDERED, ranks=ranks, bypass=frozenset(_key(v) for v in bypass),
                       default=default)  # fmt: skip


def adds(pattern: str | None = None) -> RouteOption:
    return RouteOption(ADDS, pattern=re.compile(pattern) if pattern else None)


def subset(pattern: str | None = None) -> RouteOption:
    return RouteOption(SUBSET, pattern=re.compile(pattern) if pattern else None)


def listed(*, items: bool = False) -> RouteOption:
    return RouteOption(LISTED, items=items)


def program(default: str | None = None) -> RouteOption:
    return RouteOption(PROGRAM, program=default)


DIRS_OPTION = RouteOption(DIRS)
URL_OPTION = RouteOption(URL)
ENV_OPTION = RouteOption(ENV)

MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/@+\[\]-]{0,127}\Z"
"""A model's name as it may reach a command line: never a flag, no spaces or controls."""
TOOL_NAME = r"^[A-Za-z_*][A-Za-z0-9_*.-]{0,127}(\([^\x00-\x1f\x7f]{0,512}\))?\Z"
"""A coding agent's tool rule (``Bash``, ``mcp__srv__tool``, ``Bash(git push:*)``)."""


def canonical(value: Any) -> str:
    """One spelling per JSON value, for comparing values as JSON (``true`` is not ``1``)."""
    return json.dumps(_plain(value), sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _key(value: Any) -> str:
    return canonical(value)


def item_texts(value: Any) -> list[str] | None:
    """The items of a list (texts) or a map (``KEY=VALUE`` texts); None if neither."""
    if isinstance(value, Mapping):
        return [f"{k}={v}" for k, v in value.items()]
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def listed_keys(option: RouteOption, values: Sequence[Any]) -> frozenset[str]:
    """What ``[allow.options.ADAPTER] KEY = [...]`` lists, in the form :func:`judge` compares:
    canonical JSON values, or the texts of items for an item-by-item ``listed`` option."""
    if option.kind == LISTED and option.items:
        return frozenset(str(v) for v in values)
    return frozenset(canonical(v) for v in values)


class Wanted(NamedTuple):
    """One option a route sets, with what the judgement needs to know about it."""

    adapter: str
    capability: str
    key: str
    value: Any
    local: Any = UNSET
    """This machine's value for the option (``[adapters]`` with the profile over it)."""
    listed: frozenset[str] = frozenset()
    """What ``[allow.options.ADAPTER]`` lists for it (see :func:`listed_keys`)."""
    bypass: bool = False
    """``allow.bypass``: may a route switch a guard rail off?"""
    route_env: bool = False


def _no(w: Wanted, why: str, rule: str = RULE) -> Decision:
    return refuse(rule, f"the route for {w.capability!r} sets {w.adapter} option {w.key}: {why}")


def _shown(value: Any) -> str:
    text = canonical(value)
    return text if len(text) <= 120 else text[:119] + "…"


def judge(option: RouteOption | None, w: Wanted) -> Decision | None:
    """Why the route may not set ``w.key`` to ``w.value`` (None: it may).

    ``program``, ``dirs`` and ``url`` options are judged here only for their form; what
    they name is judged by :func:`melchior.policy.allowlist.may_run` once resolved.
    """
    local_set = w.local is not UNSET and w.local is not None
    if option is None:
        return _no(w, "the adapter has no such option, so no route may set it")
    if local_set and canonical(w.value) == canonical(w.local):
        return None  # the machine's own value: the route chooses nothing
    if w.value is None:
        if local_set:
            return _no(w, "a route may not unset what this machine's configuration sets")
        return None if option.kind != ORDERED else _no(w, "null is not one of its settings")
    kind = option.kind
    if kind == FREE:
        return _pattern(option, w)
    if kind == LIMIT:
        return _limit(option, w, local_set)
    if kind == ORDERED:
        return _ordered(option, w, local_set)
    if kind == ADDS:
        return _adds(option, w, local_set)
    if kind == SUBSET:
        return _subset(option, w, local_set)
    if kind == LISTED:
        return _listed(option, w, local_set)
    if kind == ENV:
        if not w.route_env:
            return _no(
                w,
                "a route may not add environment variables to the agent's process "
                "(allow.route_env = false)",
                ENV_RULE,
            )
        return None
    return None  # program, dirs, url: judged with their resolved facts


def _pattern(option: RouteOption, w: Wanted) -> Decision | None:
    if option.pattern is None:
        return None
    values = w.value if isinstance(w.value, list | tuple) else [w.value]
    for v in values:
        if not isinstance(v, str) or not option.pattern.match(v):
            return _no(w, f"{_shown(v)} is not of the form {option.pattern.pattern}")
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _limit(option: RouteOption, w: Wanted, local_set: bool) -> Decision | None:
    value = _number(w.value)
    if value is None:
        return _no(w, f"it is a bound and must be a number, not {_shown(w.value)}")
    bound = _number(w.local) if local_set else _number(option.default)
    if bound is not None and value > bound:
        whose = "this machine's configuration" if local_set else "the adapter's default"
        return _no(
            w,
            f"{_shown(w.value)} is above {_shown(w.local if local_set else option.default)} "
            f"({whose}); a route may lower a bound, not raise it",
        )
    return None


def _ordered(option: RouteOption, w: Wanted, local_set: bool) -> Decision | None:
    ranks = option.ranks or {}
    key = _key(w.value)
    if key in option.bypass:
        if w.bypass:
            return None
        return _no(
            w,
            f"{_shown(w.value)} turns off the agent's unattended guard rails, which this "
            "receiver's allow-list does not permit (allow.bypass = false)",
            BYPASS_RULE,
        )
    if key in w.listed:
        return None
    base = w.local if local_set else option.default
    if key not in ranks:
        return _no(w, f"{_shown(w.value)} is not one of its settings")
    if _key(base) in ranks and ranks[key] <= ranks[_key(base)]:
        return None
    return _no(
        w,
        f"{_shown(w.value)} is wider than {_shown(base)} (this machine's setting); list it in "
        f"[allow.options.{w.adapter}] {w.key} to let routes choose it",
    )


def _adds(option: RouteOption, w: Wanted, local_set: bool) -> Decision | None:
    if not isinstance(w.value, list | tuple):
        return _no(w, "it must be a list")
    wrong = _pattern(option, w)
    if wrong is not None:
        return wrong
    if local_set and isinstance(w.local, list | tuple):
        dropped = [v for v in w.local if v not in w.value]
        if dropped:
            return _no(
                w,
                f"it drops {_shown(dropped)}, which this machine's configuration sets; a "
                "route may add to this list, not take from it",
            )
    return None


def _subset(option: RouteOption, w: Wanted, local_set: bool) -> Decision | None:
    if not isinstance(w.value, list | tuple):
        return _no(w, "it must be a list")
    wrong = _pattern(option, w)
    if wrong is not None or not local_set or not isinstance(w.local, list | tuple):
        return wrong
    extra = [v for v in w.value if v not in w.local]
    if extra:
        return _no(
            w,
            f"it adds {_shown(extra)} to what this machine's configuration allows; a route "
            "may choose among those, not add to them",
        )
    return None


def _listed(option: RouteOption, w: Wanted, local_set: bool) -> Decision | None:
    where = f"[allow.options.{w.adapter}] {w.key}"
    if not option.items:
        if canonical(w.value) in w.listed:
            return None
        return _no(
            w,
            f"{_shown(w.value)} is not a value this machine's configuration gives it or lists "
            f"in {where}: it carries programs, flags or configuration, which only this "
            "machine chooses",
        )
    items = item_texts(w.value)
    if items is None:
        return _no(w, f"it must be a list of text or a map of text, not {_shown(w.value)}")
    mine = set(item_texts(w.local) or ()) if local_set else set()
    for item in items:
        if item not in w.listed and item not in mine:
            return _no(
                w,
                f"{_shown(item)} is not an item this machine's configuration gives it or "
                f"lists in {where}",
            )
    return None
