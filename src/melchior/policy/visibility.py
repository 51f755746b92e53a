"""Who may see a relay task: one rule for the control API, the receiver API and A2A.

Pure, like :mod:`.walls`. A task is visible only inside its workspace; a workspace owner
sees every task there; an agent sees a task it is a *party* to — as the caller that sent
it, or as the receiver that runs it — and each surface asks for the party it serves:

- the control API lets either party read a task, and only its caller (or an owner)
  cancel it;
- the receiver API serves the receiver only;
- the A2A entry serves a task only through the receiving agent's own URL (``through``),
  and only to its caller (or an owner): a task is not visible at another agent's door.

Every refusal is answered to the caller exactly like an unknown id (nothing about other
agents' work leaks); the rule names why for logs and tests.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from melchior.policy.decision import Decision, allow, refuse

Party = Literal["any", "caller", "receiver"]


class Viewer(NamedTuple):
    """Who asks: the credential's workspace, whether it is an owner's, and its subject
    (the agent id for an agent credential)."""

    workspace: str
    owner: bool
    subject: str


class Parties(NamedTuple):
    """Where a task lives and who its two parties are."""

    workspace: str
    caller: str
    receiver: str


def may_see_task(
    viewer: Viewer, task: Parties, *, party: Party = "any", through: str | None = None
) -> Decision:
    """May ``viewer`` see ``task`` as ``party``, asking at agent ``through`` (A2A only)?"""
    if viewer.workspace != task.workspace:
        return refuse("other-workspace", "the task is in another workspace")
    if through is not None and through != task.receiver:
        return refuse(
            "other-agent", f"the task was sent to {task.receiver}, not asked about at {through}"
        )
    if viewer.owner:
        return allow("owner", "a workspace owner sees every task of the workspace")
    me = viewer.subject
    if party in ("any", "caller") and me == task.caller:
        return allow("caller", f"{me} sent the task")
    if party in ("any", "receiver") and me == task.receiver:
        return allow("receiver", f"{me} runs the task")
    wanted = {"any": "a party to", "caller": "the caller of", "receiver": "the receiver of"}
    return refuse("not-a-party", f"{me} is not {wanted[party]} the task")


def party_filters(
    viewer: Viewer, caller: str | None, receiver: str | None
) -> list[tuple[str | None, str | None]]:
    """The (caller, receiver) filters under which an agent lists only rows it is a party
    to, for a requested filter: its own rows as caller, then as receiver. A filter naming
    someone else on both sides leaves nothing. Owners list with the filter as given."""
    if viewer.owner:
        return [(caller, receiver)]
    me = viewer.subject
    routes: list[tuple[str | None, str | None]] = []
    if caller in (None, me):
        routes.append((me, receiver))
    if receiver in (None, me):
        routes.append((caller, me))
    return routes
