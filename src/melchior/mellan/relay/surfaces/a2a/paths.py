"""Where an agent lives on the relay: ``/a2a/{workspace}/{agent-id}`` and what follows.

Agent ids carry ``/`` (``local/codex``), so the id is not one path segment. The path
after the workspace is read left to right and the agent id ends at the first segment
that starts an A2A operation (``.well-known``, ``extendedAgentCard``, ``message:send``,
``message:stream``, ``tasks``); no operation segment means the agent's base URL, where
JSON-RPC is served. So an agent id may not contain one of those words as a segment —
the one rule this grammar needs, and one no sensible id breaks. ``local%2Fcodex`` works
too, because the path is percent-decoded before it is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

PREFIX = "/a2a"
OPERATION_HEADS = frozenset(
    {".well-known", "extendedAgentCard", "message:send", "message:stream", "tasks"}
)


@dataclass(frozen=True)
class Target:
    workspace: str
    agent: str
    rest: tuple[str, ...]  # the operation segments after the agent id (empty = base URL)


def parse(rest: str) -> Target | None:
    """Split the part of the path after ``/a2a/``; None when it names no agent."""
    segs = rest.strip("/").split("/")
    if len(segs) < 2 or not segs[0]:
        return None
    workspace, tail = segs[0], segs[1:]
    cut = next((i for i, s in enumerate(tail) if s in OPERATION_HEADS), len(tail))
    agent_segs = tail[:cut]
    if not agent_segs or any(not s for s in agent_segs):
        return None
    return Target(workspace, "/".join(agent_segs), tuple(tail[cut:]))


def base_url(public_url: str, workspace: str, agent: str) -> str:
    """The agent's A2A base URL (slashes of the id kept: readable and proxy-safe)."""
    return f"{public_url.rstrip('/')}{PREFIX}/{quote(workspace, safe='')}/{quote(agent, safe='/')}"


def is_addressable(agent: str) -> bool:
    """Whether an agent id can be reached through this grammar."""
    segs = agent.split("/")
    return all(s and s not in OPERATION_HEADS for s in segs)
