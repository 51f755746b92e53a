"""Pure policy: values in, decisions with reasons out, no I/O.

Every refusal anywhere in melchior is one of these decisions, so each rule is
testable on its own (property-based) and printable in an audit log as it was made.
"""

from melchior.policy.decision import Decision, allow, refuse
from melchior.policy.hops import MAX_HOPS, Chain, check_hop, first_hop, next_hop

__all__ = ["MAX_HOPS", "Chain", "Decision", "allow", "check_hop", "first_hop", "next_hop", "refuse"]
