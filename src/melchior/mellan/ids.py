"""What the names the relay hands out may look like: agents, capabilities, tasks, routes.

One place for both sides. The relay refuses anything else when it is created; the
receiver checks every lease against the same patterns before it uses a field (a lease
comes from the relay, and the receiver does not assume the relay is honest: a caller name
holding a newline would otherwise become lines of its own in a model's prompt). Every
pattern ends with ``\\Z``, not ``$``, which also matches before a final newline.
"""

from __future__ import annotations

import re

AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(/[A-Za-z0-9][A-Za-z0-9._-]{0,63}){0,3}\Z")
"""A workspace-scoped agent id: ``private/ops``, ``local/codex``."""
CAPABILITY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}\Z")
"""A declared capability: ``incident.inspect``."""
TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")
"""A task id as the relay mints them (UUIDs), with room for other schemes."""
ROUTE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
"""A task route's id (``rt_…``)."""
