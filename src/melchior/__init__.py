"""melchior: agents naming, finding, reaching and refusing each other.

The package is layered so that dependencies only point downward: ``wire`` and
``names`` know nothing of sessions, ``policy`` is pure, ``session`` knows nothing
of any harness, and ``mellan`` (the relay) sits beside them on the same envelope
(docs/architecture.md).

The names below are the Python API (docs/api.md); ``import melchior`` imports none of
their modules until one is used, because ``melchior tool`` starts for every call and
must stay fast:

- the envelope: :class:`Message` and :class:`Receipt`;
- a session on this machine: :func:`connect` to its socket, :func:`call` a verb on the
  connection, :func:`call_once` for both, :class:`Unreachable` when nobody answers;
- a plane: :func:`load_plane` reads ``PLANE.toml`` into a :class:`PlaneConfig`,
  :class:`Plane` runs it;
- one turn of one agent: :func:`runtime_for` an adapter, a :class:`Runtime`, its
  :class:`Turn` and :class:`TurnResult`.

The relay client is :mod:`melchior.mellan` (``from melchior.mellan import RelayClient``).
"""

from __future__ import annotations

import sys as _sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (tool start-up)

__version__ = "0.1.0"

# httpx imports its own command-line client whenever click, pygments and rich happen to
# be installed (uvicorn, pytest and textual bring them), ~80 modules and a quarter of a
# `mellan` command's start-up, for a `main` nothing here calls. A module of that name
# without a `main` makes httpx keep its stand-in instead (its import of it fails, as when
# the three are absent); only if httpx is not loaded yet, and only that one module.
if "httpx" not in _sys.modules:
    _sys.modules.setdefault("httpx._main", type(_sys)("httpx._main"))
del _sys

_WHERE = {
    "Message": ("melchior.envelope", "Message"),
    "Receipt": ("melchior.envelope", "Receipt"),
    "connect": ("melchior.session.client", "connect"),
    "call": ("melchior.session.client", "call"),
    "call_once": ("melchior.session.client", "call_once"),
    "Unreachable": ("melchior.session.client", "Unreachable"),
    "Plane": ("melchior.plane.runner", "Plane"),
    "PlaneConfig": ("melchior.plane.config", "PlaneConfig"),
    "load_plane": ("melchior.plane.config", "load"),
    "runtime_for": ("melchior.runtimes", "runtime_for"),
    "Runtime": ("melchior.runtimes", "Runtime"),
    "Turn": ("melchior.runtimes", "Turn"),
    "TurnResult": ("melchior.runtimes", "TurnResult"),
}

__all__ = [
    "Message",
    "Plane",
    "PlaneConfig",
    "Receipt",
    "Runtime",
    "Turn",
    "TurnResult",
    "Unreachable",
    "__version__",
    "call",
    "call_once",
    "connect",
    "load_plane",
    "runtime_for",
]

if TYPE_CHECKING:
    from typing import Any

    from melchior.envelope import Message, Receipt
    from melchior.plane.config import PlaneConfig
    from melchior.plane.config import load as load_plane
    from melchior.plane.runner import Plane
    from melchior.runtimes import Runtime, Turn, TurnResult, runtime_for
    from melchior.session.client import Unreachable, call, call_once, connect


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    from importlib import import_module

    try:
        module, attr = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module 'melchior' has no attribute {name!r}") from None
    value = getattr(import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
