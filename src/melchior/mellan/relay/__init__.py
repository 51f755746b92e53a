"""What runs in the relay: the HTTP surfaces, the store, wake-ups, and running a replica.

Imports point down this list, without cycles (``make lint``: the ``relay-spine`` and
``relay-acyclic`` contracts in pyproject.toml):

- :mod:`.serve` runs a replica and :mod:`.app` builds its ASGI application.
- :mod:`.control` (owners' API), :mod:`.receiver_api` (receivers' API), :mod:`.a2a`
  (callers' A2A 1.0 entry) and :mod:`.dashboard` (the owner's pages): the surfaces; the
  workers beside them (push deliveries, wake-ups, retention).
- :mod:`.http`, :mod:`.body` and :mod:`.auth`: what the JSON APIs share (bounded bodies,
  credentials, fields), written once; :mod:`.refusals`, below every surface, the error
  and its one JSON shape.
- :mod:`.context`: what every handler of a replica shares (the replica's state).
- :mod:`.store`: durable state on SQLite or PostgreSQL; :mod:`.notify`/:mod:`.pgnotify`:
  wake-ups between the parts, a latency hint and never the truth.
- :mod:`.topics` and :mod:`.requestid`, below the store: the wake-ups' topic names and
  the id of the request being served, which the store writes into what it records.
"""
