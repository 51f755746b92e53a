"""The store contract every backend keeps, and the values that cross it.

The store is synchronous on purpose: SQLite has no async driver worth its risk,
the queue's correctness lives in single SQL statements rather than in Python, and
a relay calls it from a worker thread. Payloads cross this boundary as raw JSON
*text* and come back byte-for-byte, because a relay must carry what it was given
(a float-happy decode/encode turns 12345678901234567890 into 1.2345678901234567e+19).

Queue rules (ARCHITECTURE §5; each is a test on both backends):
1. at most one valid lease per task: ``lease_epoch`` fences renew/complete/fail;
2. the attempt is counted at claim; expiry past ``max_attempts`` → failed;
3. tasks sharing a ``session_key`` run one at a time, in order;
4. a recorded success is final (reporting retries, execution never re-runs);
5. complete is idempotent (same epoch → DUPLICATE; stale epoch → LEASE_LOST);
6. cancel revokes the lease; the receiver learns on its next renew (or via notify);
7. lease maths on the database clock; TTL comfortably above the renew interval.

Wake-ups: a store never talks to a notifier itself. The relay hands it a callback with
``set_publisher(notifier.publish)``; after each transaction *commits* the store calls it
with ``receiver_topic(workspace, receiver)`` when work may have become claimable
(enqueue, retry, reclaim, a session head finishing, a cancel freeing a session) and with
``task_topic(task_id)`` on every task state change or stored event, and
``task_stop_topic(task_id)`` when the change ends it or asks for input — not on a task's
creation: nobody can wait on a task not yet made but its own blocking send, which listens
from before the commit and holds the row it is handed. The callback runs on
the calling thread and must not block; a hint it drops costs only latency.

Errors: :class:`StoreUnavailable` means the database could not be reached or the
transaction could not be committed (connection lost, lock wait exhausted). Nothing of
that call was written; the relay answers 503 and the next call tries afresh.
:class:`NotFoundError` and :class:`Conflict` are refusals of the request itself.

Audit in the same transaction: claim, renew, progress, complete, complete_many, fail,
ack_cancel and cancel take an optional keyword ``actor`` ("agent:local/codex",
"owner:alice"). Given one, the store appends the audit record of what the call decided
(``task.claim`` per lease, ``task.complete``/``task.fail``/…, ``task.cancel`` allowed or
refused, ``lease.lost`` for a fenced write refused) *inside the same transaction* as the
queue change, so there is never a decision without its record nor a record of a
decision that did not happen, and a batch of ten claims costs one commit rather than
eleven. Lease expiries are always recorded there (actor "relay"). Without ``actor`` no
record is written (tests, benches, and callers that record by other means). Records are
built by :mod:`melchior.mellan.relay.store._common` so both backends word them alike, and the
store wakes ``audit_topic(workspace)`` after the commit.

Cancel of a leased task: the task becomes ``cancelled`` at once (what the caller sees)
and renew/progress/complete/fail for it answer LEASE_LOST from then on, but the task
keeps its bound-session slot until the receiver acknowledges (``ack_cancel`` or any
fenced write with its epoch) or a short grace lease runs out, so a receiver still
stopping a process can never overlap the session's next task.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

# Re-exported: the store's fenced writes answer in this vocabulary.
from melchior.mellan.outcome import Outcome as Outcome
from melchior.mellan.relay.requestid import current as current_request_id
from melchior.policy.send_limits import Overrides


@dataclass(frozen=True)
class AgentKey:
    """An agent's registered public key (its text form), fingerprint and when it was set."""

    agent: str
    public_key: str
    fingerprint: str
    registered_at: str


class StoreError(Exception):
    """Base of everything a store raises on purpose."""


class StoreUnavailable(StoreError):
    """The database is unreachable or the transaction did not commit; nothing was written.
    Retrying later is right; the relay maps it to 503.

    ``unclear`` is the one exception to "nothing was written": the connection was lost
    while COMMIT was on its way, so the server may have committed. A caller that must tell
    the truth finds out (e.g. :meth:`Store.task_by_message`) before saying "not stored"."""

    def __init__(self, reason: str, *, unclear: bool = False, backend: object = None) -> None:
        super().__init__(reason)
        self.unclear = unclear
        self.backend = backend  # what the store needs to settle an unclear commit (opaque)


class NotFoundError(StoreError):
    """A referenced workspace or agent does not exist (e.g. a grant for an unknown agent)."""


class QuotaRefused(StoreError):
    """``enqueue``/``enqueue_many`` met a full cap (:class:`OverLimit`); nothing stored."""

    def __init__(self, over: OverLimit) -> None:
        super().__init__(over.reason)
        self.over = over


class Conflict(StoreError):
    """The thing already exists (e.g. an agent id taken in that workspace)."""


class TaskState(enum.StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    SUCCEEDED = "succeeded"
    INPUT_REQUIRED = "input_required"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)


class CredentialKind(enum.StrEnum):
    OWNER = "owner"
    AGENT = "agent"


@dataclass(frozen=True)
class Capability:
    id: str
    description: str = ""


@dataclass(frozen=True)
class Agent:
    workspace: str
    id: str  # workspace-scoped, e.g. "local/codex"
    description: str
    capabilities: tuple[Capability, ...]
    created_at: str
    receiver_seen_at: str | None = None  # its receiver's last claim (or renew), if any
    receiver_info: str | None = None  # raw JSON text the receiver said about itself
    wake_url: str | None = None  # where the relay POSTs a signed wake-up (None: no wake)


@dataclass(frozen=True)
class Principal:
    """Who a presented credential is. Owners act for the workspace; agents for themselves."""

    workspace: str
    kind: CredentialKind
    subject: str  # member name for owners, agent id for agents
    credential_id: str


@dataclass(frozen=True)
class Grant:
    id: str
    workspace: str
    caller: str
    receiver: str
    capabilities: tuple[str, ...]
    created_at: str
    revoked_at: str | None = None
    sealed: bool = False  # every send on it must be sealed (schema v12)


@dataclass(frozen=True)
class AuditRecord:
    seq: int
    workspace: str
    at: str
    actor: str  # "owner:alice", "agent:local/codex", "relay"
    action: str  # "grant.add", "task.accept", "task.refuse", "task.claim", "lease.lost", ...
    subject: str  # what it was about: an agent id, grant id or task id
    allowed: bool
    rule: str
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)
    request_id: str | None = None  # the HTTP request that caused it (schema v8)


@dataclass(frozen=True)
class Record:
    """An allowed decision to record in the audit log *in the very transaction* of the
    change it allowed: a task is never queued, an agent added or a grant made without its
    record, nor recorded without having happened, whatever the database does between.
    ``subject`` None means "the id of what the call creates" (a task, grant, credential)."""

    actor: str
    action: str
    rule: str
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)
    subject: str | None = None
    request_id: str | None = field(default_factory=current_request_id)
    """The request it is built for (read when it is built: a batch written by another
    task keeps each request's own id)."""


@dataclass(frozen=True)
class Caps:
    """Limits the enqueue transaction checks before it stores a new task (counted inside
    it, so two replicas cannot both take the last place): the caller's unfinished tasks
    at this receiver, and the receiver's queued tasks (:mod:`melchior.policy.send_limits`)."""

    max_unfinished_per_receiver: int
    max_queued: int


@dataclass(frozen=True)
class OverLimit:
    """A new task the store refused to store because a cap was full; its ``quota.refused``
    record was written in the same transaction. ``limit`` names the cap."""

    limit: str
    count: int
    allowed: int
    reason: str
    retry_after: int


class Verdict(NamedTuple):
    """What a fenced write came to, and for a lost lease, why: ``reason`` is a short word
    (``cancelled``, ``stale-epoch``, ``expired``, ``finished``) and ``sentence`` says it to
    a person — the same words the store writes in its ``lease.lost`` audit record."""

    outcome: Outcome
    reason: str = ""
    sentence: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.OK, Outcome.DUPLICATE)


@dataclass(frozen=True)
class NewPush:
    """A push-notification config as a caller gave it (A2A ``TaskPushNotificationConfig``):
    where to POST the task's changes, and how to authenticate to that endpoint. ``id``
    None: the store names it."""

    url: str
    id: str | None = None
    token: str | None = None
    auth_scheme: str | None = None
    auth_credentials: str | None = None


@dataclass(frozen=True)
class PushConfig:
    task_id: str
    id: str
    workspace: str
    caller: str  # the agent whose task it is: its push secret signs the deliveries
    url: str
    token: str | None
    auth_scheme: str | None
    auth_credentials: str | None
    created_at: str


@dataclass(frozen=True)
class PushMark:
    """A task as one change left it: what a push delivery reports the difference between."""

    state: TaskState
    turn: int
    seq: int  # the last event stored for the task by then (0: none)


@dataclass(frozen=True)
class PushDelivery:
    """One outbox row leased for delivery (``id`` is the delivery id receivers dedupe by),
    with what it takes to send it: the config, the mark it reports and the one before
    (None: the config was made with the task, before its first state), how many of its
    messages already went out, the signing secret and whether private addresses are allowed."""

    id: int
    config: PushConfig
    mark: PushMark
    before: PushMark | None
    sent: int
    attempts: int
    created_at: str
    secret: str
    allow_private: bool


@dataclass(frozen=True)
class Purged:
    """What one batch did: ``deleted`` tasks; ``busy`` when another replica held the lock
    (and this one did nothing)."""

    deleted: int
    busy: bool = False


@dataclass(frozen=True)
class PushAttempt:
    """An outbox row as the task's timeline shows it."""

    id: int
    config_id: str
    state: TaskState
    turn: int
    upto_seq: int
    created_at: str
    attempts: int
    sent: int
    delivered_at: str | None
    gave_up_at: str | None
    last_error: str | None


class RouteState(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REVOKED = "revoked"


@dataclass(frozen=True)
class NewRoute:
    """A task route as the receiving agent proposed it: how it runs one capability."""

    workspace: str
    agent: str  # the receiving agent (the proposer)
    capability: str
    adapter: str  # one of melchior.policy.task_routes.ADAPTERS
    proposed_by: str  # actor, e.g. "agent:private/ops"
    session: str | None = None  # a bound coding-agent session id
    cwd: str | None = None  # absolute working directory on the receiver's machine
    profile: str | None = None  # unattended profile name
    options: str = "{}"  # raw JSON text of an object of adapter options


@dataclass(frozen=True)
class Route:
    """A stored task route. At most one is ``approved`` per (workspace, agent, capability);
    approving another revokes it in the same transaction."""

    id: str  # "rt_…"
    workspace: str
    agent: str
    capability: str
    adapter: str
    session: str | None
    cwd: str | None
    profile: str | None
    options: str  # raw JSON text
    state: RouteState
    proposed_at: str
    proposed_by: str
    approved_at: str | None = None
    approved_by: str | None = None
    revoked_at: str | None = None
    revoked_by: str | None = None


class RouteChange(NamedTuple):
    """What an approve or revoke came to: the route as it stands (None: no such route),
    whether this call changed it, and the approved routes it superseded (revoked)."""

    route: Route | None
    changed: bool
    superseded: tuple[Route, ...] = ()


@dataclass(frozen=True)
class NewTask:
    """A task as accepted at the door, before it is stored."""

    workspace: str
    caller: str
    receiver: str
    capability: str
    payload: str  # raw JSON text of the request message, stored and returned verbatim
    metadata: str = "{}"  # raw JSON text
    context_id: str | None = None
    message_id: str | None = None  # dedupe key per (workspace, caller)
    session_key: str | None = None  # tasks sharing one run one at a time, in order
    chain: str = ""
    hop: int = 1
    path: tuple[str, ...] = ()
    max_attempts: int = 3
    accept: Record | None = None  # recorded (task.accept) when the task is created
    push: NewPush | None = None  # a push config stored with the task (same transaction)
    caps: Caps | None = None  # checked in the enqueue transaction (None: no caps)
    id: str | None = None
    """The id the task gets if this stores it (None: the store makes one). The door makes
    it for a blocking send, which listens for the task's changes *before* the commit: a
    change right after it cannot be missed, so the send does not read back the row it was
    just handed (``a2a/tasks.py`` ``send_blocking``)."""


@dataclass(frozen=True)
class Task:
    id: str
    workspace: str
    caller: str
    receiver: str
    capability: str
    context_id: str
    state: TaskState
    payload: str
    metadata: str
    message_id: str | None
    session_key: str | None
    chain: str
    hop: int
    path: tuple[str, ...]
    attempt: int
    max_attempts: int
    lease_epoch: int
    lease_owner: str | None
    lease_expires_at: str | None
    result: str | None  # raw JSON text recorded by complete()
    error: str | None
    created_at: str
    updated_at: str
    turn: int = 1  # which turn of the task is live (a follow-up answer starts the next)


@dataclass(frozen=True)
class Lease:
    task: Task
    epoch: int
    expires_at: str
    route: Route | None = None  # the approved route for the task's capability at claim time


@dataclass(frozen=True)
class TaskEvent:
    """A stored progress/status/artifact event, in order, so streams can reconnect losslessly."""

    seq: int
    task_id: str
    at: str
    kind: str  # "status" | "artifact" | "message"
    body: str  # raw JSON text
    turn: int = 1  # the turn it was reported in


class Chained(NamedTuple):
    """An event as its transaction wrote it, with the seq of the task's event before it
    (0: none). Events of one task are written in turns (each writer holds the task's row),
    so ``prev`` is exactly the event a reader must have seen for ``event`` to come next."""

    prev: int
    event: TaskEvent


@dataclass(frozen=True)
class TaskTurn:
    """A finished turn of a task that went on: the caller's message that started it and
    what was recorded for it. A recorded turn is final (rule 4 holds per turn)."""

    task_id: str
    turn: int
    payload: str  # raw JSON text of the caller's message of that turn
    state: TaskState
    result: str | None
    error: str | None
    epoch: int  # the lease epoch its outcome was recorded under
    finished_at: str | None


@dataclass(frozen=True)
class SentMessage:
    """Where a caller's message went: the task and turn it started, and the message as
    stored (so a resend can be told from a reuse of its id)."""

    task_id: str
    turn: int
    payload: str


@dataclass(frozen=True)
class FollowUp:
    """A caller's answer to a task that asked for input: it starts the task's next turn."""

    workspace: str
    task_id: str
    caller: str
    message_id: str
    payload: str  # raw JSON text, stored and handed to the receiver verbatim
    chain: str
    hop: int
    path: tuple[str, ...]
    record: Record | None = None
    push: NewPush | None = None  # a push config added with the answer (same transaction)


@dataclass(frozen=True)
class CredentialInfo:
    """A stored credential as an owner may list it: never its token nor its hash."""

    id: str
    workspace: str
    kind: CredentialKind
    subject: str
    created_at: str
    expires_at: str | None
    revoked_at: str | None


@dataclass(frozen=True)
class Enrollment:
    """A pending one-time enrollment code. ``id`` is the code's hash: it names the code
    (to revoke it) without revealing it; the code itself was shown once, when minted."""

    id: str
    workspace: str
    agent: str
    created_at: str
    expires_at: str


@dataclass(frozen=True)
class Session:
    """A dashboard session as stored, read with the database clock (``now``) so the
    decision whether it still stands (:mod:`melchior.policy.sessions`) uses one clock."""

    principal: Principal
    created_at: str
    last_seen_at: str
    idle_expires_at: str
    expires_at: str
    now: str
    credential_live: bool


@dataclass(frozen=True)
class AuditFilter:
    """Which audit records to show: each field narrows (None: any). ``action`` ending in
    ``.`` or ``*`` is a prefix (``task.`` = every task decision); the rest are exact."""

    actor: str | None = None
    action: str | None = None
    subject: str | None = None
    allowed: bool | None = None


@dataclass(frozen=True)
class Activity:
    """Task activity in a time window of ``len(accepted)`` buckets from ``start``:
    tasks accepted per bucket, tasks finished per bucket by final state, and how many
    are open (accepted, not finished) now, at ``end``."""

    start: str
    end: str
    bucket_seconds: int
    accepted: tuple[int, ...]
    finished: dict[str, tuple[int, ...]]
    open_now: int

    @property
    def depth(self) -> tuple[int, ...]:
        """Open tasks at the end of each bucket, walked back from ``open_now``: a bucket's
        depth is today's, less what was accepted after it, plus what finished after it."""
        n = len(self.accepted)
        done = [sum(col[k] for col in self.finished.values()) for k in range(n)]
        out = [0] * n
        level = self.open_now
        for k in range(n - 1, -1, -1):
            out[k] = max(level, 0)
            level = level - self.accepted[k] + done[k]
        return tuple(out)


class Store(Protocol):
    """Everything the relay keeps. Every method is one transaction."""

    # -- lifecycle ------------------------------------------------------------------------------
    def migrate(self) -> int:
        """Apply pending schema migrations; return the schema version now in force."""
        ...

    latest_schema: int
    """The schema version this code writes (what ``migrate`` brings a database to)."""

    def schema_version(self) -> int:
        """The schema version the database is at (0: empty)."""
        ...

    def close(self) -> None: ...

    def now(self) -> str:
        """The database clock (ISO-8601 UTC); lease maths never uses the caller's clock."""
        ...

    def set_publisher(self, publish: Callable[[str], None] | None) -> None:
        """Install the after-commit wake-up callback (usually ``notifier.publish``)."""
        ...

    def settle(self, lost: StoreUnavailable, timeout: float = 5.0) -> bool:
        """Wait (up to ``timeout``) until the transaction an *unclear* ``lost`` was committing
        is decided one way or the other on the server; True once it is, so that a read made
        now tells whether it committed. False: still unknown (e.g. the database is down)."""
        ...

    # -- workspaces and credentials -------------------------------------------------------------
    def ensure_workspace(self, workspace: str) -> bool:
        """Create the workspace if missing; True when it was created now."""
        ...

    def add_credential(
        self,
        workspace: str,
        kind: CredentialKind,
        subject: str,
        token_hash: str,
        expires_at: str | None = None,
        *,
        record: Record | None = None,
    ) -> str:
        """Store a credential by its hash only; return its id."""
        ...

    def principal_for(self, token_hash: str) -> Principal | None:
        """The live (unrevoked, unexpired) credential with this hash, else None."""
        ...

    def revoke_credential(
        self, workspace: str, credential_id: str, *, record: Record | None = None
    ) -> bool: ...

    # -- agents and enrollment ------------------------------------------------------------------
    def add_agent(
        self,
        workspace: str,
        agent_id: str,
        description: str,
        capabilities: Sequence[Capability],
        *,
        record: Record | None = None,
    ) -> Agent: ...

    def get_agent(self, workspace: str, agent_id: str) -> Agent | None: ...

    def list_agents(self, workspace: str) -> list[Agent]: ...

    def add_enrollment(
        self,
        workspace: str,
        agent_id: str,
        code_hash: str,
        expires_at: str,
        *,
        record: Record | None = None,
    ) -> None: ...

    def redeem_enrollment(self, code_hash: str) -> tuple[str, str] | None:
        """Mark a live, unused code used; return (workspace, agent_id) or None. One use only."""
        ...

    def join(
        self, code_hash: str, token_hash: str, *, reason: str = ""
    ) -> tuple[str, str, str] | None:
        """Redeem a code and issue that agent's credential in one transaction (recorded
        ``enrollment.redeem``): (workspace, agent id, credential id), or None."""
        ...

    # -- grants -----------------------------------------------------------------------------
    def add_grant(
        self,
        workspace: str,
        caller: str,
        receiver: str,
        capabilities: Sequence[str],
        *,
        record: Record | None = None,
        sealed: bool = False,
    ) -> Grant: ...

    def revoke_grant(
        self, workspace: str, grant_id: str, *, record: Record | None = None
    ) -> bool: ...

    def list_grants(
        self,
        workspace: str,
        *,
        caller: str | None = None,
        receiver: str | None = None,
        include_revoked: bool = False,
    ) -> list[Grant]: ...

    def granted_capabilities(self, workspace: str, caller: str, receiver: str) -> set[str]:
        """Capabilities ``caller`` may invoke on ``receiver`` (one direction only)."""
        ...

    # -- audit ------------------------------------------------------------------------------
    def audit(
        self,
        workspace: str,
        actor: str,
        action: str,
        subject: str,
        allowed: bool,
        rule: str,
        reason: str,
        detail: dict[str, Any] | None = None,
    ) -> int: ...

    def audit_since(
        self, workspace: str, after_seq: int = 0, limit: int = 100
    ) -> list[AuditRecord]: ...

    # -- tasks: caller side -----------------------------------------------------------------------
    def enqueue(self, task: NewTask) -> tuple[Task, bool]:
        """Store a task; (task, created). A repeated (workspace, caller, message_id) returns the
        existing task with created=False instead of a second one. A created task with
        ``accept`` gets its ``task.accept`` record in the same transaction."""
        ...

    def enqueue_many(self, tasks: Sequence[NewTask]) -> list[tuple[Task, bool]]:
        """``enqueue`` for several tasks in one transaction (one commit); in input order.
        A task over its ``caps`` raises :class:`QuotaRefused` (use :meth:`admit`)."""
        ...

    def admit(self, tasks: Sequence[NewTask]) -> list[tuple[Task, bool] | OverLimit]:
        """``enqueue_many`` that checks each new task's ``caps`` inside the transaction:
        a task over a cap is not stored, its ``quota.refused`` record (actor and detail
        from its ``accept`` record) is, and :class:`OverLimit` takes its place in the
        answer. A resend of a message already stored is never refused."""
        ...

    def queue_gauges(
        self,
    ) -> tuple[
        dict[tuple[str, str], int], dict[tuple[str, str], int], dict[tuple[str, str], float]
    ]:
        """For metrics: tasks by (workspace, state); by (workspace, receiver) the queued
        tasks and the age in seconds of the oldest (database clock)."""
        ...

    def set_tally(self, tally: Callable[[Sequence[str]], None] | None) -> None:
        """Install the after-commit counter callback (the relay's metrics)."""
        ...

    def set_witness(self, witness: Callable[[Sequence[Chained]], None] | None) -> None:
        """Install the after-commit callback told of every event a commit wrote, each with
        its predecessor, *before* the commit's wake-ups are published (the relay hands
        them to its own streams without a read: :mod:`melchior.mellan.relay.caches.fresh`)."""
        ...

    # -- send limits (schema v8) ------------------------------------------------------------
    def limit_overrides(self, workspace: str) -> dict[str, Overrides]:
        """Every stored limit of the workspace: agent id → its overrides, and ``'*'`` →
        the workspace defaults (absent: nothing stored)."""
        ...

    def set_limits(
        self,
        workspace: str,
        agent: str,
        values: Overrides,
        *,
        reset: bool = False,
        record: Record | None = None,
    ) -> Overrides:
        """Store ``agent``'s (or ``'*'``: the workspace's) overrides: the values given
        replace, None keeps what is stored; ``reset`` first forgets every stored value.
        Returns what is stored now. :class:`NotFoundError` for an unknown agent."""
        ...

    def get_task(self, workspace: str, task_id: str) -> Task | None: ...

    def turns(self, task_id: str) -> list[TaskTurn]:
        """The finished turns of a task that went on, in order (empty for a one-turn task)."""
        ...

    def sent_message(self, workspace: str, caller: str, message_id: str) -> SentMessage | None:
        """The task and turn ``caller``'s message ``message_id`` went to, with its payload."""
        ...

    def continue_task(self, follow: FollowUp) -> tuple[Task | None, bool]:
        """Start the next turn of a task waiting for input, with the caller's answer, in one
        transaction: the finished turn is kept, the task is queued again (same id, attempt
        count afresh, epochs going on so the last turn's holder stays fenced out), the
        message recorded in the ledger, the record written. (task, True) when it went on;
        (task, False) when the messageId was already used (a resend, or a reuse) or the
        task no longer waits for input; (None, False) for an unknown task."""
        ...

    def task_by_message(self, workspace: str, caller: str, message_id: str) -> Task | None:
        """The task ``caller`` sent with ``message_id`` (the dedupe key), if it was stored."""
        ...

    def list_tasks(
        self,
        workspace: str,
        *,
        caller: str | None = None,
        receiver: str | None = None,
        context_id: str | None = None,
        states: Sequence[TaskState] | None = None,
        after: str | None = None,
        limit: int = 50,
        agent: str | None = None,
        capability: str | None = None,
        updated_after: str | None = None,
    ) -> list[Task]:
        """Newest first; ``after`` is an opaque cursor (a task id) for pagination. ``agent``
        matches either party (caller or receiver); ``updated_after`` (ISO-8601) keeps the
        tasks whose row changed later than it."""
        ...

    def count_tasks(
        self,
        workspace: str,
        *,
        caller: str | None = None,
        receiver: str | None = None,
        context_id: str | None = None,
        states: Sequence[TaskState] | None = None,
        agent: str | None = None,
        capability: str | None = None,
        updated_after: str | None = None,
    ) -> int:
        """How many tasks :meth:`list_tasks` would list with these filters, counted by the
        database (a listing's ``totalSize``): no row is read, however deep the history."""
        ...

    def cancel(
        self, workspace: str, task_id: str, *, actor: str | None = None, rule: str = "caller"
    ) -> tuple[Task | None, Outcome]:
        """Queued → cancelled at once; leased → cancelled with the lease revoked; terminal →
        (task, DUPLICATE) if already cancelled else (task, LEASE_LOST) meaning not cancelable.
        With ``actor``, a won cancel is audited as allowed under ``rule`` and a refused one
        (LEASE_LOST) as refused, in this transaction."""
        ...

    def append_event(self, task_id: str, kind: str, body: str) -> TaskEvent: ...

    def events_after(self, task_id: str, after_seq: int = 0) -> list[TaskEvent]: ...

    # -- tasks: receiver side (fenced) ----------------------------------------------------------
    def claim(
        self,
        workspace: str,
        receiver: str,
        owner: str,
        *,
        limit: int = 1,
        lease_seconds: float = 30.0,
        actor: str | None = None,
    ) -> list[Lease]:
        """Lease up to ``limit`` runnable tasks for ``receiver``: queued ones whose run_after has
        passed, plus leases that expired (attempt counted here; past max_attempts → failed), never
        a second task of a session_key that has one leased, never out of session order.
        With ``actor``, one ``task.claim`` record per lease, in this transaction. Each
        lease carries the route approved for its task's capability (read in this
        transaction), or None."""
        ...

    def renew(
        self,
        task_id: str,
        epoch: int,
        *,
        lease_seconds: float = 30.0,
        actor: str | None = None,
    ) -> Verdict:
        """Extend a live lease. With ``actor`` only a refusal is audited (``lease.lost``):
        renewals are too frequent to be decisions worth a record."""
        ...

    def progress(
        self, task_id: str, epoch: int, kind: str, body: str, *, actor: str | None = None
    ) -> Verdict:
        """Record a progress event under a live lease."""
        ...

    def complete(
        self,
        task_id: str,
        epoch: int,
        result: str,
        *,
        input_required: bool = False,
        actor: str | None = None,
    ) -> Verdict: ...

    def renew_many(
        self,
        items: Sequence[tuple[str, int]],
        *,
        lease_seconds: float = 30.0,
        actor: str | None = None,
    ) -> list[Verdict]:
        """Extend several leases ``(task_id, epoch)`` in one transaction; outcomes in input
        order, each as ``renew`` would answer (a busy receiver pays one commit, not one
        per running task)."""
        ...

    def complete_many(
        self, items: Sequence[tuple[str, int, str]], *, actor: str | None = None
    ) -> list[Verdict]:
        """Record several successes ``(task_id, epoch, result)`` in one transaction (one
        commit, one fsync); outcomes in input order, each as ``complete`` would answer."""
        ...

    def ack_cancel(self, task_id: str, epoch: int, *, actor: str | None = None) -> Verdict:
        """The receiver has stopped a cancelled task: release its session slot. OK the first
        time, DUPLICATE after, LEASE_LOST for another epoch or a task that was not cancelled
        while leased."""
        ...

    def fail(
        self,
        task_id: str,
        epoch: int,
        error: str,
        *,
        retryable: bool = True,
        backoff_seconds: float = 1.0,
        actor: str | None = None,
    ) -> Verdict:
        """Retryable with attempts left → queued again after a backoff; else failed."""
        ...

    # -- the dashboard: owner sessions, listings, activity --------------------------------------
    def add_session(
        self,
        workspace: str,
        credential_id: str,
        id_hash: str,
        *,
        idle_seconds: float,
        max_seconds: float,
        record: Record | None = None,
    ) -> None:
        """Store a dashboard session by the hash of its id, valid for ``max_seconds`` at most
        and ``idle_seconds`` without use (database clock). Sessions past their absolute
        expiry are deleted on the way (a bounded number)."""
        ...

    def session_for(self, id_hash: str) -> Session | None:
        """The stored session with this hash and its credential's standing, or None."""
        ...

    def touch_session(self, id_hash: str, *, idle_seconds: float, every: float = 30.0) -> bool:
        """Push a live session's idle expiry ``idle_seconds`` past now; a write at most every
        ``every`` seconds per session. True when it was written."""
        ...

    def end_session(self, id_hash: str, *, record: Record | None = None) -> bool:
        """Delete the session (sign-out); True if it existed."""
        ...

    def expire_sessions(self, id_hashes: Sequence[str] | None = None) -> int:
        """Test hook: make sessions (all, or these) idle-expired now."""
        ...

    def list_credentials(self, workspace: str) -> list[CredentialInfo]:
        """Every credential of the workspace, oldest first (revoked ones too)."""
        ...

    def list_enrollments(self, workspace: str) -> list[Enrollment]:
        """Enrollment codes neither used nor expired, oldest first."""
        ...

    def revoke_enrollment(
        self, workspace: str, enrollment_id: str, *, record: Record | None = None
    ) -> bool:
        """Make a pending code unusable now; True if it was pending."""
        ...

    def audit_matching(
        self,
        workspace: str,
        match: AuditFilter,
        *,
        after: int = 0,
        before: int | None = None,
        limit: int = 100,
        newest_first: bool = True,
    ) -> list[AuditRecord]:
        """Audit records matching ``match`` with ``after < seq < before``."""
        ...

    def task_activity(self, workspace: str, bucket_seconds: int, buckets: int) -> Activity:
        """Tasks accepted and finished per bucket over the last ``buckets`` buckets (the
        window ends now), and how many are open now."""
        ...

    # -- push notifications ---------------------------------------------------------------------
    # Every change of a task with push configs has its outbox row, written in the change's
    # own transaction by the schema (migrations v6). Deliverers on any replica lease the
    # earliest undelivered row of each config — never a later one while an earlier one is
    # pending, so each config hears of its task's changes in order — and report back.
    def add_push_config(
        self,
        workspace: str,
        task_id: str,
        caller: str,
        push: NewPush,
        *,
        limit: int = 10,
        record: Record | None = None,
    ) -> PushConfig:
        """Store (or, for an ``id`` the task already has, replace) a config of a task; it
        hears of changes made after this call. :class:`NotFoundError` for an unknown task,
        :class:`Conflict` when the task already has ``limit`` configs."""
        ...

    def get_push_config(
        self, workspace: str, task_id: str, config_id: str
    ) -> PushConfig | None: ...

    def list_push_configs(self, workspace: str, task_id: str) -> list[PushConfig]:
        """A task's configs, oldest first."""
        ...

    def delete_push_config(
        self, workspace: str, task_id: str, config_id: str, *, record: Record | None = None
    ) -> bool:
        """Delete a config and its undelivered outbox rows; True if it existed."""
        ...

    def pushes_due(self) -> bool:
        """Is any outbox row due now? (A cheap read a deliverer polls before claiming.)"""
        ...

    def claim_pushes(
        self, owner: str, *, limit: int = 16, lease_seconds: float = 60.0
    ) -> list[PushDelivery]:
        """Lease up to ``limit`` due rows, at most one per config and only its earliest
        undelivered one. An agent without a push secret gets one minted here."""
        ...

    def push_sent(self, delivery_id: int, owner: str, sent: int) -> bool:
        """``sent`` messages of a leased row are delivered (kept if the lease is lost);
        False when ``owner`` no longer holds the row."""
        ...

    def push_delivered(self, delivery_id: int, owner: str) -> bool:
        """The row is delivered: the config's next row may go."""
        ...

    def push_failed(
        self,
        delivery_id: int,
        owner: str,
        error: str,
        *,
        retry_in: float | None,
        counted: bool = True,
    ) -> bool:
        """An attempt failed: due again in ``retry_in`` seconds, or (None) given up on —
        the config's next row may go. ``counted`` False: handed back unsent, no attempt."""
        ...

    def push_attempts(self, task_id: str) -> list[PushAttempt]:
        """A task's outbox rows, in order (for its timeline)."""
        ...

    def push_secret(
        self, workspace: str, agent: str, *, rotate: bool = False, record: Record | None = None
    ) -> str | None:
        """The secret ``agent``'s push deliveries are signed with (minted on first use; a
        new one with ``rotate``). None for an unknown agent."""
        ...

    def push_allow_private(self, workspace: str) -> bool:
        """May this workspace's pushes go to loopback, link-local and private addresses?"""
        ...

    def set_push_allow_private(
        self, workspace: str, allowed: bool, *, record: Record | None = None
    ) -> None: ...

    # -- retention --------------------------------------------------------------------------------
    def workspaces(self) -> list[str]:
        """Every workspace's name (retention goes through them one by one)."""
        ...

    def purge_finished(
        self, workspace: str, age_seconds: float, *, limit: int = 500,
        record: Record | None = None,
    ) -> Purged:  # fmt: skip
        """Delete up to ``limit`` tasks of ``workspace`` that reached a terminal state more
        than ``age_seconds`` ago, oldest first, with their events, turns, messageIds, push
        configs and outbox rows, in one transaction (with ``record``, one audit record of
        the batch). The audit log is kept. Tasks not finished are never touched, however
        old. Another replica purging at the same moment makes this one do nothing
        (``busy``) rather than wait. Loop until fewer than ``limit`` are deleted."""
        ...

    # -- task routes (schema v7) ------------------------------------------------------------------
    # A route says how one receiving agent runs one capability. The agent proposes it
    # (pending); the owner approves or revokes it. Each change writes its audit record in
    # its own transaction; approving revokes the approved route it supersedes there too.
    def propose_route(self, route: NewRoute, *, record: Record | None = None) -> Route:
        """Store a pending route; :class:`NotFoundError` for an unknown agent."""
        ...

    def get_route(self, workspace: str, route_id: str) -> Route | None: ...

    def list_routes(
        self,
        workspace: str,
        *,
        agent: str | None = None,
        capability: str | None = None,
        states: Sequence[RouteState] | None = None,
        limit: int = 500,
    ) -> list[Route]:
        """Newest first."""
        ...

    def approve_route(
        self, workspace: str, route_id: str, by: str, *, record: Record | None = None
    ) -> RouteChange:
        """pending → approved, revoking (and auditing, ``route.revoke`` by ``by``) the
        route approved before for the same agent and capability. Approving an approved
        route changes nothing; a revoked one is not approved again (``changed`` False)."""
        ...

    def revoke_route(
        self, workspace: str, route_id: str, by: str, *, record: Record | None = None
    ) -> RouteChange:
        """pending or approved → revoked; an already revoked route: ``changed`` False."""
        ...

    def approved_route(self, workspace: str, agent: str, capability: str) -> Route | None:
        """The route approved for ``agent`` running ``capability``, if any."""
        ...

    # -- receivers online and wake-ups (schema v7) -----------------------------------------------
    def receiver_seen(self, workspace: str, agent: str, info: str | None = None) -> bool:
        """Stamp ``agent``'s receiver as seen now (database clock), with what it said about
        itself (raw JSON text; None keeps the last). False for an unknown agent."""
        ...

    def set_wake(
        self,
        workspace: str,
        agent: str,
        url: str | None,
        *,
        secret: str | None = None,
        record: Record | None = None,
    ) -> tuple[str | None, str | None, bool] | None:
        """Set (or with None, clear) the agent's wake URL; ``secret`` replaces its signing
        secret (one is minted with the first URL if it has none). Returns (url, secret,
        whether the secret is new), or None for an unknown agent."""
        ...

    def wake_target(self, workspace: str, agent: str) -> tuple[str, str, bool] | None:
        """(url, secret, allow_private) for an agent with a wake URL, else None."""
        ...

    # -- agents' public keys (schema v12, sealed tasks; store/sealed.py) -------------------
    def set_agent_key(
        self,
        workspace: str,
        agent: str,
        public_key: str,
        fingerprint: str,
        *,
        record: Record | None = None,
    ) -> tuple[AgentKey, bool]:
        """Register ``agent``'s public key, replacing any (audited when it changes); the
        key and whether it changed. :class:`NotFoundError` for an unknown agent."""
        ...

    def agent_key(self, workspace: str, agent: str) -> AgentKey | None:
        """The public key registered for ``agent``, if any."""
        ...

    def sealed_capabilities(self, workspace: str, caller: str, receiver: str) -> frozenset[str]:
        """The capabilities ``caller`` holds on ``receiver`` under a grant requiring sealing."""
        ...

    def sweep(self) -> int:
        """Settle expired leases: no attempts left → failed, else queued again (epoch bumped,
        so the old holder is fenced out); expired cancel grace → session slot released.
        Return how many changed. Safe to run on every replica at once."""
        ...
