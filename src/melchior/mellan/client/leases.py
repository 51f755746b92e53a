"""A lease as the relay hands it to a receiver, checked field by field before any is used.

The receiver does not assume the relay is honest (docs/receiver.md, "What a compromised
relay can and cannot make this machine do"). Everything in a lease comes from the relay:
the task's ids and names end up in a model's prompt header, in environment variables, in
file names and URLs; the route decides what runs; the turn and attempt numbers pick
spool entries. So a lease is read against the relay's own patterns
(:mod:`melchior.mellan.ids`, :mod:`melchior.policy.task_routes`) and the receiver's idea of
itself (a lease for another agent is not ours), and a lease that fails any check is not
half-run: it becomes a :class:`MalformedLease` naming the field, which the receiver
reports as a failure (when its task id and epoch are usable) or drops.

Route options are configuration, not payload: their numbers are read as plain ints and
floats (the exact :class:`~melchior.mellan.rawjson.Number` the decoder keeps would fail
every adapter's type check), and a number that is not finite as a float is refused.
The caller's message (``payload``) and the earlier turns stay exactly as stored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from melchior.mellan.ids import AGENT_ID, CAPABILITY_ID, ROUTE_ID, TASK_ID
from melchior.policy.task_routes import ADAPTERS, MAX_CWD, PROFILE, SESSION

MAX_TURN = 100_000
MAX_ATTEMPT = 100_000
MAX_EPOCH = 2**63 - 1
MAX_CONTEXT = 256
HISTORY_STATES = ("queued", "leased", "succeeded", "input_required", "failed", "cancelled")
"""A task's states as the relay records them (its store's ``TaskState``)."""


@dataclass(frozen=True)
class Route:
    """How the owner approved this agent to run the task's capability: the adapter, and
    for a coding-agent session its id, working directory and unattended profile, with the
    adapter's options (a JSON object). A receiver checks it against its own local
    allow-list before running anything."""

    id: str
    capability: str
    adapter: str
    session: str | None
    cwd: str | None
    profile: str | None
    options: dict[str, Any]

    @classmethod
    def from_json(cls, data: Any) -> Route | None:
        """The route of a lease (None: there is none); :class:`ValueError` naming the
        field when it is malformed."""
        if data is None:
            return None
        if not isinstance(data, dict):
            raise ValueError("route must be an object or null")
        capability = _match(data, "capability", CAPABILITY_ID, "route.")
        adapter = data.get("adapter")
        if adapter not in ADAPTERS:
            raise ValueError(f"route.adapter {_shown(adapter)} is not an adapter")
        cwd = _opt_text(data, "cwd", MAX_CWD, "route.")
        options = data.get("options", {})
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise ValueError("route.options must be an object")
        return cls(
            id=_match(data, "id", ROUTE_ID, "route."),
            capability=capability,
            adapter=str(adapter),
            session=_opt_match(data, "session", SESSION, "route."),
            cwd=cwd,
            profile=_opt_match(data, "profile", PROFILE, "route."),
            options={str(k): plain(v, f"route.options.{k}") for k, v in options.items()},
        )


@dataclass(frozen=True)
class ClaimedTask:
    """One lease handed out by ``claim``: the task as JSON, the epoch fencing its writes,
    and the route approved for its capability at claim time (None: there is none, and the
    task must be failed non-retryably saying so). Every field the receiver reads has been
    checked (:func:`claimed`)."""

    task: dict[str, Any]
    epoch: int
    expires_at: str
    route: Route | None = None
    history: tuple[dict[str, Any], ...] = ()
    """Earlier turns of the task (from turn 2 on): each turn's caller message and result."""
    waited: float = 0.0
    """Seconds the relay held the claim before it took this lease (never more than the
    claim's own wait): the lease began at least this long after the claim was sent."""

    @property
    def task_id(self) -> str:
        return str(self.task["id"])

    @property
    def payload(self) -> Any:
        """The stored request message, exactly as the caller sent it."""
        return self.task.get("payload")

    @property
    def turn(self) -> int:
        return int(self.task.get("turn") or 1)

    @property
    def attempt(self) -> int:
        return int(self.task.get("attempt") or 1)

    @property
    def capability(self) -> str:
        return str(self.task.get("capability") or "")


@dataclass(frozen=True)
class MalformedLease:
    """A lease the receiver will not run, and why. ``task_id`` and ``epoch`` are set when
    they themselves were well formed, so the refusal can be reported on the task."""

    task_id: str | None
    epoch: int | None
    reason: str


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:79] + "…"


def _match(data: Mapping[str, Any], key: str, pattern: Any, where: str = "task.") -> str:
    value = data.get(key)
    if not isinstance(value, str) or not pattern.match(value):
        raise ValueError(f"{where}{key} {_shown(value)} is not of the form the relay gives it")
    return value


def _opt_match(data: Mapping[str, Any], key: str, pattern: Any, where: str) -> str | None:
    return None if data.get(key) is None else _match(data, key, pattern, where)


def _opt_text(data: Mapping[str, Any], key: str, longest: int, where: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or not value
        or len(value) > longest
        or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value)
        or not _utf8(value)
    ):
        raise ValueError(
            f"{where}{key} must be text of at most {longest} characters without control characters"
        )
    return value


def _int(data: Mapping[str, Any], key: str, low: int, high: int, default: int | None) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"task.{key} {_shown(value)} is not a whole number from {low} to {high}")
    return value


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def plain(value: Any, where: str) -> Any:
    """A route option as plain JSON values: exact numbers as floats (finite ones only),
    text that is valid Unicode (no lone surrogates)."""
    if isinstance(value, Decimal):
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"{where}: the number {value} is out of range")
        return number
    if isinstance(value, str):
        if not _utf8(value):
            raise ValueError(f"{where}: text with a lone surrogate")
        return value
    if isinstance(value, list):
        return [plain(v, where) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v, where) for k, v in value.items()}
    return value


def _history(items: Any, turn: int) -> tuple[dict[str, Any], ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        raise ValueError("history must be a list")
    out = []
    for i, item in enumerate(items):
        where = f"history[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be an object")
        past = item.get("turn")
        if isinstance(past, bool) or not isinstance(past, int) or not 1 <= past < turn:
            raise ValueError(f"{where}.turn {_shown(past)} is not an earlier turn of the task")
        if item.get("state") not in HISTORY_STATES:
            raise ValueError(f"{where}.state {_shown(item.get('state'))} is not a task state")
        for key, kind in (("message", dict), ("result", dict), ("error", str)):
            if item.get(key) is not None and not isinstance(item.get(key), kind):
                raise ValueError(f"{where}.{key} has the wrong type")
        out.append(item)
    return tuple(out)


def claimed(
    item: Any, agent: str | None = None, waited: float = 0.0
) -> ClaimedTask | MalformedLease:
    """One lease of a claim answer, checked; ``agent`` is who this receiver is (a lease
    whose task is for another agent is malformed); ``waited`` what the answer says of how
    long the relay held the claim."""
    if not isinstance(item, dict):
        return MalformedLease(None, None, "a lease must be an object")
    task = item.get("task")
    epoch = item.get("epoch")
    task_id = task.get("id") if isinstance(task, dict) else None
    usable_id = task_id if isinstance(task_id, str) and TASK_ID.match(task_id) else None
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= MAX_EPOCH:
        return MalformedLease(usable_id, None, f"epoch {_shown(epoch)} is not a lease epoch")
    if usable_id is None or not isinstance(task, dict):
        return MalformedLease(None, epoch, f"task.id {_shown(task_id)} is not a task id")
    try:
        for key in ("caller", "receiver"):
            _match(task, key, AGENT_ID)
        if agent is not None and task["receiver"] != agent:
            raise ValueError(f"task.receiver {task['receiver']!r} is not this agent ({agent})")
        capability = _match(task, "capability", CAPABILITY_ID)
        turn = _int(task, "turn", 1, MAX_TURN, 1)
        _int(task, "attempt", 1, MAX_ATTEMPT, 1)
        _opt_text(task, "context_id", MAX_CONTEXT, "task.")
        for key in ("metadata", "payload"):
            if task.get(key) is not None and not isinstance(task.get(key), dict):
                raise ValueError(f"task.{key} must be an object")
        expires_at = item.get("expires_at")
        if not isinstance(expires_at, str) or len(expires_at) > 64:
            raise ValueError("expires_at must be a timestamp")
        route = Route.from_json(item.get("route"))
        if route is not None and route.capability != capability:
            raise ValueError(
                f"route.capability {route.capability!r} is not the task's ({capability!r})"
            )
        history = _history(item.get("history"), turn)
    except ValueError as exc:
        return MalformedLease(usable_id, epoch, str(exc))
    return ClaimedTask(task=task, epoch=epoch, expires_at=expires_at, route=route,
                       history=history, waited=waited)  # fmt: skip
