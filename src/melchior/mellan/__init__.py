"""mellan: identity, directional capability grants and durable delivery across machines.

The relay authenticates callers, checks the directional grant, stores the task,
leases it to the receiver beside the destination agent and returns results. The
store is the durable source of truth; notifications only reduce latency.

The folders say where code runs, and imports point down this list (``make lint`` checks
it: pyproject's ``[tool.importlinter]``, docs/architecture.md "Layers"):

- :mod:`melchior.mellan.commands` (with :mod:`melchior.mellan.cli` and the demo,
  :mod:`melchior.mellan.demo`) is the ``mellan`` command line; only ``mellan relay``
  starts the relay. No other code imports it.
- :mod:`melchior.mellan.relay` runs in the relay: its HTTP surfaces (control API,
  receiver API, A2A entry, dashboard), the store, wake-ups and pushes, and running a
  replica. It imports nothing that runs beside an agent.
- :mod:`melchior.mellan.receiver` runs beside a destination agent: it claims tasks and
  runs them through :mod:`melchior.runtimes`, over :mod:`melchior.mellan.client`.
- :mod:`melchior.mellan.client` runs on the machines around the relay (it never imports
  the relay): the relay client an agent calls other agents with (:mod:`.client.caller`)
  and the typed client of the receiver API.
- below them, what every side shares: :mod:`~melchior.mellan.credentials` and
  :mod:`~melchior.mellan.transport` (the rules every client follows: which credential
  and relay, TLS, no token in clear), :mod:`~melchior.mellan.ids`,
  :mod:`~melchior.mellan.outcome`, :mod:`~melchior.mellan.rawjson`,
  :mod:`~melchior.mellan.signing`.

The names below are the Python API (docs/api.md), imported on first use so that
importing a relay module does not pay for the client::

    from melchior.mellan import RelayClient

    with RelayClient.from_credentials(as_agent="local/codex") as relay:
        task = relay.send("private/ops", "echo hi", wait=True)
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (tool start-up)

_WHERE = {
    "RelayClient": "melchior.mellan.client.caller",
    "AsyncRelayClient": "melchior.mellan.client.caller",
    "RelayError": "melchior.mellan.client.errors",
    "TaskView": "melchior.mellan.client.views",
    "TaskEvent": "melchior.mellan.client.views",
    "TaskPage": "melchior.mellan.client.views",
    "Identity": "melchior.mellan.client.views",
    "AgentCredential": "melchior.mellan.credentials",
    "CredentialError": "melchior.mellan.credentials",
    "agent_credential": "melchior.mellan.credentials",
    "ClientTls": "melchior.mellan.transport",
    "TransportError": "melchior.mellan.transport",
    "ReceiverClient": "melchior.mellan.client.receiver",
    "AsyncReceiverClient": "melchior.mellan.client.receiver",
}

__all__ = [
    "AgentCredential",
    "AsyncReceiverClient",
    "AsyncRelayClient",
    "ClientTls",
    "CredentialError",
    "Identity",
    "ReceiverClient",
    "RelayClient",
    "RelayError",
    "TaskEvent",
    "TaskPage",
    "TaskView",
    "TransportError",
    "agent_credential",
]

if TYPE_CHECKING:
    from typing import Any

    from melchior.mellan.client.caller import AsyncRelayClient, RelayClient
    from melchior.mellan.client.errors import RelayError
    from melchior.mellan.client.receiver import AsyncReceiverClient, ReceiverClient
    from melchior.mellan.client.views import Identity, TaskEvent, TaskPage, TaskView
    from melchior.mellan.credentials import AgentCredential, CredentialError, agent_credential
    from melchior.mellan.transport import ClientTls, TransportError


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    from importlib import import_module

    if name not in _WHERE:
        raise AttributeError(f"module 'melchior.mellan' has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
