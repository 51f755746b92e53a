"""Adapter names to factories: what a route's ``adapter = "codex"`` means.

Factories import their adapter on first use, so naming the registry costs nothing and
the optional ``a2a-sdk`` is only needed by whoever actually configures an ``a2a`` route.
A factory validates its configuration at once: a bad option fails when the receiver or
the plane starts, with the option's name, not on the first task at three in the morning.

Each adapter's module also declares ``ROUTE_RULES``: what a route from the relay may do
with each of its options (:mod:`melchior.policy.route_options`), read by the receiver.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from melchior.policy.route_options import RouteOption
from melchior.runtimes.base import Runtime, RuntimeConfigError

AdapterFactory = Callable[[Mapping[str, Any]], Runtime]

_MODULES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "command": ("melchior.runtimes.command", "CommandRuntime"),
        "claude-code": ("melchior.runtimes.claude_code", "ClaudeCodeRuntime"),
        "codex": ("melchior.runtimes.codex", "CodexRuntime"),
        "pi": ("melchior.runtimes.pi", "PiRuntime"),
        "a2a": ("melchior.runtimes.a2a", "A2ARuntime"),
        "provider": ("melchior.runtimes.provider", "ProviderRuntime"),
    }
)
"""Each adapter's module and class, by its registry name."""


def _factory(module: str, cls: str) -> AdapterFactory:
    def make(config: Mapping[str, Any]) -> Runtime:
        runtime: Runtime = getattr(importlib.import_module(module), cls)(config)
        return runtime

    return make


ADAPTERS: Mapping[str, AdapterFactory] = MappingProxyType(
    {name: _factory(*where) for name, where in _MODULES.items()}
)
"""Every adapter by its registry name."""


def route_rules(name: str) -> Mapping[str, RouteOption]:
    """What a relay route may do with each option of adapter ``name`` (every option has a
    rule); empty for an unknown name."""
    where = _MODULES.get(name)
    if where is None:
        return {}
    rules: Mapping[str, RouteOption] = importlib.import_module(where[0]).ROUTE_RULES
    return rules


def runtime_for(name: str, config: Mapping[str, Any] | None = None) -> Runtime:
    """The runtime adapter ``name`` configured with ``config`` (its options).

    Raises :class:`RuntimeConfigError` for an unknown name or a bad option.
    """
    factory = ADAPTERS.get(name) if isinstance(name, str) else None
    if factory is None:
        raise RuntimeConfigError(
            f"no runtime adapter is named {name!r}; the adapters are {', '.join(ADAPTERS)}"
        )
    if config is not None and not isinstance(config, Mapping):
        raise RuntimeConfigError(f"{name}: options must be a mapping, got {type(config).__name__}")
    return factory(config or {})


CLI_ADAPTERS = frozenset({"claude-code", "codex", "pi"})
"""The adapters that drive a coding agent's CLI, whose release they check at start-up."""


def preflight(
    names: Iterable[str], configs: Mapping[str, Mapping[str, Any]] | None = None
) -> list[str]:
    """Check, when a receiver or a plane starts, what the first turn of each adapter in
    ``names`` would find: its CLI installed, and a release the adapter drives. Returns
    one line per CLI for the start-up log (``Claude Code 2.1.332 at /usr/bin/claude``);
    raises :class:`RuntimeConfigError` with the one line that says what is needed.
    ``configs`` are the adapters' local options (a route may still name another binary:
    that one is checked on its turn)."""
    found = []
    for name in sorted(set(names) & CLI_ADAPTERS):
        runtime = runtime_for(name, (configs or {}).get(name))
        check = getattr(runtime, "preflight", None)
        if callable(check):
            found.append(str(check()))
    return found
