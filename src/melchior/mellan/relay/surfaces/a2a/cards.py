"""Agent cards: a public one that says only how to connect, and a per-caller extended one.

The public card is the same for every path under ``/a2a/`` (apart from the URL it
names), whether or not such an agent exists, so it cannot be used to enumerate a
workspace. The extended card needs a credential and lists as skills exactly the
capabilities that caller holds a live grant for on that agent (declared ∩ granted);
a workspace owner sees every declared capability. Both carry ``ETag`` and
``Cache-Control`` so clients revalidate cheaply.

Both declare the sealed-task extension (:data:`SEALED`): what a sealed message looks like
is no secret. The extended card adds, to a caller it lists skills for (and the owner), the
fingerprint of the agent's registered key — a hint to compare, not a key to trust: a
caller seals to the key its own machine pinned (``mellan/keys.py``).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any, NamedTuple

from melchior import __version__
from melchior.mellan.relay.store.base import Agent, Capability, Store
from melchior.mellan.relay.surfaces.a2a import hops, jsontext, paths
from melchior.mellan.relay.surfaces.a2a.access import Caller
from melchior.mellan.sealing import MEDIA_TYPE, SEALED_URI, SUITE

PUBLIC_MAX_AGE = 300
EXTENDED_MAX_AGE = 60
INPUT_MODES = ["text/plain", "application/json"]

SEALED_PARAMS = {"mediaType": MEDIA_TYPE, "suite": SUITE}
SEALED: dict[str, Any] = {
    "uri": SEALED_URI,
    "description": (
        "Sealed tasks: the message's parts are encrypted to the receiving agent's key "
        f"(one data part of {MEDIA_TYPE}, suite {SUITE}), the routing fields bound; the "
        "result comes back sealed to the caller. The relay routes ciphertext it cannot read."
    ),
    "required": False,
    "params": SEALED_PARAMS,
}


def _base_card(
    public_url: str, workspace: str, agent: str, grpc: str | None = None
) -> dict[str, Any]:
    url = paths.base_url(public_url, workspace, agent)
    interfaces = [
        {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        {"url": url, "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
    ]
    if grpc is not None:  # a gRPC target has no path: the agent is the request's tenant
        tenant = f"{workspace}/{agent}"
        interfaces.append(
            {"url": grpc, "protocolBinding": "GRPC", "protocolVersion": "1.0", "tenant": tenant}
        )
    return {
        "name": agent,
        "description": (
            f"Agent {agent} of workspace {workspace}, reached through the mellan relay. "
            "Authenticate with a bearer credential; the extended card lists the capabilities "
            "you may invoke. Name one in metadata.capability."
        ),
        "version": __version__,
        "provider": {"organization": "mellan relay (melchior)", "url": public_url},
        "supportedInterfaces": interfaces,
        "capabilities": {
            "streaming": True,
            "pushNotifications": True,
            "extendedAgentCard": True,
            "extensions": [hops.EXTENSION, SEALED],
        },
        "securitySchemes": {
            "bearer": {
                "httpAuthSecurityScheme": {
                    "scheme": "Bearer",
                    "description": "a mellan agent credential (or a workspace owner token)",
                }
            }
        },
        "securityRequirements": [{"schemes": {"bearer": {"list": []}}}],
        "defaultInputModes": INPUT_MODES,
        "defaultOutputModes": INPUT_MODES,
        "skills": [],
    }


def public_card(
    public_url: str, workspace: str, agent: str, grpc: str | None = None
) -> dict[str, Any]:
    """``grpc``: the gRPC target (``host:port``) when the relay serves that binding."""
    return _base_card(public_url, workspace, agent, grpc)


def skill(cap: Capability) -> dict[str, Any]:
    return {
        "id": cap.id,
        "name": cap.id,
        "description": cap.description or f"capability {cap.id}",
        "tags": [cap.id.split(".", 1)[0]],
    }


STARTED = datetime.now(UTC).replace(microsecond=0)
"""When this replica started: the public card depends on nothing newer (its version,
its URLs), so this is its ``Last-Modified``."""


class Visible(NamedTuple):
    agent: Agent | None
    capabilities: list[Capability]
    last_modified: datetime
    """When what this caller's extended card shows last changed: the agent's creation,
    or the latest grant made or revoked on this route (not before the replica started,
    whose version the card names)."""
    fingerprint: str | None = None
    """The agent's registered key's fingerprint, for a caller the card lists skills for."""


def visible_capabilities(store: Store, caller: Caller) -> Visible:
    """What this caller may see on the target agent (runs in a worker thread)."""
    if not caller.same_workspace:
        return Visible(None, [], STARTED)
    agent = store.get_agent(caller.target.workspace, caller.target.agent)
    if agent is None:
        return Visible(None, [], STARTED)
    changed = [STARTED, _dt(agent.created_at)]
    key = store.agent_key(agent.workspace, agent.id)
    fingerprint = key.fingerprint if key is not None else None
    if key is not None:
        changed.append(_dt(key.registered_at))
    if caller.is_owner:
        return Visible(agent, list(agent.capabilities), max(changed), fingerprint)
    if caller.principal.subject == agent.id:
        return Visible(agent, [], max(changed))
    grants = store.list_grants(
        agent.workspace, caller=caller.principal.subject, receiver=agent.id, include_revoked=True
    )
    granted: set[str] = set()
    for g in grants:
        changed += [_dt(g.created_at), *([_dt(g.revoked_at)] if g.revoked_at else [])]
        if g.revoked_at is None:
            granted.update(g.capabilities)
    shown = [c for c in agent.capabilities if c.id in granted]
    return Visible(agent, shown, max(changed), fingerprint if shown else None)


def _dt(iso: str) -> datetime:
    """A stored timestamp, to the second (HTTP dates have no fractions)."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).replace(microsecond=0)


def extended_card(
    public_url: str,
    caller: Caller,
    agent: Agent | None,
    caps: list[Capability],
    grpc: str | None = None,
    fingerprint: str | None = None,
) -> dict[str, Any]:
    card = _base_card(public_url, caller.target.workspace, caller.target.agent, grpc)
    if fingerprint is not None:
        sealed = {**SEALED, "params": {**SEALED_PARAMS, "fingerprint": fingerprint}}
        card["capabilities"]["extensions"] = [hops.EXTENSION, sealed]
    if agent is not None and (caps or caller.is_owner):
        card["description"] = agent.description or card["description"]
    card["skills"] = [skill(c) for c in caps]
    return card


def etag(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def encode(card: dict[str, Any]) -> tuple[bytes, str]:
    body = jsontext.dumpb(card)
    return body, etag(body)
