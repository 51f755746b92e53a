"""The plane: a team of agents run turn by turn, their notes carried under the operator's control.

Seed 001 and ARCHITECTURE §4. The pieces, each in its own module:

- :mod:`.config` reads ``PLANE.toml`` (strict: an unknown key is an error naming it);
- :mod:`.state` keeps doors, held notes, the message log, hop chains and ceilings in
  SQLite, so a restarted plane carries on where it stopped;
- :mod:`.roster` writes who there is into each workspace before every turn;
- :mod:`.outbox` is the file protocol between a turn and the plane (the only route from
  an agent to the plane), and :mod:`.verbs` the agent's side of it (``send_to``, ``team``);
- :mod:`.delivery` turns each note into a receipt (delivered, held, refused);
- :mod:`.runner` runs the turns; :mod:`.webhook` and :mod:`.console` are ways in.

The rules themselves are pure and live in :mod:`melchior.policy` (doors, quotas, hops,
routing), shared with the rest of melchior. Importing this package imports nothing.
"""
