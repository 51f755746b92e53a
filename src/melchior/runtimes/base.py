"""What every runtime adapter takes, streams and returns, and the one contract it keeps.

A *runtime* runs one turn of one agent: "here is what the agent should read, bound to
this session, in this directory; run it, tell me how it goes, and stop cleanly when
asked". The plane (turn by turn, on one machine) and the mellan receiver (claiming
tasks from the relay) both drive agents through this seam, so neither knows whether a
turn is a shell command, a Claude Code or Codex session, or an A2A agent.

The contract, for whoever calls :meth:`Runtime.run`:

* ``run`` returns a :class:`TurnResult` for every outcome the agent or its program can
  produce, failures included (a bad option, a missing binary, a crash, an error result):
  the caller reports it and never has to guess from an exception.
* Cancelling the asyncio task that runs ``run`` stops the turn: a process adapter
  terminates the whole process group (SIGTERM, then SIGKILL after a grace period),
  waits for it, and lets :class:`asyncio.CancelledError` propagate; the a2a adapter
  forwards ``CancelTask`` to the agent first. Nothing is left running.
* An exception raised by the caller's ``emit`` callback stops the turn the same way
  and propagates unchanged, so a receiver that lost its lease can stop work by raising.

Values here are frozen: a turn is handed to code that must not change what the caller
will later record.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from melchior.envelope import Message

# -- what a turn can come to ------------------------------------------------------------------

COMPLETED = "completed"
"""The agent finished the turn; ``text`` is its answer."""
FAILED = "failed"
"""The turn did not finish; ``error`` says why and ``retryable`` whether to try again."""
INPUT_REQUIRED = "input_required"
"""The agent asks back; ``text`` is its question and the next turn is the answer."""
CANCELED = "canceled"
"""Something other than our caller interrupted the turn (a signal from elsewhere, an
agent that reports the task cancelled). Our caller's own cancellation is not a result:
it propagates as :class:`asyncio.CancelledError`."""

STATES: tuple[str, ...] = (COMPLETED, FAILED, INPUT_REQUIRED, CANCELED)

PROGRESS_KINDS: tuple[str, ...] = ("status", "message", "artifact", "usage")
"""``status``: what the adapter or agent is doing (a tool call, the path taken);
``message``: words the agent said on the way; ``artifact``: a piece of output, with
``data`` shaped as the relay's artifact event body (``{"artifact": {...}, "append"?,
"lastChunk"?}``); ``usage``: token counts and cost in ``data``."""


class PlaneSeat(Protocol):
    """What a model turn may do in the plane it runs in: :mod:`melchior.plane.verbs` is one.

    The plane is a layer above the runtimes (it drives them), so a runtime that offers
    the plane's verbs to its model as tools (the provider runtime) is handed them with
    the turn (:attr:`Turn.plane`) and never imports the plane. Each takes the turn's
    environment, where the plane names the agent, its roster and its outbox.
    """

    @property
    def PlaneUsage(self) -> type[Exception]:
        """Raised by a verb whose request is malformed (the model is told, not failed)."""
        ...

    def in_plane(self, env: Mapping[str, str]) -> bool:
        """Whether this is a plane turn (the verbs exist only then)."""
        ...

    def seat(self, env: Mapping[str, str]) -> tuple[str, list[Any]]:
        """This agent's id and the team as the roster has it (empty if unreadable)."""
        ...

    def send_to(self, env: Mapping[str, str], to: str | None, message: str | None) -> Any:
        """Write one note for another agent into this turn's outbox; its receipt."""
        ...

    def team(self, env: Mapping[str, str], line: str | None = None) -> Any:
        """Who there is and whom this agent may write to now (read only)."""
        ...


@dataclass(frozen=True)
class Turn:
    """One turn for one agent. Built by the caller; read by the adapter.

    ``prompt`` is what the agent reads, already fenced by the caller when it comes from
    a peer. ``message`` is the envelope it came in (sender, hop chain, ids, A2A parts)
    for adapters that forward structure. ``session`` is the bound session to continue
    (Claude Code session id, Codex thread id, an A2A ``task:``/``context:`` id); None
    starts fresh. ``env`` is extra environment for the agent's process. ``options`` are
    the route's adapter options, layered over the adapter's configuration for this turn
    only; they come from local configuration or an owner-approved route, never from the
    caller's message. ``plane`` is the plane's verbs when the plane runs the turn
    (:class:`PlaneSeat`), else None.
    """

    prompt: str
    cwd: Path
    message: Message | None = None
    session: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    plane: PlaneSeat | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str):
            raise TypeError("a turn's prompt is text")
        if self.session is not None and (not isinstance(self.session, str) or not self.session):
            raise ValueError("a turn's session is a non-empty string or None")
        env = dict(self.env)
        for key, value in env.items():
            if not isinstance(key, str) or not key or "=" in key or "\0" in key:
                raise ValueError(f"environment name {key!r} is not a valid variable name")
            if not isinstance(value, str) or "\0" in value:
                raise ValueError(f"environment variable {key} must be text without NUL")
        # Frozen all the way down: the caller records what it asked for after the turn.
        object.__setattr__(self, "cwd", Path(self.cwd))
        object.__setattr__(self, "env", MappingProxyType(env))
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))


@dataclass(frozen=True)
class Progress:
    """Something the adapter streams while the turn runs; the receiver turns each into a
    relay progress event and the plane into a line in the agent's pane."""

    kind: str
    text: str = ""
    data: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in PROGRESS_KINDS:
            raise ValueError(f"progress kind {self.kind!r} is not one of {PROGRESS_KINDS}")


@dataclass(frozen=True)
class TurnResult:
    """How a turn ended.

    ``artifacts`` are A2A ``Artifact``-shaped mappings (``artifactId``, ``name``,
    ``parts``), so a receiver can hand them to the relay as they are. ``error`` is a
    sentence a person can act on (with the tail of stderr for a failed program) and is
    set exactly when ``state`` is failed. ``retryable`` says whether running the same
    turn again could succeed; a coding agent that already acted is not retried blindly.
    ``session`` is what to bind the next turn to. ``usage`` holds ``input_tokens``,
    ``output_tokens`` and ``cost_usd`` when the agent reports them. ``path`` says which
    way the turn went: ``new``, ``resumed``, ``inbox``, ``forwarded`` or ``command``.
    ``reply`` marks a direct reply: the agent answered with a message (``text``) and did
    no task work, as A2A lets an agent answer a ``SendMessage``; a receiver completes the
    task so that a blocking send gets that message back instead of a task.
    """

    state: str
    text: str = ""
    artifacts: tuple[Mapping[str, Any], ...] = ()
    error: str | None = None
    retryable: bool = False
    session: str | None = None
    usage: Mapping[str, int | float] = field(default_factory=dict)
    path: str | None = None
    reply: bool = False

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"turn state {self.state!r} is not one of {STATES}")
        if (self.state == FAILED) != bool(self.error):
            raise ValueError("a failed turn says why (error), and only a failed turn does")
        if self.reply and (self.state != COMPLETED or self.artifacts):
            raise ValueError("a direct reply is a completed turn's message, with no artifacts")

    @property
    def ok(self) -> bool:
        return self.state in (COMPLETED, INPUT_REQUIRED)


Emit = Callable[[Progress], Awaitable[None]]
"""The caller's progress sink. It is awaited, so a slow sink slows the agent's output
rather than buffering it without bound."""


class Runtime(Protocol):
    """Runs one turn of one agent; see the module docstring for the contract."""

    @property
    def name(self) -> str:
        """The adapter's registry name (``command``, ``claude-code``, ``codex``, ``a2a``)."""
        ...

    async def run(self, turn: Turn, emit: Emit) -> TurnResult:
        """Run ``turn``, streaming :class:`Progress` through ``emit``; see the contract."""
        ...


class RuntimeConfigError(ValueError):
    """An adapter name or option is wrong; the message names the option and what it takes."""


def text_artifact(name: str, text: str, artifact_id: str | None = None) -> dict[str, Any]:
    """An A2A artifact holding one text part."""
    return {"artifactId": artifact_id or name, "name": name, "parts": [{"text": text}]}


def failed(error: str, *, retryable: bool = False, **rest: Any) -> TurnResult:
    """A failed result; the one spelling of "this turn did not work, because …"."""
    return TurnResult(FAILED, error=error, retryable=retryable, **rest)
