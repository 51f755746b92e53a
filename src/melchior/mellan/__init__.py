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
  runs them through :mod:`melchior.runtimes`, over :mod:`melchior.mellan.client`, the
  typed client of the receiver API (which never imports the relay).
- below them, what both sides share: :mod:`~melchior.mellan.ids`,
  :mod:`~melchior.mellan.outcome`, :mod:`~melchior.mellan.rawjson`,
  :mod:`~melchior.mellan.signing`, :mod:`~melchior.mellan.transport`.
"""
