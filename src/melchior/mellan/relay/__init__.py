"""What runs in the relay, in sub-packages by role; imports point down this list.

``make lint`` holds the order (the ``relay-spine`` and ``relay-acyclic`` contracts in
pyproject.toml):

- :mod:`.server`: running a replica (:mod:`.server.serve`) and its ASGI application
  (:mod:`.server.app`), settings, TLS, backups.
- :mod:`.workers`: push deliveries, wake-ups, retention, owned by the app's lifespan.
- :mod:`.surfaces`: what answers HTTP: the control API, the receiver API, the A2A 1.0
  entry, the dashboard, and the changes and JSON basics they share.
- :mod:`.context`: what every handler of a replica shares (the replica's state), with
  the accept batcher (:mod:`.batch`) and the shared task readers (:mod:`.watch`) it owns.
- :mod:`.caches`: what a replica remembers for a while (memos, limits, sightings).
- :mod:`.auth`, :mod:`.metrics`, :mod:`.outbound`, :mod:`.refusals` and
  :mod:`.observe`: reading credentials, counting, the checked POST, the error and its one
  JSON shape, access lines; below every surface and worker.
- :mod:`.store`: durable state on SQLite or PostgreSQL; :mod:`.notify`: wake-ups between
  the parts, a latency hint and never the truth.
- :mod:`.topics` and :mod:`.requestid`, below the store: the wake-ups' topic names and
  the id of the request being served, which the store writes into what it records.
"""
