"""mellan: identity, directional capability grants and durable delivery across machines.

The relay authenticates callers, checks the directional grant, stores the task,
leases it to the receiver beside the destination agent and returns results. The
store is the durable source of truth; notifications only reduce latency.

The folders say where code runs:

- :mod:`melchior.mellan.relay` runs in the relay: its HTTP surfaces (control API,
  receiver API, A2A entry), the store, wake-ups, and running a replica.
- :mod:`melchior.mellan.client` runs on the machines around it: the typed client of the
  receiver API, and the receiver that runs tasks beside a destination agent.
- :mod:`melchior.mellan.commands` (with :mod:`melchior.mellan.cli`) is the ``mellan``
  command line. Its client commands import only ``client`` and the shared modules
  here (``rawjson``, ``outcome``); only ``mellan relay`` starts the relay.
"""
