"""What runs in the relay: the HTTP surfaces, the store, wake-ups, and running a replica.

- :mod:`.app` builds the ASGI application (one per replica) and :mod:`.serve` runs it;
  :mod:`.context` is what every handler of a replica shares.
- :mod:`.http`, :mod:`.body` and :mod:`.auth`: what every HTTP surface shares (errors,
  bounded bodies, credentials), written once.
- :mod:`.control` (owners' API), :mod:`.receiver_api` (receivers' API) and :mod:`.a2a`
  (callers' A2A 1.0 entry): the three surfaces.
- :mod:`.store`: durable state on SQLite or PostgreSQL; :mod:`.notify`/:mod:`.pgnotify`:
  wake-ups between the parts, a latency hint and never the truth.
"""
