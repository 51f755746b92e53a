"""Running a relay replica: the process, its ASGI application and its settings.

:mod:`.serve` runs a replica (binding, TLS policy, the PostgreSQL listener of
:mod:`.pgnotify`), :mod:`.app` builds the application that mounts every surface and owns
every worker, :mod:`.tls` the certificates, :mod:`.settings` the one table of flags, TOML
keys and variables, :mod:`.backup` a copy of the database. The top of the relay: nothing
in it is imported by a surface, a worker or the store.
"""
