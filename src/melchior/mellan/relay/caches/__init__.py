"""The relay's caches: what one replica remembers for a while instead of asking the store.

Facts trusted for a short time (:mod:`.memo`, :mod:`.facts`), the limits in force
(:mod:`.limits`), events a replica wrote itself (:mod:`.fresh`) and receivers' sightings
written at most every few seconds (:mod:`.presence`). Each is a hint or a shortcut,
never the truth, which stays in the store below them; the replica's state
(:mod:`melchior.mellan.relay.context`) holds them, and they import nothing above the store
but the refusal they answer with.
"""
