"""Who may invoke what on whom, across machines: pure, directional, exact.

A grant is (caller, receiver, capabilities). Permission for A to invoke X on B
says nothing about B invoking anything on A, nor A invoking Y on B. Unknown agents
and missing grants are refused with the same words to the caller, so discovery
cannot be done by probing; the audit log keeps the precise rule.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

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


def may_grant(
    *,
    workspace: str,
    caller: str,
    receiver: str,
    capabilities: Sequence[str],
    caller_exists: bool,
    receiver_exists: bool,
    declared: Set[str],
) -> Decision:
    """May an owner grant ``caller`` these capabilities on ``receiver``? A grant joins two
    different agents of the workspace, in one direction, for capabilities the receiver
    declares; anything else is refused naming the rule."""
    if caller == receiver:
        return refuse(
            "self",
            f"{caller!r} cannot be granted capabilities on itself; grants join two different "
            "agents",
        )
    if not caller_exists:
        return refuse(
            "unknown-agent",
            f"no calling agent {caller!r} in workspace {workspace!r}; add it first "
            f"('mellan agent add {caller}')",
        )
    if not receiver_exists:
        return refuse(
            "unknown-agent",
            f"no receiving agent {receiver!r} in workspace {workspace!r}; add it first "
            f"('mellan agent add {receiver} --capability …')",
        )
    undeclared = [c for c in capabilities if c not in declared]
    if undeclared:
        have = ", ".join(sorted(declared)) or "none"
        return refuse(
            "unknown-capability",
            f"{receiver} declares no capability {', '.join(repr(c) for c in undeclared)} "
            f"(it declares: {have})",
        )
    return allow(
        "owner",
        f"{caller} may invoke {', '.join(capabilities)} on {receiver} (this direction only)",
    )


def chosen_capability(capability: str | None, usable: Set[str]) -> str:
    """The capability an allowed decision refers to (call only after an allow)."""
    if capability is not None:
        return capability
    (only,) = usable
    return only


def may_send_unsealed(
    *, caller: str, receiver: str, capability: str, sealed_only: Set[str]
) -> Decision:
    """May this send on ``capability`` travel in clear? Not when a grant covering it
    requires sealing (``mellan grant add … --sealed``): the owner asked that the relay never
    hold its content. Asked of unsealed sends only; the caller holds the grant, so it may
    learn the rule."""
    if capability in sealed_only:
        return refuse(
            "sealed-grant",
            f"the grant for {capability!r} from {caller} to {receiver} requires sealed sends; "
            "send it sealed ('mellan send --seal')",
        )
    return allow("grant", f"no grant for {capability!r} on {receiver} requires sealing")
