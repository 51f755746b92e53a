"""One hop budget for every transport.

What bounds agents thanking each other forever is distance from whatever a person
said, not anything about the words. The count travels with the message: a message
an operator prompted is hop 1, an answer to it hop 2, and the fifth hop is refused.
``chain`` names the conversation a person started and ``path`` lists who it has
passed through, so a local tell, a plane note and a relay task all count on the
same budget and a cycle back to an agent already on the path is visible.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from melchior.numbers import whole
from melchior.policy.decision import Decision, allow, refuse

MAX_HOPS = 4
"""The last hop allowed; hop MAX_HOPS + 1 is refused."""

MAX_HOP_VALUE = 2**31 - 1
"""Largest hop count a chain may *say* (so that it can be refused as too far, by name)."""

HOPS_URI = "https://melchior.dev/ext/hops/v1"
"""Where the chain travels in A2A metadata (the relay's entry and the a2a runtime)."""


class Chain(NamedTuple):
    chain: str
    hop: int
    path: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"chain": self.chain, "hop": self.hop, "path": list(self.path)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Chain:
        """Read a chain from an envelope, refusing shapes that would dodge the count."""
        chain, hop, path = data.get("chain"), data.get("hop"), data.get("path", [])
        if not isinstance(chain, str) or not chain:
            raise ValueError("'chain' must be a non-empty string")
        # A whole number however it is spelled: protobuf-based clients send every number
        # in metadata as a double (``1.0``); judged by size before conversion.
        try:
            hop = whole(hop, 1, MAX_HOP_VALUE)
        except ValueError as exc:
            raise ValueError(f"'hop' {exc}") from None
        if not isinstance(path, list) or not all(isinstance(p, str) for p in path):
            raise ValueError("'path' must be a list of names")
        return cls(chain, hop, tuple(path))


def new_chain_id() -> str:
    import secrets  # start-up: 'status' and 'who' never start a chain

    return secrets.token_hex(8)


def first_hop(sender: str, chain_id: str | None = None) -> Chain:
    """The chain an operator's words start: hop 1, with the sender on the path."""
    return Chain(chain_id or new_chain_id(), 1, (sender,))


def next_hop(received: Chain, sender: str) -> Chain:
    """The chain of a message sent by ``sender`` in answer to ``received``."""
    return Chain(received.chain, received.hop + 1, (*received.path, sender))


def check_hop(chain: Chain, *, limit: int = MAX_HOPS) -> Decision:
    """Refuse a message that would travel further than ``limit`` hops from a person."""
    if chain.hop > limit:
        return refuse(
            "hop-limit",
            f"this would be hop {chain.hop} of chain {chain.chain}; messages may travel at most "
            f"{limit} hops from what an operator said. Both agents are left alone until an "
            "operator speaks again, which starts a new count.",
        )
    return allow("hop-limit", f"hop {chain.hop} of at most {limit}")
