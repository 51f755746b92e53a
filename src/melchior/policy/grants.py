"""Who may invoke what on whom, across machines: pure, directional, exact.

A grant is (caller, receiver, capabilities). Permission for A to invoke X on B
says nothing about B invoking anything on A, nor A invoking Y on B. Unknown agents
and missing grants are refused with the same words to the caller, so discovery
cannot be done by probing; the audit log keeps the precise rule.
"""

from __future__ import annotations

from collections.abc import Set

from melchior.policy.decision import Decision, allow, refuse

NOT_GRANTED = "no such capability is available to you on that agent"
"""What a caller hears for both 'unknown agent/capability' and 'not granted'."""


def may_invoke(
    *,
    caller: str,
    receiver: str,
    capability: str | None,
    receiver_exists: bool,
    declared: Set[str],
    granted: Set[str],
) -> Decision:
    """Decide one invocation. ``capability`` None means 'the caller's only granted one'."""
    if not receiver_exists:
        return refuse("unknown-agent", f"agent {receiver!r} does not exist in this workspace")
    if caller == receiver:
        return refuse("self", f"{caller!r} may not send tasks to itself through the relay")
    usable = granted & declared
    if capability is None:
        if len(usable) == 1:
            (only,) = usable
            return allow("grant", f"{caller} holds exactly one grant on {receiver}: {only}")
        if not usable:
            return refuse("no-grant", f"{caller} holds no grant on {receiver}")
        return refuse(
            "ambiguous",
            f"{caller} holds {len(usable)} grants on {receiver}; name one in metadata.capability",
        )
    if capability not in declared:
        return refuse("unknown-capability", f"{receiver} declares no capability {capability!r}")
    if capability not in granted:
        return refuse("no-grant", f"{caller} holds no grant for {capability!r} on {receiver}")
    return allow("grant", f"{caller} may invoke {capability} on {receiver}")


def chosen_capability(capability: str | None, usable: Set[str]) -> str:
    """The capability an allowed decision refers to (call only after an allow)."""
    if capability is not None:
        return capability
    (only,) = usable
    return only
