"""Who is calling, and what they may see: authentication and task visibility.

Every operation but the public card needs a live bearer credential (401 otherwise).
A task is visible only inside its workspace, through the receiving agent's own URL,
and only to the agent that sent it or to a workspace owner; anything else answers
exactly as an unknown id would (``TaskNotFound``), before any detail is read.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from starlette.requests import Request

from melchior.mellan.relay.auth import identify, parties_of, viewer_of
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.store.base import CredentialKind, Principal, StoreError, Task
from melchior.mellan.relay.surfaces.a2a.errors import TaskNotFound, Unauthenticated
from melchior.mellan.relay.surfaces.a2a.paths import Target
from melchior.policy.visibility import may_see_task


@dataclass(frozen=True)
class Caller:
    principal: Principal
    target: Target

    @property
    def is_owner(self) -> bool:
        return self.principal.kind is CredentialKind.OWNER

    @property
    def same_workspace(self) -> bool:
        return self.principal.workspace == self.target.workspace

    @property
    def actor(self) -> str:
        return f"{self.principal.kind.value}:{self.principal.subject}"

    def can_see(self, task: Task | None) -> bool:
        """Only through the receiving agent's own URL, and only its caller or an owner
        (:func:`melchior.policy.visibility.may_see_task`, the rule of every surface)."""
        if task is None or task.workspace != self.target.workspace:
            return False
        viewer = viewer_of(self.principal)
        return may_see_task(
            viewer, parties_of(task), party="caller", through=self.target.agent
        ).allowed

    def visible(self, task: Task | None, task_id: str) -> Task:
        if task is None or not self.can_see(task):
            raise TaskNotFound(metadata={"taskId": task_id})
        return task


def _audit_unknown_credential(relay: Relay, target: Target, why: str) -> None:
    """Record a dead credential knocking on a real agent's door (made-up URLs are not
    recorded, so nobody can flood an audit log by inventing names)."""
    if relay.store.get_agent(target.workspace, target.agent) is None:
        return
    with contextlib.suppress(StoreError):
        relay.store.audit(
            target.workspace,
            "credential:unknown",
            "a2a.authenticate",
            target.agent,
            False,
            "credential",
            why,
        )


async def authenticate(relay: Relay, request: Request, target: Target) -> Caller:
    principal, why = await identify(request, relay)
    if why == "missing":
        raise Unauthenticated("Send 'Authorization: Bearer <credential>' (an agent or owner token)")
    if principal is None:
        why = "credential is unknown, expired or revoked"
        await relay.call(_audit_unknown_credential, relay, target, why)
        raise Unauthenticated(f"This {why}")
    return Caller(principal, target)
