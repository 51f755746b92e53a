"""Runtime adapters: how one turn of one agent runs (command, claude-code, codex, pi, a2a…).

Shared by the plane and the mellan receiver: "run one turn of this agent with this
input, bound to this session, cancellable". Start at :mod:`melchior.runtimes.base` for
the contract and :func:`runtime_for` for the adapters; ``docs/runtimes.md`` has every
option and command line.
"""

from melchior.runtimes.base import (
    CANCELED,
    COMPLETED,
    FAILED,
    INPUT_REQUIRED,
    Emit,
    Progress,
    Runtime,
    RuntimeConfigError,
    Turn,
    TurnResult,
    text_artifact,
)
from melchior.runtimes.registry import (
    ADAPTERS,
    AdapterFactory,
    preflight,
    route_rules,
    runtime_for,
)

__all__ = [
    "ADAPTERS",
    "CANCELED",
    "COMPLETED",
    "FAILED",
    "INPUT_REQUIRED",
    "AdapterFactory",
    "Emit",
    "Progress",
    "Runtime",
    "RuntimeConfigError",
    "Turn",
    "TurnResult",
    "preflight",
    "route_rules",
    "runtime_for",
    "text_artifact",
]
