"""The relay's workers: what a replica runs in the background, owned by the app's lifespan.

Push deliveries (:mod:`.push`), wake-ups (:mod:`.wake`) and retention (:mod:`.retention`).
A worker sits above the surfaces because it says what they would have said (a push
notification is a stream's event, built by :mod:`melchior.mellan.relay.surfaces.a2a`), and
below the server, which starts and stops it; no surface imports a worker.
"""
