"""The hop budget as it travels through A2A: an extension entry in ``metadata``.

``metadata["https://melchior.dev/ext/hops/v1"] = {"chain", "hop", "path"}`` on the
message (or on the request) is the chain *of this message*, counted by the sender the
way every melchior envelope counts (``policy.hops.next_hop`` of the task it is working
on). No entry means a person started it: hop 1. The relay makes sure the caller is the
last name on the path, then refuses hop 5 and beyond before anything is stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from melchior.mellan.relay.a2a.errors import HopLimit, InvalidParams
from melchior.policy.hops import HOPS_URI, MAX_HOPS, Chain, check_hop, first_hop

EXTENSION = {
    "uri": HOPS_URI,
    "description": (
        "Hop budget shared by every melchior transport: metadata[uri] = "
        '{"chain": str, "hop": int >= 1, "path": [agent ids]} is the chain of this '
        f"message; absent means hop 1. Hop {MAX_HOPS + 1} is refused."
    ),
    "required": False,
}


def chain_of(caller: str, *metadatas: Mapping[str, Any] | None) -> Chain:
    """The chain of a caller's message, from the first metadata that carries one."""
    for md in metadatas:
        if md and HOPS_URI in md:
            raw = md[HOPS_URI]
            if not isinstance(raw, dict):
                raise InvalidParams(
                    f"metadata[{HOPS_URI!r}] must be an object", violations=[(HOPS_URI, "object")]
                )
            try:
                chain = Chain.from_dict(raw)
            except ValueError as exc:
                raise InvalidParams(
                    f"metadata[{HOPS_URI!r}]: {exc}", violations=[(HOPS_URI, str(exc))]
                ) from None
            if not chain.path or chain.path[-1] != caller:
                chain = Chain(chain.chain, chain.hop, (*chain.path, caller))
            return chain
    return first_hop(caller)


def check(chain: Chain) -> None:
    decision = check_hop(chain)
    if not decision:
        raise HopLimit(decision.reason, metadata={"chain": chain.chain, "hop": str(chain.hop)})
