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

from melchior.a2a_message import from_a2a
from melchior.envelope import Message
from melchior.mellan.relay.surfaces.a2a.errors import HopLimit, InvalidParams
from melchior.policy.hops import HOPS_URI, MAX_HOPS, Chain, check_hop

EXTENSION = {
    "uri": HOPS_URI,
    "description": (
        "Hop budget shared by every melchior transport: metadata[uri] = "
        '{"chain": str, "hop": int >= 1, "path": [agent ids]} is the chain of this '
        f"message; absent means hop 1. Hop {MAX_HOPS + 1} is refused."
    ),
    "required": False,
}


def envelope_of(
    caller: str, receiver: str, message: Mapping[str, Any], metadata: Mapping[str, Any]
) -> Message:
    """A caller's A2A message as the common envelope (:mod:`melchior.a2a_message`: its
    hop chain read from the message's metadata, then the request's); a malformed chain is
    invalid params naming the extension."""
    try:
        return from_a2a(message, sender=caller, recipient=receiver, metadata=metadata)
    except ValueError as exc:
        raise InvalidParams(str(exc), violations=[(HOPS_URI, str(exc))]) from None


def check(chain: Chain) -> None:
    decision = check_hop(chain)
    if not decision:
        raise HopLimit(decision.reason, metadata={"chain": chain.chain, "hop": str(chain.hop)})
