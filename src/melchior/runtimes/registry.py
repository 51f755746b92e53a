"""Adapter names to factories: what a route's ``adapter = "codex"`` means.

Factories import their adapter on first use, so naming the registry costs nothing and
the optional ``a2a-sdk`` is only needed by whoever actually configures an ``a2a`` route.
A factory validates its configuration at once: a bad option fails when the receiver or
the plane starts, with the option's name, not on the first task at three in the morning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from melchior.runtimes.base import Runtime, RuntimeConfigError

AdapterFactory = Callable[[Mapping[str, Any]], Runtime]


def _command(config: Mapping[str, Any]) -> Runtime:
    from melchior.runtimes.command import CommandRuntime

    return CommandRuntime(config)


def _claude_code(config: Mapping[str, Any]) -> Runtime:
    from melchior.runtimes.claude_code import ClaudeCodeRuntime

    return ClaudeCodeRuntime(config)


def _codex(config: Mapping[str, Any]) -> Runtime:
    from melchior.runtimes.codex import CodexRuntime

    return CodexRuntime(config)


def _pi(config: Mapping[str, Any]) -> Runtime:
    from melchior.runtimes.pi import PiRuntime

    return PiRuntime(config)


def _a2a(config: Mapping[str, Any]) -> Runtime:
    from melchior.runtimes.a2a import A2ARuntime

    return A2ARuntime(config)


def _provider(config: Mapping[str, Any]) -> Runtime:
    from melchior.runtimes.provider import ProviderRuntime

    return ProviderRuntime(config)


ADAPTERS: Mapping[str, AdapterFactory] = MappingProxyType(
    {
        "command": _command,
        "claude-code": _claude_code,
        "codex": _codex,
        "pi": _pi,
        "a2a": _a2a,
        "provider": _provider,
    }
)
"""Every adapter by its registry name."""


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
