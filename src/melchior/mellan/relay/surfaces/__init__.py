"""The relay's surfaces: everything that answers an HTTP request.

The owners' control API (:mod:`.control`), the receivers' API (:mod:`.receiver`), the
callers' A2A 1.0 entry (:mod:`.a2a`) and the owner's pages (:mod:`.dashboard`), with the
control plane's changes they share (:mod:`.actions`, :mod:`.route_changes`,
:mod:`.wakeconfig`) and what the JSON APIs share (:mod:`.http`, :mod:`.body`). They sit
over the replica's state (:mod:`melchior.mellan.relay.context`) and below the server that
mounts them; none imports a worker, so a surface never waits on background work.
"""
